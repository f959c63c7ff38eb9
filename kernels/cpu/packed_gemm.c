/* y = x @ W.T (+ bias) with W packed once into column panels, in bf16 on CPUs with AVX512-BF16 and in float32 on
 * CPUs with AVX-512 (or AVX2 + FMA): the decode and small prefill steps' projections, where oneDNN's inner product
 * left the cores idle while a weight came from memory. The bf16 kernel is described here; the float32 one (below)
 * is the same with one inner index a panel row ([N / 32][K][32]) and FMAs against a broadcast x[r][j].
 *
 * Layout: W [N, K] becomes [N / 32][K / 2][32][2]: a panel of 32 output columns, and in it, for each pair of the
 * inner dimension, the 32 columns' two values side by side: one 64-byte row of the panel is what vdpbf16ps takes
 * against a broadcast pair of x (x[r][2j], x[r][2j+1]) to add into 16 columns' float32 sums. A microkernel keeps
 * up to 12 rows x 32 columns of sums in 24 registers and walks the panel once, its loads two panel rows and a
 * broadcast a row per two vdpbf16ps (from 9 rows on, x's rows interleaved once per call so that every broadcast is
 * one pointer plus a constant). Each thread takes a run of panels; while it multiplies one panel by x's rows (a
 * block at a time), it fetches the next panel into L2, a slice per block, so the weight's read from memory overlaps
 * the arithmetic.
 *
 * On the 2-core AMD EPYC Zen 5 VM (SmolLM2's four layer projections, 30 layers' weights cycled, both cores): at
 * M = 64, 21.5 ms a step through oneDNN on its own blocked weights (632 GFLOP/s; 16.8 ms when the weights sit in
 * cache), 16.0 ms here (848; 15.1 warm); at M = 8, 7.6 -> 4.4 ms; at M = 256, 61.7 -> 57.1 ms.
 *
 * A third kernel (packed_gemm_widened, at the end) takes the same bf16 panels on FMAs, each pair widened to float32,
 * for CPUs where vdpbf16ps is slow or absent.
 *
 * Sums are float32 in another order than oneDNN's; a bf16 y is rounded once, after the bias. N must be a multiple
 * of 32 (and K of 2 in bf16); other shapes and CPUs without the instructions return -1 (the caller multiplies
 * another way). On the same VM in float32 at M = 64: 45.2 ms a step on oneDNN, 34.2 here.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec8.h"

#define PANEL 32 /* output columns of a panel */
#define ROWS 8   /* rows of x a microkernel call takes */

/* 1 when this build has the bf16 kernel (a CPU with AVX512-BF16), else 0; packed_gemm_f32_available the same for
 * float32 (AVX-512F, or AVX2 with FMA). */
int packed_gemm_available(void);
int packed_gemm_f32_available(void);
/* 1 when this build has the bf16 kernel on FMAs (packed_gemm_widened, below: AVX-512F), else 0. */
int packed_gemm_widened_available(void);

/* w [n, k] -> out [n / 32][k / 2][32][2]; -1 if the shape is not a multiple of the panel. */
int packed_gemm_pack(const bf16 *w, int64_t n, int64_t k, bf16 *out) {
    if (n <= 0 || k <= 0 || n % PANEL || k % 2) return -1;
    const uint32_t *pairs = (const uint32_t *)w; /* a row's pairs as 32-bit words */
    uint32_t *packed = (uint32_t *)out;
    for (int64_t p = 0; p < n / PANEL; ++p)
        for (int64_t j = 0; j < k / 2; ++j)
            for (int64_t c = 0; c < PANEL; ++c)
                packed[(p * (k / 2) + j) * PANEL + c] = pairs[(p * PANEL + c) * (k / 2) + j];
    return 0;
}

/* float32: w [n, k] -> out [n / 32][k][32]; -1 if n is not a multiple of the panel. */
int packed_gemm_pack_f32(const float *w, int64_t n, int64_t k, float *out) {
    if (n <= 0 || k <= 0 || n % PANEL) return -1;
    for (int64_t p = 0; p < n / PANEL; ++p)
        for (int64_t j = 0; j < k; ++j)
            for (int64_t c = 0; c < PANEL; ++c) out[(p * k + j) * PANEL + c] = w[(p * PANEL + c) * k + j];
    return 0;
}

#ifndef X_CHUNK_BYTES
#define X_CHUNK_BYTES (512 * 1024)
#endif
#ifndef X_WHOLE_BYTES
#define X_WHOLE_BYTES (2 * 1024 * 1024)
#endif
/* Inside a parallel region: the panels of this thread, fetching each next one while computing the one before (see
 * the top); `kernels[rows]` multiplies block b of x's rows (`per_block` rows from r0, at X_AT) by one panel.
 * The run of panels goes over x's blocks (block_bytes each). Up to X_WHOLE_BYTES of x, every panel passes over
 * all of it; past that (a prefill chunk of 2048 tokens: 4.5 MiB of x widened to float32 at K = 576, against 2 MiB of
 * L2 a core on the Xeon VM and 1 on the Zen VMs) the run is walked once per X_CHUNK_BYTES of x, which stays in L2
 * while the panels pass, and each panel is read once per chunk instead (from L2 or L3). Within a chunk a panel
 * multiplies the chunk's blocks while the next one (the run's first again, for the next chunk) is fetched. On the
 * Xeon VM (family 6 model 207), SmolLM2's projections with 30 layers' weights cycled, M = 2048: widened bf16 and
 * float32 ~10% faster (e.g. gate|up 301 -> 347 GFLOP/s); offline bf16 prefill 1,124 -> 1,187 prompt tok/s
 * (alternating builds in one process, four rounds, 2026-12-08). */
#define WALK_PANELS(T, kernels, panel_size, blocks, per_block, block_bytes, X_AT)                                   \
    do {                                                                                                        \
        const int64_t panels = n / PANEL, lines = (panel_size) * (int64_t)sizeof(T) / 64;                       \
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();                                \
        const int64_t first = panels * t / threads, last = panels * (t + 1) / threads;                         \
        const int64_t chunk = (blocks) * (block_bytes) <= X_WHOLE_BYTES ? (blocks)                             \
                              : X_CHUNK_BYTES / (block_bytes) > 1 ? X_CHUNK_BYTES / (block_bytes) : 1;         \
        for (int64_t c0 = 0; c0 < (blocks); c0 += chunk) {                                                      \
            const int64_t c1 = c0 + chunk < (blocks) ? c0 + chunk : (blocks), span = c1 - c0;                   \
            for (int64_t p = first; p < last; ++p) {                                                            \
                const T *panel = packed + p * (panel_size);                                                     \
                const char *next = p + 1 < last ? (const char *)(panel + (panel_size))                          \
                                   : c1 < (blocks) && first < last ? (const char *)(packed + first * (panel_size)) \
                                   : NULL;                                                                      \
                for (int64_t b = c0; b < c1; ++b) {                                                             \
                    const int64_t r0 = b * (per_block), rows = m - r0 < (per_block) ? m - r0 : (per_block);     \
                    const int64_t from = lines * (b - c0) / span, count = lines * (b - c0 + 1) / span - from;   \
                    kernels[rows](X_AT, k, panel, next, from, count, bias == NULL ? NULL : bias + p * PANEL,    \
                                  y + r0 * n + p * PANEL, n);                                                   \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
    } while (0)

/* x's rows as they come, ROWS at a time. */
#define DRIVE(T, kernels, panel_size)                                                                    \
    do {                                                                                                 \
        const int64_t blocks = (m + ROWS - 1) / ROWS;                                                    \
        _Pragma("omp parallel num_threads(num_threads)")                                                 \
            WALK_PANELS(T, kernels, panel_size, blocks, ROWS, ROWS * k * (int64_t)sizeof(T), x + r0 * k);   \
    } while (0)

#if defined(__AVX512F__)
/* 16 bf16 values widened exactly to float32: their bits in the top half of each lane. */
static inline __m512 widen16(const bf16 *values) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)values)),
                                                 16));
}
#endif

#define EACH_R_TO_8(OP, X) OP(1, X) OP(2, X) OP(3, X) OP(4, X) OP(5, X) OP(6, X) OP(7, X) OP(8, X)

/* x interleaved once per call: even blocks of up to `block_rows` rows, each [k / E][block_rows][E] (E inputs a
 * step: 1 in float32, a pair in bf16) of XT, each input TO_X(x's value) (the same value, or bf16 widened to float32
 * for packed_gemm_widened), so that a microkernel reads every row's inputs at one pointer plus a constant (a pointer
 * per row runs out of integer registers: see the float32 kernels); T is the panels' type. Returns -1 from the caller
 * when the block copy cannot be allocated. */
#define SAME(v) (v)
#define DRIVE_BLOCKS(T, XT, kernels, block_rows, E, panel_size, TO_X)                                        \
    do {                                                                                                     \
        const int64_t blocks = (m + (block_rows) - 1) / (block_rows), per_block = (m + blocks - 1) / blocks; \
        XT *xp = malloc((size_t)(blocks * k * (block_rows)) * sizeof(XT));                                   \
        if (xp == NULL) return -1;                                                                           \
        _Pragma("omp parallel num_threads(num_threads)") {                                                   \
            _Pragma("omp for schedule(static)") for (int64_t b = 0; b < blocks; ++b) {                       \
                const int64_t r0 = b * per_block, rows = m - r0 < per_block ? m - r0 : per_block;            \
                XT *block = xp + b * k * (block_rows);                                                       \
                for (int64_t r = 0; r < rows; ++r)                                                           \
                    for (int64_t j = 0; j < k / (E); ++j)                                                    \
                        for (int e = 0; e < (E); ++e)                                                        \
                            block[(j * (block_rows) + r) * (E) + e] = TO_X(x[(r0 + r) * k + j * (E) + e]);   \
            }                                                                                                \
            WALK_PANELS(T, kernels, panel_size, blocks, per_block, (block_rows) * k * (int64_t)sizeof(XT),   \
                        xp + b * k * (block_rows));                                                          \
        }                                                                                                    \
        free(xp);                                                                                            \
    } while (0)

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
int packed_gemm_available(void) { return 1; }

/* R rows of x times one panel into y (row stride n); while at it, lines [from, from + count) of `next` (64 bytes
 * each) into L2, spread over the panel's walk. X(r, j) is where row r's pair j lies: x as it comes (`rows_bf16`, up to
 * 8 rows) or a block of 12 interleaved rows (`block_bf16`, 24 sums in registers). On the 2-vCPU Zen 4 VM
 * (vdpbf16ps measured at 468 GFLOP/s on both cores), the four projections with 30 layers' weights cycled, against 8
 * rows with a pointer each (2026-12-07, alternating in one process, the same bits): M = 16 9.96 -> 8.95 ms, M = 64
 * 34.9 -> 32.6 (389 -> 417 GFLOP/s), M = 256 133.5 -> 127.5. */
#define ROWS_BF16 12

#define PAIR_ROWS(r, j) (x + (r) * k + 2 * (j))            /* x as it comes */
#define PAIR_BLOCK(r, j) (x + ((j) * ROWS_BF16 + (r)) * 2) /* a block of xp: the rows' pairs side by side */
#define KERNEL_BF16(NAME, R, X)                                                                           \
    static inline void NAME##_##R(const bf16 *x, int64_t k, const bf16 *panel, const char *next,          \
                                  int64_t from, int64_t count, const bf16 *bias, bf16 *y, int64_t n) {   \
        __m512 acc[R][2];                                                                                 \
        for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();                         \
        const int64_t pairs = k / 2;                                                                      \
        const char *fetch = next + from * 64;                                                             \
        int64_t due = 0; /* count lines over the pairs, one each time `due` passes them */                \
        for (int64_t j = 0; j < pairs; ++j) {                                                             \
            const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + j * 2 * PANEL);                      \
            const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + j * 2 * PANEL + PANEL);              \
            for (int r = 0; r < R; ++r) {                                                                 \
                int32_t pair;                                                                             \
                memcpy(&pair, X(r, j), sizeof(pair));                                                     \
                const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);                                     \
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0);                                           \
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);                                           \
            }                                                                                             \
            if (next != NULL)                                                                             \
                for (due += count; due >= pairs; due -= pairs, fetch += 64) __builtin_prefetch(fetch, 0, 1); \
        }                                                                                                 \
        const __m512 b0 = bias != NULL ? widen16(bias) : _mm512_setzero_ps();                            \
        const __m512 b1 = bias != NULL ? widen16(bias + 16) : _mm512_setzero_ps();                       \
        for (int r = 0; r < R; ++r)                                                                       \
            _mm512_storeu_si512(y + r * n, (__m512i)_mm512_cvtne2ps_pbh(_mm512_add_ps(acc[r][1], b1),     \
                                                                        _mm512_add_ps(acc[r][0], b0)));  \
    }

#define ROWS_KERNEL_BF16(R, X) KERNEL_BF16(rows_bf16, R, X)
#define BLOCK_KERNEL_BF16(R, X) KERNEL_BF16(block_bf16, R, X)
EACH_R_TO_8(ROWS_KERNEL_BF16, PAIR_ROWS)
EACH_R_TO_8(BLOCK_KERNEL_BF16, PAIR_BLOCK)
BLOCK_KERNEL_BF16(9, PAIR_BLOCK)
BLOCK_KERNEL_BF16(10, PAIR_BLOCK)
BLOCK_KERNEL_BF16(11, PAIR_BLOCK)
BLOCK_KERNEL_BF16(12, PAIR_BLOCK)

typedef void (*Kernel)(const bf16 *, int64_t, const bf16 *, const char *, int64_t, int64_t, const bf16 *, bf16 *,
                       int64_t);
static const Kernel rows_bf16[ROWS + 1] = {NULL,        rows_bf16_1, rows_bf16_2, rows_bf16_3, rows_bf16_4,
                                           rows_bf16_5, rows_bf16_6, rows_bf16_7, rows_bf16_8};
static const Kernel block_bf16[ROWS_BF16 + 1] = {
    NULL,         block_bf16_1, block_bf16_2, block_bf16_3,  block_bf16_4,  block_bf16_5, block_bf16_6,
    block_bf16_7, block_bf16_8, block_bf16_9, block_bf16_10, block_bf16_11, block_bf16_12};

/* y [m, n] = x [m, k] @ W.T (+ bias [n]), W packed by packed_gemm_pack; all bf16. */
int packed_gemm(const bf16 *x, int64_t m, const bf16 *packed, const bf16 *bias, int64_t n, int64_t k, bf16 *y,
                int64_t num_threads) {
    if (m < 1 || n <= 0 || k <= 0 || n % PANEL || k % 2) return -1;
    if (m <= ROWS) /* x's rows as they are: one block of 8 (from 9 rows on the blocks gain 4-10%) */
        DRIVE(bf16, rows_bf16, k * PANEL);
    else
        DRIVE_BLOCKS(bf16, bf16, block_bf16, ROWS_BF16, 2, k * PANEL, SAME);
    return 0;
}
#else
int packed_gemm_available(void) { return 0; }

int packed_gemm(const bf16 *x, int64_t m, const bf16 *packed, const bf16 *bias, int64_t n, int64_t k, bf16 *y,
                int64_t num_threads) {
    (void)x, (void)m, (void)packed, (void)bias, (void)n, (void)k, (void)y, (void)num_threads;
    return -1;
}
#endif

#if defined(__AVX512F__)
int packed_gemm_f32_available(void) { return 1; }

/* float32: per inner index, two panel rows (32 columns) times a broadcast x[r][j], on FMAs. x comes in blocks of
 * ROWS_F32 rows interleaved ([k][ROWS_F32], xp below), so every broadcast is one pointer plus a constant: with a
 * pointer per row (8 rows) GCC ran out of integer registers and moved them through vector ones, each move a uop on
 * the FMA port (79% of the FMA peak at best); 12 rows x 32 columns of sums are 24 of the 32 registers. Up to 16
 * rows keep the rows as they come (8 at a time): there the weight's read from memory sets the pace, not the FMAs.
 * On the 2-vCPU Xeon VM (model 207, AVX-512 without BF16; FMA peak 340-348 GFLOP/s on both cores), the four
 * projections with 30 layers' weights cycled, against 8 rows with a pointer each: M = 64 52.0-52.2 -> 47.4-49.7 ms
 * (260 -> 287 GFLOP/s), M = 256 205-210 -> 184-187 (264 -> 293), M <= 16 the same; the same bits. */
#define ROWS_F32 12

#define X_ROWS(r, j) x[(r) * k + (j)]         /* x as it comes: a row per r */
#define X_BLOCK(r, j) x[(j) * ROWS_F32 + (r)] /* a block of xp: the rows side by side */
#define KERNEL_F32(NAME, R, X)                                                                            \
    static inline void NAME##_##R(const float *x, int64_t k, const float *panel, const char *next,         \
                                  int64_t from, int64_t count, const float *bias, float *y, int64_t n) {  \
        __m512 acc[R][2];                                                                                 \
        for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();                         \
        const char *fetch = next + from * 64;                                                             \
        int64_t due = 0; /* count lines over k inputs, one each time `due` passes k (no division a step) */ \
        for (int64_t j = 0; j < k; ++j) {                                                                 \
            const __m512 w0 = _mm512_loadu_ps(panel + j * PANEL), w1 = _mm512_loadu_ps(panel + j * PANEL + 16); \
            for (int r = 0; r < R; ++r) {                                                                 \
                const __m512 a = _mm512_set1_ps(X(r, j));                                                 \
                acc[r][0] = _mm512_fmadd_ps(a, w0, acc[r][0]);                                            \
                acc[r][1] = _mm512_fmadd_ps(a, w1, acc[r][1]);                                            \
            }                                                                                             \
            if (next != NULL)                                                                             \
                for (due += count; due >= k; due -= k, fetch += 64) __builtin_prefetch(fetch, 0, 1);      \
        }                                                                                                 \
        const __m512 b0 = bias != NULL ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();                    \
        const __m512 b1 = bias != NULL ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();               \
        for (int r = 0; r < R; ++r) {                                                                     \
            _mm512_storeu_ps(y + r * n, _mm512_add_ps(acc[r][0], b0));                                    \
            _mm512_storeu_ps(y + r * n + 16, _mm512_add_ps(acc[r][1], b1));                               \
        }                                                                                                 \
    }

#define ROWS_KERNEL(R, X) KERNEL_F32(rows_f32, R, X)
#define BLOCK_KERNEL(R, X) KERNEL_F32(block_f32, R, X)
EACH_R_TO_8(ROWS_KERNEL, X_ROWS)
EACH_R_TO_8(BLOCK_KERNEL, X_BLOCK)
BLOCK_KERNEL(9, X_BLOCK)
BLOCK_KERNEL(10, X_BLOCK)
BLOCK_KERNEL(11, X_BLOCK)
BLOCK_KERNEL(12, X_BLOCK)

typedef void (*KernelF32)(const float *, int64_t, const float *, const char *, int64_t, int64_t, const float *,
                          float *, int64_t);
static const KernelF32 rows_f32[ROWS + 1] = {NULL,       rows_f32_1, rows_f32_2, rows_f32_3, rows_f32_4,
                                             rows_f32_5, rows_f32_6, rows_f32_7, rows_f32_8};
static const KernelF32 block_f32[ROWS_F32 + 1] = {
    NULL,         block_f32_1, block_f32_2, block_f32_3,  block_f32_4,  block_f32_5, block_f32_6,
    block_f32_7, block_f32_8, block_f32_9, block_f32_10, block_f32_11, block_f32_12};

/* y [m, n] = x [m, k] @ W.T (+ bias [n]), W packed by packed_gemm_pack_f32; all float32. */
int packed_gemm_f32(const float *x, int64_t m, const float *packed, const float *bias, int64_t n, int64_t k,
                    float *y, int64_t num_threads) {
    if (m < 1 || n <= 0 || k <= 0 || n % PANEL) return -1;
    if (m <= 2 * ROWS) { /* x's rows as they are, 8 at a time: interleaving them costs more than it gains */
        DRIVE(float, rows_f32, k * PANEL);
        return 0;
    }
    DRIVE_BLOCKS(float, float, block_f32, ROWS_F32, 1, k * PANEL, SAME);
    return 0;
}
#elif defined(__AVX2__) && defined(__FMA__)
int packed_gemm_f32_available(void) { return 1; }

/* float32 on AVX2 + FMA, the same panels: 16 registers of 8 floats hold sums for 6 rows x 16 columns (12), the
 * half-panel row's two vectors and a broadcast x[r][j], so a microkernel walks one half of a panel (one 64-byte
 * line of each 128-byte panel row) and the driver takes each panel's halves in turn. The sums are named variables
 * (ROW_SUMS below), not an array: GCC 12 kept an array of them on the stack, a store of every sum at every step
 * (one core, weights in cache, M = 64: 29 GFLOP/s against 80 named); and the share of the next panel to fetch is
 * worked out once per JCHUNK inputs, not at each (an integer division a step, as slow as the step).
 *
 * On the 2-vCPU AMD EPYC Zen 3 VM (AVX2 + FMA, 2026-12-06), SmolLM2's four layer projections with 30 layers'
 * weights cycled, both cores: M = 8 18-19 ms against 37 for oneDNN's fp32 on its own blocked weights, M = 64 86-91
 * against 115, M = 256 430 against 387 (the GEMM choice keeps oneDNN there). */
#define ROWS_AVX2 6
#define JCHUNK 16

#define EACH_ROW(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5)
#define ROW_SUMS(r) __m256 sum##r##a = _mm256_setzero_ps(), sum##r##b = _mm256_setzero_ps();
#define ROW_FMA(r)                                                                      \
    if (rows > r) {                                                                     \
        const __m256 a = _mm256_broadcast_ss(x + r * k + j);                            \
        sum##r##a = _mm256_fmadd_ps(a, w0, sum##r##a);                                  \
        sum##r##b = _mm256_fmadd_ps(a, w1, sum##r##b);                                  \
    }
#define ROW_STORE(r)                                                                    \
    if (rows > r) {                                                                     \
        _mm256_storeu_ps(y + r * n, _mm256_add_ps(sum##r##a, b0));                      \
        _mm256_storeu_ps(y + r * n + 8, _mm256_add_ps(sum##r##b, b1));                  \
    }

/* R (<= 6) rows of x times the 16 columns of a half panel starting at `half` (row stride PANEL); lines
 * [from, from + count) of `next` fetched into L2 on the way. */
#define KERNEL_AVX2(R)                                                                                         \
    static void kernel_avx2_##R(const float *x, int64_t k, const float *half, const char *next, int64_t from,  \
                                int64_t count, const float *bias, float *y, int64_t n) {                      \
        enum { rows = R };                                                                                     \
        EACH_ROW(ROW_SUMS)                                                                                     \
        for (int64_t j0 = 0; j0 < k; j0 += JCHUNK) {                                                           \
            const int64_t j1 = j0 + JCHUNK < k ? j0 + JCHUNK : k;                                              \
            for (int64_t j = j0; j < j1; ++j) {                                                                \
                const __m256 w0 = _mm256_loadu_ps(half + j * PANEL), w1 = _mm256_loadu_ps(half + j * PANEL + 8); \
                EACH_ROW(ROW_FMA)                                                                              \
            }                                                                                                  \
            if (next != NULL)                                                                                  \
                for (int64_t line = from + count * j0 / k, end = from + count * j1 / k; line < end; ++line)    \
                    __builtin_prefetch(next + line * 64, 0, 1);                                                \
        }                                                                                                      \
        const __m256 b0 = bias != NULL ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();                         \
        const __m256 b1 = bias != NULL ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();                     \
        EACH_ROW(ROW_STORE)                                                                                    \
    }

KERNEL_AVX2(1)
KERNEL_AVX2(2)
KERNEL_AVX2(3)
KERNEL_AVX2(4)
KERNEL_AVX2(5)
KERNEL_AVX2(6)

typedef void (*KernelAvx2)(const float *, int64_t, const float *, const char *, int64_t, int64_t, const float *,
                           float *, int64_t);
static const KernelAvx2 kernels_avx2[ROWS_AVX2 + 1] = {NULL,           kernel_avx2_1, kernel_avx2_2, kernel_avx2_3,
                                                       kernel_avx2_4, kernel_avx2_5, kernel_avx2_6};

/* y [m, n] = x [m, k] @ W.T (+ bias [n]), W packed by packed_gemm_pack_f32; all float32. Each thread takes a run of
 * panels, each panel's two halves by blocks of 6 rows, fetching the next panel a slice per (half, block). */
int packed_gemm_f32(const float *x, int64_t m, const float *packed, const float *bias, int64_t n, int64_t k,
                    float *y, int64_t num_threads) {
    if (m < 1 || n <= 0 || k <= 0 || n % PANEL) return -1;
    const int64_t panels = n / PANEL, panel_size = k * PANEL, lines = panel_size * (int64_t)sizeof(float) / 64;
    const int64_t blocks = (m + ROWS_AVX2 - 1) / ROWS_AVX2, steps = 2 * blocks;
#pragma omp parallel num_threads(num_threads)
    {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t first = panels * t / threads, last = panels * (t + 1) / threads;
        for (int64_t p = first; p < last; ++p) {
            const float *panel = packed + p * panel_size;
            const char *next = p + 1 < last ? (const char *)(panel + panel_size) : NULL;
            for (int64_t h = 0; h < 2; ++h)
                for (int64_t b = 0; b < blocks; ++b) {
                    const int64_t r0 = b * ROWS_AVX2, rows = m - r0 < ROWS_AVX2 ? m - r0 : ROWS_AVX2;
                    const int64_t step = h * blocks + b, from = lines * step / steps;
                    kernels_avx2[rows](x + r0 * k, k, panel + 16 * h, next, from, lines * (step + 1) / steps - from,
                                       bias == NULL ? NULL : bias + p * PANEL + 16 * h, y + r0 * n + p * PANEL + 16 * h,
                                       n);
                }
        }
    }
    return 0;
}
#else
int packed_gemm_f32_available(void) { return 0; }

int packed_gemm_f32(const float *x, int64_t m, const float *packed, const float *bias, int64_t n, int64_t k,
                    float *y, int64_t num_threads) {
    (void)x, (void)m, (void)packed, (void)bias, (void)n, (void)k, (void)y, (void)num_threads;
    return -1;
}
#endif

#if defined(__AVX512F__)
int packed_gemm_widened_available(void) { return 1; }

/* bf16 on FMAs ("widened"): the bf16 panels (packed_gemm_pack) and bf16 x and y, but each pair of panel values
 * widened to float32 in registers (the low value shifted up, the high one masked) and multiplied on FMAs against
 * x widened to float32 once per call (in blocks of up to ROWS_WIDE rows, [k / 2][ROWS_WIDE][2]). Products of bf16
 * values are exact in float32 and the sums float32, as vdpbf16ps's, in another order. For CPUs where vdpbf16ps is
 * slower than two FMAs or absent: on the 2-vCPU Xeon VM (Intel model 207 with AVX512-BF16, no AMX) SmolLM2's
 * projections took 106-200 GFLOP/s on vdpbf16ps (the packed kernel and oneDNN alike) against 230-370 in float32;
 * the bf16 weight is still half the bytes of a float32 one. A pair costs two loads and four integer operations
 * beside 4 x R FMAs; 12 rows x 32 columns of sums are 24 registers. */
#define ROWS_WIDE 12

#define KERNEL_WIDE(R)                                                                                        \
    static inline void wide_##R(const float *x, int64_t k, const bf16 *panel, const char *next, int64_t from,  \
                                int64_t count, const bf16 *bias, bf16 *y, int64_t n) {                       \
        __m512 acc[R][2];                                                                                     \
        for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();                             \
        const __m512i high = _mm512_set1_epi32((int)0xffff0000u);                                            \
        const int64_t pairs = k / 2;                                                                          \
        const char *fetch = next + from * 64;                                                                 \
        int64_t due = 0;                                                                                      \
        for (int64_t j = 0; j < pairs; ++j) {                                                                 \
            const __m512i w0 = _mm512_loadu_si512(panel + j * 2 * PANEL);                                     \
            const __m512i w1 = _mm512_loadu_si512(panel + j * 2 * PANEL + PANEL);                             \
            const __m512 even0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));                             \
            const __m512 odd0 = _mm512_castsi512_ps(_mm512_and_si512(w0, high));                              \
            const __m512 even1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));                             \
            const __m512 odd1 = _mm512_castsi512_ps(_mm512_and_si512(w1, high));                              \
            const float *a = x + j * ROWS_WIDE * 2;                                                           \
            for (int r = 0; r < R; ++r) {                                                                     \
                const __m512 a0 = _mm512_set1_ps(a[2 * r]), a1 = _mm512_set1_ps(a[2 * r + 1]);               \
                acc[r][0] = _mm512_fmadd_ps(a0, even0, acc[r][0]);                                            \
                acc[r][1] = _mm512_fmadd_ps(a0, even1, acc[r][1]);                                            \
                acc[r][0] = _mm512_fmadd_ps(a1, odd0, acc[r][0]);                                             \
                acc[r][1] = _mm512_fmadd_ps(a1, odd1, acc[r][1]);                                             \
            }                                                                                                 \
            if (next != NULL)                                                                                 \
                for (due += count; due >= pairs; due -= pairs, fetch += 64) __builtin_prefetch(fetch, 0, 1);  \
        }                                                                                                     \
        const __m512 b0 = bias != NULL ? widen16(bias) : _mm512_setzero_ps();                                \
        const __m512 b1 = bias != NULL ? widen16(bias + 16) : _mm512_setzero_ps();                           \
        for (int r = 0; r < R; ++r) {                                                                         \
            _mm256_storeu_si256((__m256i *)(y + r * n), round_bf16(_mm512_add_ps(acc[r][0], b0)));           \
            _mm256_storeu_si256((__m256i *)(y + r * n + 16), round_bf16(_mm512_add_ps(acc[r][1], b1)));      \
        }                                                                                                     \
    }

/* 16 float32 to bf16, rounded to nearest even (a NaN to the quiet 0x7fc0), as float_to_bf16 and vcvtneps2bf16. */
static inline __m256i round_bf16(__m512 v) {
#if defined(__AVX512BF16__)
    return (__m256i)_mm512_cvtneps_pbh(v);
#else
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(rounded);
#endif
}

KERNEL_WIDE(1)
KERNEL_WIDE(2)
KERNEL_WIDE(3)
KERNEL_WIDE(4)
KERNEL_WIDE(5)
KERNEL_WIDE(6)
KERNEL_WIDE(7)
KERNEL_WIDE(8)
KERNEL_WIDE(9)
KERNEL_WIDE(10)
KERNEL_WIDE(11)
KERNEL_WIDE(12)

typedef void (*KernelWide)(const float *, int64_t, const bf16 *, const char *, int64_t, int64_t, const bf16 *, bf16 *,
                           int64_t);
static const KernelWide wide[ROWS_WIDE + 1] = {NULL,   wide_1, wide_2, wide_3,  wide_4,  wide_5, wide_6,
                                               wide_7, wide_8, wide_9, wide_10, wide_11, wide_12};

/* y [m, n] = x [m, k] @ W.T (+ bias [n]), W packed by packed_gemm_pack; all bf16, the arithmetic float32. */
int packed_gemm_widened(const bf16 *x, int64_t m, const bf16 *packed, const bf16 *bias, int64_t n, int64_t k,
                        bf16 *y, int64_t num_threads) {
    if (m < 1 || n <= 0 || k <= 0 || n % PANEL || k % 2) return -1;
    DRIVE_BLOCKS(bf16, float, wide, ROWS_WIDE, 2, k * PANEL, bf16_to_float);
    return 0;
}
#else
int packed_gemm_widened_available(void) { return 0; }

int packed_gemm_widened(const bf16 *x, int64_t m, const bf16 *packed, const bf16 *bias, int64_t n, int64_t k,
                        bf16 *y, int64_t num_threads) {
    (void)x, (void)m, (void)packed, (void)bias, (void)n, (void)k, (void)y, (void)num_threads;
    return -1;
}
#endif
