/* y = x @ W.T (+ bias) with an int8 weight and int8 activations, on CPUs with AVX512-VNNI: the GEMM of
 * quantization="int8" where the CPU's int8 dot products run at twice its bf16 ones (vpdpbusd: 64 multiply-adds an
 * instruction against vdpbf16ps's 32). CPUs with AVX2 and FMA but not VNNI get the same numbers from vpmaddubsw
 * (its own section below).
 *
 * Numbers. The weight is int8 per output channel (w ~= q[n][k] * ws[n]). Each row of x is quantized at every call
 * in groups of GROUP (64) inputs, each group with its own scale (xs = the group's amax / 127, q = round(x / xs) in
 * -127..127): a scale per token over all its inputs (oneDNN's w8a8) let the outliers of a few channels flatten
 * the rest, and failed SmolLM2-135M's int8 quality gates (agreement 89.3%, perplexity +4.5% in bf16), where
 * groups of 64 pass them (94.3%, +2.1%; groups of 32: 93.2%, +1.1%). So y[m][n] = ws[n] * sum over groups g of
 * xs[m][g] * (int32 dot of the group), the group's dot exact in int32 and the sum over groups in float32.
 *
 * vpdpbusd multiplies unsigned bytes by signed ones, and its signed operand may be a broadcast from memory: the
 * weight is stored as q + 128 (unsigned), x's bytes are the signed broadcast, and the 128 * (sum of the group's x
 * bytes) that this adds is taken off each row once at the end (corr[m], float32).
 *
 * Layout: W [N, K] becomes [N / 32][K / 4][32][4] unsigned bytes: a panel of 32 output columns, and in it, for each
 * four inputs, the 32 columns' four bytes side by side (one 128-byte row: two registers of 16 columns). A
 * microkernel keeps ROWS (6) rows x 32 columns in 12 int32 sums for a group and 12 float32 sums over groups (24 of
 * the 32 registers). Each thread takes a run of panels and, while it multiplies one by x's rows, fetches the next
 * into L2 (as packed_gemm.c does); rows go in chunks of CHUNK so a prefill's quantized x stays in L2 across panels.
 *
 * On the 2-core Zen 4 VM (vpdpbusd peak measured at 930 GOP/s on both cores, vdpbf16ps at 468 GFLOP/s), SmolLM2's
 * four layer projections with 30 layers' weights cycled: M = 64 in 20.2 ms (672 GOP/s) against 34.7 ms for the bf16
 * `packed` path (392 GFLOP/s); M = 1 4.0 against 7.7 ms; M = 1024 719 GOP/s against 405.
 *
 * On CPUs with AMX-INT8 (and a kernel that grants the tile state) calls of 16 rows and more run on tiles instead
 * (amx_block): the same int32 group sums, folded in the same float32 order, so the same bits. On the 2-core Sapphire
 * Rapids class VM (2026-12-05), SmolLM2's four projections with 30 layers' weights cycled: M = 64 16.1 ms (842
 * GOP/s) against 24.0 on vpdpbusd and 23.0 for oneDNN's AMX-BF16; M = 256 45.1 against 82.0 and 48.6. The fold of
 * every group's sums out of the tiles bounds it (a tile store and 32 vector rows per 32 K of tile products): the
 * same loop without the fold ran 1.6x faster, without the tile products 1.05x; sums kept in registers 16 columns at
 * a time instead of in L1 ran slower.
 *
 * K must be a multiple of 64 and N of 32, else the functions return -1 and the caller multiplies another way.
 */
#define _GNU_SOURCE /* syscall(), for the AMX tile state */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec8.h"

#define PANEL 32  /* output columns of a panel */
#define GROUP 64  /* inputs sharing one activation scale */
#define ROWS 6    /* rows of x a microkernel call takes */
#define CHUNK 192 /* rows of x taken through all of a thread's panels before the next rows */

/* w [n, k] int8 -> out [n / 32][k / 4][32][4] uint8 holding w + 128; -1 if the shape does not fit. */
int int8_gemm_pack(const int8_t *w, int64_t n, int64_t k, uint8_t *out) {
    if (n <= 0 || k <= 0 || n % PANEL || k % GROUP) return -1;
    for (int64_t p = 0; p < n / PANEL; ++p)
        for (int64_t j = 0; j < k / 4; ++j)
            for (int64_t c = 0; c < PANEL; ++c)
                for (int64_t i = 0; i < 4; ++i)
                    out[((p * (k / 4) + j) * PANEL + c) * 4 + i] = (uint8_t)(w[(p * PANEL + c) * k + 4 * j + i] + 128);
    return 0;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
int int8_gemm_available(void) { return 1; }

/* One group of 64 floats -> 64 signed bytes and its scale; returns the sum of the bytes. */
static inline int32_t quantize_group(const float *v, int8_t *q, float *scale) {
    __m512 f[4], amax = _mm512_setzero_ps();
    for (int i = 0; i < 4; ++i) {
        f[i] = _mm512_loadu_ps(v + 16 * i);
        amax = _mm512_max_ps(amax, _mm512_abs_ps(f[i]));
    }
    const float top = _mm512_reduce_max_ps(amax);
    *scale = top / 127.0f;
    const __m512 inverse = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
    __m512i sum = _mm512_setzero_si512();
    for (int i = 0; i < 4; ++i) {
        const __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(f[i], inverse)); /* round to nearest even */
        sum = _mm512_add_epi32(sum, qi);
        _mm_storeu_si128((__m128i *)(q + 16 * i), _mm512_cvtsepi32_epi8(qi)); /* |qi| <= 127 but for rounding up */
    }
    return _mm512_reduce_add_epi32(sum);
}

/* Row m of x (bf16 or float32 by `bf16_x`) quantized: bytes, a scale per group, and 128 * sum over groups of
 * scale * (sum of its bytes). */
static void quantize_row(const void *x, int bf16_x, int64_t k, int8_t *q, float *scales, float *corr) {
    float buf[GROUP];
    double total = 0.0;
    for (int64_t g = 0; g < k / GROUP; ++g) {
        const float *v;
        if (bf16_x) {
            const bf16 *xb = (const bf16 *)x + g * GROUP;
            for (int i = 0; i < GROUP; i += 16)
                _mm512_storeu_ps(buf + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(xb + i))), 16)));
            v = buf;
        } else {
            v = (const float *)x + g * GROUP;
        }
        const int32_t sum = quantize_group(v, q + g * GROUP, scales + g);
        total += (double)scales[g] * sum;
    }
    *corr = (float)(128.0 * total);
}

/* acc += w (unsigned bytes) . x (a row's 4 signed bytes in every lane). In asm because GCC 12 copied every
 * accumulator of the intrinsic's loop to another register and back at each step (24 moves per 12 vpdpbusd). x is
 * broadcast once per row into a register for both halves of the panel: with the broadcast as each vpdpbusd's memory
 * operand, a step of 12 vpdpbusd took 14 loads and the load ports bound the kernel (Zen 5 VM, SmolLM2's four
 * projections with 30 layers' weights cycled: M = 64 12.0 -> 9.2-10.4 ms, M = 256 42 -> 33-36.5). */
#define DPBUSD(acc, w, x) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x))

/* rows (<= ROWS) of quantized x times one panel into y (row stride n, bf16 or float32); lines [from, from + count)
 * of `next` (64 bytes each) fetched into L2 on the way. */
#define KERNEL(R)                                                                                                  \
    static void kernel_##R(const int8_t *xq, const float *xs, const float *corr, int64_t k, const uint8_t *panel,  \
                           const float *ws, const float *bias, void *y, int bf16_y, int64_t n, const char *next,   \
                           int64_t from, int64_t count) {                                                          \
        __m512 acc[R][2];                                                                                          \
        for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();                                  \
        const int64_t groups = k / GROUP;                                                                          \
        int64_t fetched = 0;                                                                                       \
        for (int64_t g = 0; g < groups; ++g) {                                                                     \
            __m512i dot[R][2];                                                                                     \
            for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = _mm512_setzero_si512();                           \
            const uint8_t *wg = panel + g * GROUP * PANEL;                                                         \
            for (int j = 0; j < GROUP / 4; ++j) {                                                                  \
                const __m512i w0 = _mm512_loadu_si512(wg + j * 4 * PANEL);                                         \
                const __m512i w1 = _mm512_loadu_si512(wg + j * 4 * PANEL + 64);                                    \
                for (int r = 0; r < R; ++r) {                                                                      \
                    const int32_t *four = (const int32_t *)(xq + r * k + g * GROUP + 4 * j);                       \
                    const __m512i xb = _mm512_set1_epi32(*four);                                                   \
                    DPBUSD(dot[r][0], w0, xb);                                                                     \
                    DPBUSD(dot[r][1], w1, xb);                                                                     \
                }                                                                                                  \
            }                                                                                                      \
            for (int r = 0; r < R; ++r) {                                                                          \
                const __m512 s = _mm512_set1_ps(xs[r * groups + g]);                                               \
                acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][0]), s, acc[r][0]);                          \
                acc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][1]), s, acc[r][1]);                          \
            }                                                                                                      \
            if (next != NULL)                                                                                      \
                for (const int64_t until = (g + 1) * count / groups; fetched < until; ++fetched)                  \
                    __builtin_prefetch(next + (from + fetched) * 64, 0, 1);                                        \
        }                                                                                                          \
        const __m512 s0 = _mm512_loadu_ps(ws), s1 = _mm512_loadu_ps(ws + 16);                                      \
        const __m512 b0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();                                      \
        const __m512 b1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();                                 \
        for (int r = 0; r < R; ++r) {                                                                              \
            const __m512 c = _mm512_set1_ps(corr[r]);                                                              \
            const __m512 y0 = _mm512_fmadd_ps(_mm512_sub_ps(acc[r][0], c), s0, b0);                                \
            const __m512 y1 = _mm512_fmadd_ps(_mm512_sub_ps(acc[r][1], c), s1, b1);                                \
            if (bf16_y) {                                                                                          \
                store_bf16x32((bf16 *)y + r * n, y0, y1);                                                          \
            } else {                                                                                               \
                _mm512_storeu_ps((float *)y + r * n, y0);                                                          \
                _mm512_storeu_ps((float *)y + r * n + 16, y1);                                                     \
            }                                                                                                      \
        }                                                                                                          \
    }

KERNEL(1)
KERNEL(2)
KERNEL(3)
KERNEL(4)
KERNEL(5)
KERNEL(6)

typedef void (*Kernel)(const int8_t *, const float *, const float *, int64_t, const uint8_t *, const float *,
                       const float *, void *, int, int64_t, const char *, int64_t, int64_t);
static const Kernel kernels[ROWS + 1] = {NULL, kernel_1, kernel_2, kernel_3, kernel_4, kernel_5, kernel_6};

#define AMX_TILE_ROWS 16
#define AMX_MIN_ROWS 16 /* fewer rows than this stay on the vpdpbusd kernel (a tile's 16 rows would be mostly pad) */

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
/* AMX-INT8: tdpbsud multiplies a tile of 16 rows x 64 signed bytes (A: 16 rows of x, one group) by one of 16 x 64
 * unsigned bytes (B: a group's 16 four-input rows of 16 columns, which is the panel layout read with a stride of
 * 128 bytes) into 16 x 16 int32 sums: 16,384 multiply-adds an instruction. Each group's sums leave the tiles
 * (tilestored) and are folded into float32 sums with the rows' group scales, as the vpdpbusd kernel does in
 * registers. Tiles: a group's sums in two (the panel's two halves of 16 columns), its rows of x in one (A), the
 * panel's in two (B); even and odd groups take different sums and A tiles (amx_block). */

#include "amx.h"

static void amx_configure(void) {
    TileConfig config = {0};
    config.palette = 1;
    for (int t = 0; t < 8; ++t) config.rows[t] = AMX_TILE_ROWS, config.colsb[t] = 64;
    _tile_loadconfig(&config);
}

static void amx_release(void) { _tile_release(); }

/* acc [16][32] += dot [16][32] (int32) times each row's scale of group g (xs: the rows' scales, `groups` a row). */
static inline void amx_fold(float *acc, const int32_t *dot, const float *xs, int64_t groups, int64_t g) {
    for (int r = 0; r < AMX_TILE_ROWS; ++r) {
        const __m512 s = _mm512_set1_ps(xs[r * groups + g]);
        float *a = acc + r * PANEL;
        const int32_t *d = dot + r * PANEL;
        _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(d)), s, _mm512_load_ps(a)));
        _mm512_store_ps(a + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(d + 16)), s,
                                                _mm512_load_ps(a + 16)));
    }
}

/* One group's products into sums tiles C and D (the panel's two halves) from A tile A and B tiles 6-7. */
#define AMX_GROUP(C, D, A, g)                                                                                        \
    do {                                                                                                           \
        const uint8_t *wg = panel + (g) * GROUP * PANEL;                                                           \
        _tile_zero(C);                                                                                             \
        _tile_zero(D);                                                                                             \
        _tile_loadd(A, xq + (g) * GROUP, k);                                                                       \
        _tile_loadd(6, wg, 4 * PANEL);                                                                             \
        _tile_loadd(7, wg + 64, 4 * PANEL);                                                                        \
        _tile_dpbsud(C, A, 6);                                                                                     \
        _tile_dpbsud(D, A, 7);                                                                                     \
    } while (0)

/* 16 rows of quantized x (padded with zero rows past `rows`) times one panel into y's first `rows` rows. Groups
 * alternate between two sets of tiles (sums 0-1 and A 4 for even groups, 2-3 and 5 for odd ones), so that one
 * group's products run while the group before leaves its tiles and is folded. */
static void amx_block(const int8_t *xq, const float *xs, const float *corr, int64_t k, const uint8_t *panel,
                      const float *ws, const float *bias, void *y, int bf16_y, int64_t n, int64_t rows,
                      const char *next, int64_t from, int64_t count) {
    float acc[AMX_TILE_ROWS * PANEL] __attribute__((aligned(64))) = {0};
    int32_t even[AMX_TILE_ROWS * PANEL] __attribute__((aligned(64))), odd[AMX_TILE_ROWS * PANEL]
        __attribute__((aligned(64)));
    const int64_t groups = k / GROUP, stride = PANEL * sizeof(int32_t);
    int64_t fetched = 0;
    for (int64_t g = 0; g < groups; g += 2) {
        AMX_GROUP(0, 1, 4, g);
        if (g > 0) {
            _tile_stored(2, odd, stride);
            _tile_stored(3, odd + 16, stride);
            amx_fold(acc, odd, xs, groups, g - 1);
        }
        if (g + 1 < groups) AMX_GROUP(2, 3, 5, g + 1);
        _tile_stored(0, even, stride);
        _tile_stored(1, even + 16, stride);
        amx_fold(acc, even, xs, groups, g);
        if (next != NULL)
            for (const int64_t until = (g + 2 < groups ? g + 2 : groups) * count / groups; fetched < until; ++fetched)
                __builtin_prefetch(next + (from + fetched) * 64, 0, 1);
    }
    if (groups % 2 == 0) {
        _tile_stored(2, odd, stride);
        _tile_stored(3, odd + 16, stride);
        amx_fold(acc, odd, xs, groups, groups - 1);
    }
    const __m512 s0 = _mm512_loadu_ps(ws), s1 = _mm512_loadu_ps(ws + 16);
    const __m512 b0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    const __m512 b1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; ++r) {
        const __m512 c = _mm512_set1_ps(corr[r]);
        const __m512 y0 = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_load_ps(acc + r * PANEL), c), s0, b0);
        const __m512 y1 = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_load_ps(acc + r * PANEL + 16), c), s1, b1);
        if (bf16_y) {
            store_bf16x32((bf16 *)y + r * n, y0, y1);
        } else {
            _mm512_storeu_ps((float *)y + r * n, y0);
            _mm512_storeu_ps((float *)y + r * n + 16, y1);
        }
    }
}
#else
static int amx_usable(void) { return 0; }
static void amx_configure(void) {}
static void amx_release(void) {}
static void amx_block(const int8_t *xq, const float *xs, const float *corr, int64_t k, const uint8_t *panel,
                      const float *ws, const float *bias, void *y, int bf16_y, int64_t n, int64_t rows,
                      const char *next, int64_t from, int64_t count) {
    (void)xq, (void)xs, (void)corr, (void)k, (void)panel, (void)ws, (void)bias, (void)y, (void)bf16_y, (void)n,
        (void)rows, (void)next, (void)from, (void)count;
}
#endif

/* 1 when this build multiplies through AMX tiles (from AMX_MIN_ROWS rows) and the OS grants the tile state. */
int int8_gemm_amx(void) { return amx_usable(); }

/* y [m, n] = x [m, k] @ W.T (+ bias [n], float32); x and y bf16 when `bf16_io`, else float32; W packed by
 * int8_gemm_pack with its scales ws [n] (float32). */
int int8_gemm(const void *x, int64_t m, int bf16_io, const uint8_t *packed, const float *ws, const float *bias,
              int64_t n, int64_t k, void *y, int64_t num_threads) {
    if (m < 1 || n <= 0 || k <= 0 || n % PANEL || k % GROUP) return -1;
    const int64_t groups = k / GROUP, panels = n / PANEL, size = k * PANEL, lines = size / 64;
    const size_t elem = bf16_io ? sizeof(bf16) : sizeof(float);
    const int amx = m >= AMX_MIN_ROWS && amx_usable();
    const int64_t block_rows = amx ? AMX_TILE_ROWS : ROWS;
    const int64_t padded = amx ? (m + AMX_TILE_ROWS - 1) / AMX_TILE_ROWS * AMX_TILE_ROWS : m; /* zero rows past m */
    int8_t *xq = malloc((size_t)(padded * k));
    float *xs = malloc((size_t)(padded * groups) * sizeof(float)), *corr = malloc((size_t)m * sizeof(float));
    if (xq == NULL || xs == NULL || corr == NULL) {
        free(xq), free(xs), free(corr);
        return -1;
    }
    memset(xq + m * k, 0, (size_t)((padded - m) * k));
    memset(xs + m * groups, 0, (size_t)((padded - m) * groups) * sizeof(float));
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; ++r)
            quantize_row((const char *)x + r * k * elem, bf16_io, k, xq + r * k, xs + r * groups, corr + r);
        if (amx) amx_configure(); /* the tile configuration is each thread's own */
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t first = panels * t / threads, last = panels * (t + 1) / threads;
        for (int64_t c0 = 0; c0 < m; c0 += CHUNK) {
            const int64_t rows_here = m - c0 < CHUNK ? m - c0 : CHUNK;
            const int64_t blocks = (rows_here + block_rows - 1) / block_rows;
            for (int64_t p = first; p < last; ++p) {
                const uint8_t *panel = packed + p * size;
                const char *next = p + 1 < last ? (const char *)(panel + size) : NULL;
                for (int64_t b = 0; b < blocks; ++b) {
                    const int64_t r0 = c0 + b * block_rows, rows = m - r0 < block_rows ? m - r0 : block_rows;
                    const int64_t from = lines * b / blocks, count = lines * (b + 1) / blocks - from;
                    const float *bias_p = bias == NULL ? NULL : bias + p * PANEL;
                    void *y_p = (char *)y + (r0 * n + p * PANEL) * elem;
                    if (amx)
                        amx_block(xq + r0 * k, xs + r0 * groups, corr + r0, k, panel, ws + p * PANEL, bias_p, y_p,
                                  bf16_io, n, rows, next, from, count);
                    else
                        kernels[rows](xq + r0 * k, xs + r0 * groups, corr + r0, k, panel, ws + p * PANEL, bias_p,
                                      y_p, bf16_io, n, next, from, count);
                }
            }
        }
        if (amx) amx_release();
    }
    free(xq), free(xs), free(corr);
    return 0;
}
#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 without VNNI (the AMD EPYC Zen 3 VM): the same numbers (x in groups of 64 to -127..127, int32 group sums
 * exact, folded over groups in float32) from vpmaddubsw, which multiplies unsigned bytes by signed ones and adds
 * pairs into int16 with saturation: the stored weight w + 128 with a signed x could pass 32,767 (2 * 255 * 127), so
 * the products are |x| times w with x's sign (vpsignb), at most 2 * 127 * 127 in a pair; the weight's signed bytes
 * are the stored ones with the top bit flipped (no correction term), and vpmaddwd against ones widens each
 * column's two pairs into its int32 sum. A microkernel takes ROWS_AVX2 (4) rows x one half of a panel (16 columns:
 * 64 bytes of each 128-byte row) in 8 registers of sums, the rest of the 16 for the weight, the broadcast x and
 * |x|, and ones; the float32 sums over groups are named variables too (an array of them stays on the stack).
 *
 * On the 2-vCPU Zen 3 VM (2026-12-06), SmolLM2's four layer projections with 30 layers' weights cycled, both cores:
 * M = 1 4.8 ms against 17.8 for the float32 packed kernel, M = 8 8.6-10.3 against 18-19, M = 64 63-79 against 86-91,
 * M = 256 256-262 against 364: the pairs' two multiplies (vpmaddubsw, vpmaddwd) take the two vector multiply
 * pipes, so int8 gains less than 2x over FMAs where a step is compute-bound. */
#define ROWS_AVX2 4

int int8_gemm_available(void) { return 1; }

int int8_gemm_amx(void) { return 0; }

/* Row m of x (bf16 or float32 by `bf16_x`) to signed bytes, in groups of GROUP with a scale each (amax / 127,
 * values rounded to nearest even), as the VNNI kernel's quantize_row but for the correction term. */
static void quantize_row_avx2(const void *x, int bf16_x, int64_t k, int8_t *q, float *scales) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* packs work within 128-bit lanes */
    for (int64_t g = 0; g < k / GROUP; ++g) {
        __m256 f[GROUP / 8], amax = _mm256_setzero_ps();
        for (int i = 0; i < GROUP / 8; ++i) {
            f[i] = bf16_x ? (__m256)load_bf16((const bf16 *)x + g * GROUP + 8 * i)
                          : _mm256_loadu_ps((const float *)x + g * GROUP + 8 * i);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, f[i]));
        }
        __m128 top4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        top4 = _mm_max_ps(top4, _mm_movehl_ps(top4, top4));
        const float top = _mm_cvtss_f32(_mm_max_ss(top4, _mm_shuffle_ps(top4, top4, 1)));
        scales[g] = top / 127.0f;
        const __m256 inverse = _mm256_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
        for (int i = 0; i < GROUP / 8; i += 4) {
            __m256i v[4];
            for (int j = 0; j < 4; ++j) v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(f[i + j], inverse));
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256((__m256i *)(q + g * GROUP + 8 * i), _mm256_permutevar8x32_epi32(bytes, order));
        }
    }
}

#define EACH_ROW(OP) OP(0) OP(1) OP(2) OP(3)
#define ROW_SUMS(r) __m256i dot##r##a, dot##r##b; __m256 sum##r##a = _mm256_setzero_ps(), sum##r##b = sum##r##a;
#define ROW_ZERO(r) if (rows > r) dot##r##a = dot##r##b = _mm256_setzero_si256();
#define ROW_DOT(r)                                                                                                 \
    if (rows > r) {                                                                                                \
        const __m256i four = _mm256_set1_epi32(*(const int32_t *)(xq + r * k + g * GROUP + 4 * j));               \
        const __m256i magnitude = _mm256_sign_epi8(four, four);                                                    \
        dot##r##a = _mm256_add_epi32(dot##r##a, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude,                  \
                                                                  _mm256_sign_epi8(w0, four)), ones));            \
        dot##r##b = _mm256_add_epi32(dot##r##b, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude,                  \
                                                                  _mm256_sign_epi8(w1, four)), ones));            \
    }
#define ROW_FOLD(r)                                                                                                \
    if (rows > r) {                                                                                                \
        const __m256 s = _mm256_set1_ps(xs[r * groups + g]);                                                       \
        sum##r##a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot##r##a), s, sum##r##a);                                  \
        sum##r##b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot##r##b), s, sum##r##b);                                  \
    }
#define ROW_STORE(r)                                                                                               \
    if (rows > r) {                                                                                                \
        const __m256 y0 = _mm256_fmadd_ps(sum##r##a, s0, b0), y1 = _mm256_fmadd_ps(sum##r##b, s1, b1);             \
        if (bf16_y) {                                                                                              \
            store_bf16((bf16 *)y + r * n, (vf)y0);                                                                 \
            store_bf16((bf16 *)y + r * n + 8, (vf)y1);                                                             \
        } else {                                                                                                   \
            _mm256_storeu_ps((float *)y + r * n, y0);                                                              \
            _mm256_storeu_ps((float *)y + r * n + 8, y1);                                                          \
        }                                                                                                          \
    }

/* R (<= 4) rows of quantized x times the half panel at `half` (16 columns of each 128-byte row; ws and bias are
 * the half's), into y (row stride n); lines [from, from + count) of `next` fetched into L2 on the way. */
#define KERNEL_AVX2(R)                                                                                             \
    static void kernel_avx2_##R(const int8_t *xq, const float *xs, int64_t k, const uint8_t *half, const float *ws, \
                                const float *bias, void *y, int bf16_y, int64_t n, const char *next, int64_t from,  \
                                int64_t count) {                                                                   \
        enum { rows = R };                                                                                         \
        const int64_t groups = k / GROUP;                                                                          \
        const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);                            \
        EACH_ROW(ROW_SUMS)                                                                                         \
        for (int64_t g = 0; g < groups; ++g) {                                                                     \
            EACH_ROW(ROW_ZERO)                                                                                     \
            const uint8_t *wg = half + g * GROUP * PANEL;                                                          \
            for (int j = 0; j < GROUP / 4; ++j) {                                                                  \
                const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wg + j * 4 * PANEL)), flip); \
                const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wg + j * 4 * PANEL + 32)),   \
                                                    flip);                                                         \
                EACH_ROW(ROW_DOT)                                                                                  \
            }                                                                                                      \
            EACH_ROW(ROW_FOLD)                                                                                     \
            if (next != NULL)                                                                                      \
                for (int64_t line = from + count * g / groups, end = from + count * (g + 1) / groups; line < end;  \
                     ++line)                                                                                       \
                    __builtin_prefetch(next + line * 64, 0, 1);                                                    \
        }                                                                                                          \
        const __m256 s0 = _mm256_loadu_ps(ws), s1 = _mm256_loadu_ps(ws + 8);                                       \
        const __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();                                      \
        const __m256 b1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();                                  \
        EACH_ROW(ROW_STORE)                                                                                        \
    }

KERNEL_AVX2(1)
KERNEL_AVX2(2)
KERNEL_AVX2(3)
KERNEL_AVX2(4)

typedef void (*KernelAvx2)(const int8_t *, const float *, int64_t, const uint8_t *, const float *, const float *,
                           void *, int, int64_t, const char *, int64_t, int64_t);
static const KernelAvx2 kernels_avx2[ROWS_AVX2 + 1] = {NULL, kernel_avx2_1, kernel_avx2_2, kernel_avx2_3,
                                                       kernel_avx2_4};

/* As the VNNI build's int8_gemm (the same arguments and layout): rows in chunks of CHUNK through each thread's
 * panels, each panel's two halves by blocks of 4 rows, the next panel fetched a slice per (half, block). */
int int8_gemm(const void *x, int64_t m, int bf16_io, const uint8_t *packed, const float *ws, const float *bias,
              int64_t n, int64_t k, void *y, int64_t num_threads) {
    if (m < 1 || n <= 0 || k <= 0 || n % PANEL || k % GROUP) return -1;
    const int64_t groups = k / GROUP, panels = n / PANEL, size = k * PANEL, lines = size / 64;
    const size_t elem = bf16_io ? sizeof(bf16) : sizeof(float);
    int8_t *xq = malloc((size_t)(m * k));
    float *xs = malloc((size_t)(m * groups) * sizeof(float));
    if (xq == NULL || xs == NULL) {
        free(xq), free(xs);
        return -1;
    }
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; ++r)
            quantize_row_avx2((const char *)x + r * k * elem, bf16_io, k, xq + r * k, xs + r * groups);
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t first = panels * t / threads, last = panels * (t + 1) / threads;
        for (int64_t c0 = 0; c0 < m; c0 += CHUNK) {
            const int64_t rows_here = m - c0 < CHUNK ? m - c0 : CHUNK;
            const int64_t blocks = (rows_here + ROWS_AVX2 - 1) / ROWS_AVX2, steps = 2 * blocks;
            for (int64_t p = first; p < last; ++p) {
                const uint8_t *panel = packed + p * size;
                const char *next = p + 1 < last ? (const char *)(panel + size) : NULL;
                for (int64_t h = 0; h < 2; ++h)
                    for (int64_t b = 0; b < blocks; ++b) {
                        const int64_t r0 = c0 + b * ROWS_AVX2, rows = m - r0 < ROWS_AVX2 ? m - r0 : ROWS_AVX2;
                        const int64_t step = h * blocks + b, from = lines * step / steps;
                        const int64_t column = p * PANEL + 16 * h;
                        kernels_avx2[rows](xq + r0 * k, xs + r0 * groups, k, panel + 64 * h, ws + column,
                                           bias == NULL ? NULL : bias + column, (char *)y + (r0 * n + column) * elem,
                                           bf16_io, n, next, from, lines * (step + 1) / steps - from);
                    }
            }
        }
    }
    free(xq), free(xs);
    return 0;
}
#else
int int8_gemm_available(void) { return 0; }

int int8_gemm_amx(void) { return 0; }

int int8_gemm(const void *x, int64_t m, int bf16_io, const uint8_t *packed, const float *ws, const float *bias,
              int64_t n, int64_t k, void *y, int64_t num_threads) {
    (void)x, (void)m, (void)bf16_io, (void)packed, (void)ws, (void)bias, (void)n, (void)k, (void)y,
        (void)num_threads;
    return -1;
}
#endif
