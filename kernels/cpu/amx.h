/* AMX tiles for the CPU kernels that use them (paged_attention.c's prefill, int8_gemm.c, lora.c): the tile
 * configuration a thread loads (_tile_loadconfig: palette 1, rows and bytes a row of each tile) and the tile state,
 * which Linux hands a process only when asked (arch_prctl), once. Included where __AMX_TILE__ and __linux__ are
 * defined, after _GNU_SOURCE (for syscall()). */
#ifndef LORA_PLATFORM_AMX_H
#define LORA_PLATFORM_AMX_H

#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

static int amx_state; /* 0: not asked yet, 1: the kernel granted the tile state, -1: it refused */

static inline int amx_usable(void) {
    if (amx_state == 0) /* ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA */
        amx_state = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
    return amx_state == 1;
}

#endif
