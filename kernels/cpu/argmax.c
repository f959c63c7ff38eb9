/* Greedy sampling's argmax over each row of float32 logits, as torch.argmax(dim=-1) answers it: the first index of
 * the row's largest value, or of its first NaN where it has one (torch counts NaN above everything). torch's CPU
 * op took 2.6-2.8 ms on [64, 49152] logits (SmolLM2's decode batch, 2-core Sapphire Rapids class VM, 2026-12-05): 3% of
 * a decode step; this reads them at memory speed, the rows split over the threads. */
#include <math.h>
#include <stdint.h>

#include "vec8.h"

#define PARALLEL_ELEMENTS (1 << 15) /* the fewest elements worth a second thread (its wake-up costs ~10 us) */

static int64_t first_nan(const float *row, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (isnan(row[i])) return i;
    return -1;
}

static int64_t argmax_row(const float *row, int64_t n) {
    int64_t i = 0, best = 0;
    float top = row[0];
#if defined(__AVX512F__)
    if (n >= 32) {
        /* per lane the largest value and the first index it came at; NaNs noted (x != x) and looked up after */
        __m512 lane_top = _mm512_loadu_ps(row);
        __m512i lane_index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512i index = lane_index;
        __mmask16 nan = _mm512_cmp_ps_mask(lane_top, lane_top, _CMP_UNORD_Q);
        const __m512i step = _mm512_set1_epi32(16);
        for (i = 16; i + 16 <= n; i += 16) {
            index = _mm512_add_epi32(index, step);
            const __m512 v = _mm512_loadu_ps(row + i);
            const __mmask16 greater = _mm512_cmp_ps_mask(v, lane_top, _CMP_GT_OQ); /* later equal ones: not taken */
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            lane_top = _mm512_mask_mov_ps(lane_top, greater, v);
            lane_index = _mm512_mask_mov_epi32(lane_index, greater, index);
        }
        if (nan) return first_nan(row, n);
        top = _mm512_reduce_max_ps(lane_top);
        const __mmask16 at_top = _mm512_cmp_ps_mask(lane_top, _mm512_set1_ps(top), _CMP_EQ_OQ);
        best = _mm512_mask_reduce_min_epi32(at_top, lane_index); /* the first index among the lanes holding it */
    }
#endif
    for (; i < n; ++i) {
        const float v = row[i];
        if (isnan(v)) return first_nan(row, n);
        if (v > top) top = v, best = i;
    }
    return best; /* a NaN anywhere, row[0] too, returned above */
}

/* out[r] = argmax of logits[r] (rows x n, contiguous; n >= 1). */
void argmax_rows(const float *logits, int64_t rows, int64_t n, int64_t *out, int64_t num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * n >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; ++r) out[r] = argmax_row(logits + r * n, n);
}
