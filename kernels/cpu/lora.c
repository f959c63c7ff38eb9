/* Multi-LoRA shrink and expand for CPUs: one call per projection for a whole batch of mixed adapters.
 *
 * Why C and not torch: in a decode step each projection's LoRA is a few small products per adapter (64 tokens
 * over 8 adapters at rank 16 is a few MFLOP), and torch pays tens of microseconds per op for the gathers,
 * batched products, scatters and scalings around them: about 60 ms of a decode step of SmolLM2-135M with 8
 * adapters, against under 10 ms of arithmetic. Here each token is one work item: its slot's A or B rows are read
 * from cache (tokens come in slot order, so consecutive tokens share them) and its h or y row is written once.
 *
 * Layouts (row-major): x [tokens, in] with row stride x_stride; lora_a [slots, R, in] with R = parts * max_rank;
 * h [tokens, R] contiguous; lora_b [slots, out_total, max_rank]; y [tokens, out_total] with row stride y_stride.
 * x, y, lora_a and lora_b are act_t (float32 or bfloat16, see vec8.h: the slot buffers follow the model's dtype);
 * h, scales and every sum are float32, and y is rounded once, after its delta is added. rows[i] / slots[i], i < num_rows: the token rows that have an adapter and their slots, in slot order.
 * Vectors of 8 floats (GCC/Clang vector extensions: AVX2/AVX-512 on x86, NEON on ARM); in_features, max_rank and
 * every part's size must be multiples of 8, else the functions return -1 and the caller uses torch.
 */
#include <stdint.h>

#include "vec8.h"

/* h[rows[i], 0:R] = lora_a[slots[i]] @ x[rows[i]]: eight rows of A at a time against the token's x. */
int lora_shrink(const act_t *x, int64_t x_stride, const act_t *lora_a, int64_t in_features, int64_t rank_total,
                const int64_t *rows, const int64_t *slots, int64_t num_rows, float *h, int64_t num_threads) {
    if (in_features % LANES || rank_total % LANES) return -1;
    const int64_t vecs = in_features / LANES;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t i = 0; i < num_rows; ++i) {
        const act_t *xt = x + rows[i] * x_stride;
        const act_t *a = lora_a + slots[i] * rank_total * in_features;
        float *ht = h + rows[i] * rank_total;
        for (int64_t r = 0; r < rank_total; r += LANES) {
            vf acc[LANES] = {0};
            const act_t *ar = a + r * in_features;
            for (int64_t k = 0; k < vecs; ++k) {
                vf xv = load_act(xt + k * LANES);
                for (int j = 0; j < LANES; ++j) acc[j] += load_act(ar + j * in_features + k * LANES) * xv;
            }
            store(ht + r, hsum8(acc));
        }
    }
    return 0;
}

/* y[rows[i], part p] += scales[s] * lora_b[s][part p rows] @ h[rows[i], p * max_rank : (p + 1) * max_rank] with
 * s = slots[i]: eight outputs at a time (eight rows of B against the token's h). */
int lora_expand(act_t *y, int64_t y_stride, const float *h, int64_t h_stride, const act_t *lora_b,
                int64_t out_total, int64_t max_rank, const int64_t *part_sizes, int64_t num_parts,
                const float *scales, const int64_t *rows, const int64_t *slots, int64_t num_rows,
                int64_t num_threads) {
    if (max_rank % LANES) return -1;
    for (int64_t p = 0; p < num_parts; ++p)
        if (part_sizes[p] % LANES) return -1;
    const int64_t rvecs = max_rank / LANES;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t i = 0; i < num_rows; ++i) {
        const int64_t s = slots[i];
        const act_t *b = lora_b + s * out_total * max_rank;
        const float *ht = h + rows[i] * h_stride;
        act_t *yt = y + rows[i] * y_stride;
        const vf scale = splat(scales[s]);
        int64_t offset = 0;
        for (int64_t p = 0; p < num_parts; ++p) {
            const float *hp = ht + p * max_rank;
            for (int64_t o = offset; o < offset + part_sizes[p]; o += LANES) {
                vf acc[LANES] = {0};
                for (int64_t k = 0; k < rvecs; ++k) {
                    vf hv = load(hp + k * LANES);
                    for (int j = 0; j < LANES; ++j) acc[j] += load_act(b + (o + j) * max_rank + k * LANES) * hv;
                }
                store_act(yt + o, load_act(yt + o) + scale * hsum8(acc));
            }
            offset += part_sizes[p];
        }
    }
    return 0;
}
