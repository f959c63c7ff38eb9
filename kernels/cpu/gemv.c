/* y = x @ W.T (+ bias) for a few rows of activations against a weight [N, K] of the same dtype: the decode step of
 * one to four sequences, where a projection reads its whole weight for a handful of dot products and the time is the
 * weight's bytes.
 *
 * float32 (gemv_f32), any CPU (vec8.h's 8-float vectors: AVX2 + FMA on x86): the weight streamed in 8-row blocks,
 * each row a contiguous read, 8 lanes of a row times x per FMA, the 8 rows' sums reduced together (hsum8). On a
 * 2-vCPU AMD EPYC Zen 1 VM (AVX2 on 128-bit units) torch's and oneDNN's fp32 M = 1 paths read SmolLM2's weights at
 * 10-15 and 12-18 GB/s, this loop at 19-23 (llama.cpp's F32 server: one-stream TPOT 45-57 ms against this engine's
 * 57-86 the same hour, before this path). K and N must be multiples of 8, else -1.
 *
 * bfloat16 (gemv_bf16), on CPUs with AVX512-BF16: oneDNN's bf16 inner product read SmolLM2's weights at 19-22 GB/s
 * (M = 1, weights of 30 layers cycled, 2-core AMD EPYC Zen 4); this loop streams them in 16-row blocks, each row a
 * contiguous read, each 32 bf16 of a row one vdpbf16ps against x, the 16 rows' sums reduced together (hsum16).
 *
 * Sums are float32 in another order than oneDNN's; y is rounded to bf16 once, after the bias. K must be a multiple
 * of 32 and N of 16; other shapes, other dtypes and CPUs without the instructions return -1 (the caller uses
 * oneDNN).
 */
#include <stdint.h>

#include "vec8.h"

#define MAX_ROWS 4

int gemv_f32(const float *x, int64_t m, const float *w, const float *bias, int64_t n, int64_t k, float *y,
             int64_t num_threads) {
    if (m < 1 || m > MAX_ROWS || k % LANES || n % 8) return -1;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t block = 0; block < n / 8; ++block) {
        const float *rows = w + block * 8 * k;
        for (int64_t r = 0; r < m; ++r) {
            vf acc[8];
            for (int j = 0; j < 8; ++j) acc[j] = splat(0.0f);
            for (int64_t i = 0; i < k; i += LANES) {
                const vf xv = load(x + r * k + i);
                for (int j = 0; j < 8; ++j) acc[j] += load(rows + j * k + i) * xv;
            }
            vf sums = hsum8(acc);
            if (bias != NULL) sums += load(bias + block * 8);
            store(y + r * n + block * 8, sums);
        }
    }
    return 0;
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
int gemv_bf16(const bf16 *x, int64_t m, const bf16 *w, const bf16 *bias, int64_t n, int64_t k, bf16 *y,
              int64_t num_threads) {
    if (m < 1 || m > MAX_ROWS || k % 32 || n % 16) return -1;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t block = 0; block < n / 16; ++block) {
        const bf16 *rows = w + block * 16 * k;
        for (int64_t r = 0; r < m; ++r) {
            __m512 acc[16];
            for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
            for (int64_t i = 0; i < k; i += 32) {
                const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * k + i);
                for (int j = 0; j < 16; ++j)
                    acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_loadu_si512(rows + j * k + i), xv);
            }
            __m512 sums = hsum16(acc);
            if (bias != NULL) { /* 16 bf16 widened exactly: their bits in the top half of a float32 */
                const __m256i b = _mm256_loadu_si256((const __m256i *)(bias + block * 16));
                sums = _mm512_add_ps(sums, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
            }
            _mm256_storeu_si256((__m256i *)(y + r * n + block * 16), (__m256i)_mm512_cvtneps_pbh(sums));
        }
    }
    return 0;
}
#else
int gemv_bf16(const bf16 *x, int64_t m, const bf16 *w, const bf16 *bias, int64_t n, int64_t k, bf16 *y,
              int64_t num_threads) {
    (void)x, (void)m, (void)w, (void)bias, (void)n, (void)k, (void)y, (void)num_threads;
    return -1;
}
#endif
