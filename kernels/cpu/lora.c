/* Multi-LoRA shrink and expand for CPUs: one call per projection for a whole batch of mixed adapters.
 *
 * Why C and not torch: in a decode step each projection's LoRA is a few small products per adapter (64 tokens
 * over 8 adapters at rank 16 is a few MFLOP), and torch pays tens of microseconds per op for the gathers,
 * batched products, scatters and scalings around them: about 60 ms of a decode step of SmolLM2-135M with 8
 * adapters, against under 10 ms of arithmetic. Here up to TILE consecutive tokens of one slot are a work item: the
 * slot's A or B rows are read once for all of them, and each token's h or y row is written once.
 *
 * Layouts (row-major): x [tokens, in] with row stride x_stride; lora_a [slots, R, in] with R = parts * max_rank;
 * h [tokens, R] contiguous; lora_b [slots, out_total, max_rank]; y [tokens, out_total] with row stride y_stride.
 * x, y, lora_a and lora_b are act_t (float32 or bfloat16, see vec8.h: the slot buffers follow the model's dtype);
 * h, scales and every sum are float32, and y is rounded once, after its delta is added. rows[i] / slots[i], i < num_rows: the token rows that have an adapter and their slots, in slot order.
 * Vectors of 8 floats (GCC/Clang vector extensions: AVX2/AVX-512 on x86, NEON on ARM); in_features, max_rank and
 * every part's size must be multiples of 8, else the functions return -1 and the caller uses torch.
 */
#include <stdint.h>
#include <stdlib.h>

#include "vec8.h"

/* Tokens come in slot order, so runs of consecutive rows share an adapter: a work item is up to TILE of them with one
 * slot, and each row of A (or B) it loads serves all of them. With one token an item, each token read the whole of
 * its A from L2 (55 KB for SmolLM2's q|k|v in bf16): q|k|v's shrink and expand for 512 tokens over 8 slots took
 * 578 us in bf16, 403 us tiled (Zen 4 VM; fp32 about the same either way). */
#define TILE 4

/* The first row of each work item: a new one at every slot change and every TILE rows of one slot. */
static int64_t tile_starts(const int64_t *slots, int64_t num_rows, int64_t *starts) {
    int64_t n = 0;
    for (int64_t i = 0; i < num_rows; ++i)
        if (i == 0 || slots[i] != slots[i - 1] || i - starts[n - 1] == TILE) starts[n++] = i;
    return n;
}

/* Sums of four rows' dot products with each of two tokens (acc[t * 4 + j]: token t, row j) -> out[t][0:4]. */
static inline void store_sums(const vf acc[8], float *out0, float *out1) {
    const vf sums = hsum8(acc);
    for (int j = 0; j < 4; ++j) out0[j] = sums[j], out1[j] = sums[4 + j];
}

#if defined(ACT_BF16) && defined(__AVX512BF16__)
/* bf16 x and A on a CPU with AVX512-BF16: vdpbf16ps multiplies 32 bf16 pairs into 16 float32 sums in one instruction
 * (the products of two bf16 are exact in float32, as in the loop below; the sums go in another order). A tile of
 * TILE tokens x 4 rows of A is 16 accumulators, reduced together. in_features must be a multiple of 32. */
_Static_assert(TILE * 4 == 16, "a tile is one hsum16");
static void shrink_tile_dp(const act_t *const xs[TILE], const act_t *a, int64_t in_features, int64_t rank_total,
                           float *const hs[TILE]) {
    for (int64_t r = 0; r < rank_total; r += 4) {
        __m512 acc[TILE * 4];
        for (int i = 0; i < TILE * 4; ++i) acc[i] = _mm512_setzero_ps();
        const act_t *ar = a + r * in_features;
        for (int64_t k = 0; k < in_features; k += 32) {
            __m512bh av[4];
            for (int j = 0; j < 4; ++j) av[j] = (__m512bh)_mm512_loadu_si512(ar + j * in_features + k);
            for (int t = 0; t < TILE; ++t) {
                const __m512bh xv = (__m512bh)_mm512_loadu_si512(xs[t] + k);
                for (int j = 0; j < 4; ++j) acc[t * 4 + j] = _mm512_dpbf16_ps(acc[t * 4 + j], av[j], xv);
            }
        }
        float sums[TILE * 4];
        _mm512_storeu_ps(sums, hsum16(acc));
        for (int t = 0; t < TILE; ++t)
            if (hs[t] != NULL)
                for (int j = 0; j < 4; ++j) hs[t][r + j] = sums[t * 4 + j];
    }
}
#define HAVE_DP 1
#else
#define HAVE_DP 0
#endif

/* 1 when this build's bf16 shrink runs on vdpbf16ps (above), else 0: for the tests. */
int lora_bf16_dots(void) { return HAVE_DP; }

/* h[rows[i], 0:R] = lora_a[slots[i]] @ x[rows[i]]: four rows of A at a time against up to TILE tokens' x. */
int lora_shrink(const act_t *x, int64_t x_stride, const act_t *lora_a, int64_t in_features, int64_t rank_total,
                const int64_t *rows, const int64_t *slots, int64_t num_rows, float *h, int64_t num_threads) {
    if (in_features % LANES || rank_total % LANES) return -1;
    int64_t *starts = malloc((num_rows > 0 ? num_rows : 1) * sizeof(int64_t));
    if (starts == NULL) return -1;
    const int64_t num_items = tile_starts(slots, num_rows, starts), vecs = in_features / LANES;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t item = 0; item < num_items; ++item) {
        const int64_t first = starts[item], n = (item + 1 < num_items ? starts[item + 1] : num_rows) - first;
        const act_t *a = lora_a + slots[first] * rank_total * in_features;
        const act_t *xs[TILE];
        float scratch[TILE][4], *hs[TILE];
        for (int t = 0; t < TILE; ++t) { /* missing tokens repeat the last one; their sums go to scratch */
            xs[t] = x + rows[first + (t < n ? t : n - 1)] * x_stride;
            hs[t] = t < n ? h + rows[first + t] * rank_total : NULL;
        }
#if HAVE_DP
        if (in_features % 32 == 0) {
            shrink_tile_dp(xs, a, in_features, rank_total, hs);
            continue;
        }
#endif
        for (int64_t r = 0; r < rank_total; r += 4) {
            vf acc[TILE][4];
            for (int t = 0; t < TILE; ++t)
                for (int j = 0; j < 4; ++j) acc[t][j] = splat(0.0f);
            const act_t *ar = a + r * in_features;
            for (int64_t k = 0; k < vecs; ++k) {
                vf av[4];
                for (int j = 0; j < 4; ++j) av[j] = load_act(ar + j * in_features + k * LANES);
                for (int t = 0; t < TILE; ++t) {
                    const vf xv = load_act(xs[t] + k * LANES);
                    for (int j = 0; j < 4; ++j) acc[t][j] += av[j] * xv;
                }
            }
            for (int t = 0; t < TILE; t += 2)
                store_sums(acc[t], hs[t] ? hs[t] + r : scratch[t], hs[t + 1] ? hs[t + 1] + r : scratch[t + 1]);
        }
    }
    free(starts);
    return 0;
}

/* y[rows[i], part p] += scales[s] * lora_b[s][part p rows] @ h[rows[i], p * max_rank : (p + 1) * max_rank] with
 * s = slots[i]: eight outputs at a time (eight rows of B, held in registers up to rank 16) against each of up to
 * TILE tokens' h. */
int lora_expand(act_t *y, int64_t y_stride, const float *h, int64_t h_stride, const act_t *lora_b,
                int64_t out_total, int64_t max_rank, const int64_t *part_sizes, int64_t num_parts,
                const float *scales, const int64_t *rows, const int64_t *slots, int64_t num_rows,
                int64_t num_threads) {
    if (max_rank % LANES) return -1;
    for (int64_t p = 0; p < num_parts; ++p)
        if (part_sizes[p] % LANES) return -1;
    int64_t *starts = malloc((num_rows > 0 ? num_rows : 1) * sizeof(int64_t));
    if (starts == NULL) return -1;
    const int64_t num_items = tile_starts(slots, num_rows, starts), rvecs = max_rank / LANES;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t item = 0; item < num_items; ++item) {
        const int64_t first = starts[item], n = (item + 1 < num_items ? starts[item + 1] : num_rows) - first;
        const int64_t s = slots[first];
        const act_t *b = lora_b + s * out_total * max_rank;
        const vf scale = splat(scales[s]);
        int64_t offset = 0;
        for (int64_t p = 0; p < num_parts; ++p) {
            for (int64_t o = offset; o < offset + part_sizes[p]; o += LANES) {
                if (rvecs <= 2) { /* rank <= 16: the block of B in 16 registers, reused by every token */
                    vf bv[LANES][2];
                    for (int j = 0; j < LANES; ++j)
                        for (int64_t k = 0; k < 2; ++k)
                            bv[j][k] = k < rvecs ? load_act(b + (o + j) * max_rank + k * LANES) : splat(0.0f);
                    for (int64_t t = 0; t < n; ++t) {
                        const float *hp = h + rows[first + t] * h_stride + p * max_rank;
                        const vf h0 = load(hp), h1 = rvecs > 1 ? load(hp + LANES) : splat(0.0f);
                        vf acc[LANES];
                        for (int j = 0; j < LANES; ++j) acc[j] = bv[j][0] * h0 + bv[j][1] * h1;
                        act_t *yt = y + rows[first + t] * y_stride + o;
                        store_act(yt, load_act(yt) + scale * hsum8(acc)); /* y rounded once, after its delta */
                    }
                    continue;
                }
                for (int64_t t = 0; t < n; ++t) {
                    const float *hp = h + rows[first + t] * h_stride + p * max_rank;
                    vf acc[LANES] = {0};
                    for (int64_t k = 0; k < rvecs; ++k) {
                        const vf hv = load(hp + k * LANES);
                        for (int j = 0; j < LANES; ++j) acc[j] += load_act(b + (o + j) * max_rank + k * LANES) * hv;
                    }
                    act_t *yt = y + rows[first + t] * y_stride + o;
                    store_act(yt, load_act(yt) + scale * hsum8(acc));
                }
            }
            offset += part_sizes[p];
        }
    }
    free(starts);
    return 0;
}
