/* y = x @ W.T (+ bias) with an int8 weight and int8 activations, on CPUs with AVX512-VNNI: the GEMM of
 * quantization="int8" where the CPU's int8 dot products run at twice its bf16 ones (vpdpbusd: 64 multiply-adds an
 * instruction against vdpbf16ps's 32).
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
 * K must be a multiple of 64 and N of 32, else the functions return -1 and the caller multiplies another way.
 */
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

/* acc += w (unsigned bytes) . the 4 signed bytes at p, broadcast: vpdpbusd with its memory operand broadcast. In
 * asm because GCC 12 copied every accumulator of the intrinsic's loop to another register and back at each step
 * (24 moves per 12 vpdpbusd), and loaded each broadcast apart. */
#define DPBUSD_BCAST(acc, w, p) __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(p)))

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
                    DPBUSD_BCAST(dot[r][0], w0, four);                                                             \
                    DPBUSD_BCAST(dot[r][1], w1, four);                                                             \
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
                _mm512_storeu_si512((bf16 *)y + r * n, (__m512i)_mm512_cvtne2ps_pbh(y1, y0));                      \
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

/* y [m, n] = x [m, k] @ W.T (+ bias [n], float32); x and y bf16 when `bf16_io`, else float32; W packed by
 * int8_gemm_pack with its scales ws [n] (float32). */
int int8_gemm(const void *x, int64_t m, int bf16_io, const uint8_t *packed, const float *ws, const float *bias,
              int64_t n, int64_t k, void *y, int64_t num_threads) {
    if (m < 1 || n <= 0 || k <= 0 || n % PANEL || k % GROUP) return -1;
    const int64_t groups = k / GROUP, panels = n / PANEL, size = k * PANEL, lines = size / 64;
    const size_t elem = bf16_io ? sizeof(bf16) : sizeof(float);
    int8_t *xq = malloc((size_t)(m * k));
    float *xs = malloc((size_t)(m * groups) * sizeof(float)), *corr = malloc((size_t)m * sizeof(float));
    if (xq == NULL || xs == NULL || corr == NULL) {
        free(xq), free(xs), free(corr);
        return -1;
    }
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; ++r)
            quantize_row((const char *)x + r * k * elem, bf16_io, k, xq + r * k, xs + r * groups, corr + r);
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t first = panels * t / threads, last = panels * (t + 1) / threads;
        for (int64_t c0 = 0; c0 < m; c0 += CHUNK) {
            const int64_t rows_here = m - c0 < CHUNK ? m - c0 : CHUNK, blocks = (rows_here + ROWS - 1) / ROWS;
            for (int64_t p = first; p < last; ++p) {
                const uint8_t *panel = packed + p * size;
                const char *next = p + 1 < last ? (const char *)(panel + size) : NULL;
                for (int64_t b = 0; b < blocks; ++b) {
                    const int64_t r0 = c0 + b * ROWS, rows = m - r0 < ROWS ? m - r0 : ROWS;
                    const int64_t from = lines * b / blocks, count = lines * (b + 1) / blocks - from;
                    kernels[rows](xq + r0 * k, xs + r0 * groups, corr + r0, k, panel, ws + p * PANEL,
                                  bias == NULL ? NULL : bias + p * PANEL, (char *)y + (r0 * n + p * PANEL) * elem,
                                  bf16_io, n, next, from, count);
                }
            }
        }
    }
    free(xq), free(xs), free(corr);
    return 0;
}
#else
int int8_gemm_available(void) { return 0; }

int int8_gemm(const void *x, int64_t m, int bf16_io, const uint8_t *packed, const float *ws, const float *bias,
              int64_t n, int64_t k, void *y, int64_t num_threads) {
    (void)x, (void)m, (void)bf16_io, (void)packed, (void)ws, (void)bias, (void)n, (void)k, (void)y,
        (void)num_threads;
    return -1;
}
#endif
