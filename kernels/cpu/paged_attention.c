/* Paged attention for CPUs: reads K/V in place from the block pool (no gather of the context). q and out are
 * act_t, the caches kv_t (float32 or bfloat16 each, see vec8.h); scores, softmax and sums are float32.
 *
 * Why C and not torch: torch has no op that indexes a paged cache inside a matmul, and gathering the context
 * every layer costs more than the model's weight GEMMs on this class of machine (see DESIGN.md). This loop
 * reads each sequence's K/V once per kv head with an online softmax, so decode attention runs near memory speed.
 *
 * Work item = (sequence, kv head, tile of query tokens). Rows of a tile = its queries x the q heads of the kv
 * head's group; the block's keys stay in L1 while every row uses them. An item that holds every kv head of its
 * sequence (decode, many sequences) first copies each block's K and V to the stack, one contiguous read each:
 * the rows' head-strided reads straight from the pool ran decode attention 17-20% slower on a KV cache that does
 * not fit in the L3 (SmolLM2, 64 sequences, bf16, 2-core AMD EPYC VM). Causal: query j of a sequence with n
 * queries and context length L sits at position L - n + j and sees positions 0..L - n + j.
 *
 * Written with GCC/Clang vector extensions (8 floats), so -march=native picks AVX2/AVX-512 on x86 and NEON on
 * ARM. head_dim must be a multiple of 8; the caller falls back to torch otherwise (return value -1).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec8.h"

#define MAX_ROWS 32
#define MAX_VECS 32 /* head_dim <= 256 */
#define MAX_BLOCK_SIZE 256
#define COPY_ELEMENTS 8192 /* the most K (and V) elements of one block an item copies to the stack */

static inline vf vmax(vf a, vf b) { vi m = a > b; return (vf)(((vi)a & m) | ((vi)b & ~m)); }

/* exp(x) for x <= 0 (softmax arguments), Cephes' expf polynomial: relative error ~2e-7. */
static inline vf vexp(vf x) {
    x = vmax(x, splat(-87.0f));
    vf fx = x * splat(1.44269504088896341f) + splat(0.5f);
    vf n = __builtin_convertvector(__builtin_convertvector(fx, vi), vf);
    n += __builtin_convertvector(n > fx, vf); /* truncation -> floor: subtract 1 where n > fx */
    x = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
    vf y = splat(1.9875691500e-4f);
    y = y * x + splat(1.3981999507e-3f);
    y = y * x + splat(8.3334519073e-3f);
    y = y * x + splat(4.1665795894e-2f);
    y = y * x + splat(1.6666665459e-1f);
    y = y * x + splat(5.0000001201e-1f);
    y = y * x * x + x + splat(1.0f);
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    return y * (vf)bits;
}

typedef struct {
    int32_t seq, first_kv_head, num_kv_heads, first_query, num_queries;
} WorkItem;

typedef struct {
    const act_t *q;                /* [T, Hq, D] */
    const kv_t *k_cache, *v_cache; /* [num_blocks, block_size, Hkv, D] */
    act_t *out;                    /* [T, Hq, D] */
    const int32_t *block_tables, *seq_lens, *query_start_loc;
    int64_t max_blocks, num_q_heads, num_kv_heads, block_size;
    float scale;
} Args;

/* s[t] = scale * q . k_t for t < n; eight keys at a time, so eight independent FMA chains hide the FMA
 * latency and one transposed reduction replaces eight horizontal sums. */
#define DOTS(NV)                                                                                         \
    static inline void dots_##NV(const act_t *q, const kv_t *k, int64_t stride, int64_t n, float scale, \
                                 int64_t nv_rt, float *s) {                                             \
        const int64_t nv = NV > 0 ? NV : nv_rt;                                                          \
        vf qv[NV > 0 ? NV : MAX_VECS];                                                                   \
        for (int64_t i = 0; i < nv; ++i) qv[i] = load_act(q + i * LANES);                                \
        int64_t t = 0;                                                                                   \
        for (; t + 8 <= n; t += 8) {                                                                    \
            const kv_t *kt = k + t * stride;                                                            \
            vf a[8];                                                                                    \
            for (int j = 0; j < 8; ++j) a[j] = qv[0] * load_kv(kt + j * stride);                        \
            for (int64_t i = 1; i < nv; ++i)                                                            \
                for (int j = 0; j < 8; ++j) a[j] += qv[i] * load_kv(kt + j * stride + i * LANES);       \
            store(s + t, hsum8(a) * splat(scale));                                                      \
        }                                                                                               \
        for (; t + 4 <= n; t += 4) {                                                                     \
            const kv_t *k0 = k + t * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;   \
            vf a0 = qv[0] * load_kv(k0), a1 = qv[0] * load_kv(k1);                                       \
            vf a2 = qv[0] * load_kv(k2), a3 = qv[0] * load_kv(k3);                                       \
            for (int64_t i = 1; i < nv; ++i) {                                                           \
                a0 += qv[i] * load_kv(k0 + i * LANES);                                                   \
                a1 += qv[i] * load_kv(k1 + i * LANES);                                                   \
                a2 += qv[i] * load_kv(k2 + i * LANES);                                                   \
                a3 += qv[i] * load_kv(k3 + i * LANES);                                                   \
            }                                                                                            \
            s[t] = hsum(a0) * scale, s[t + 1] = hsum(a1) * scale;                                        \
            s[t + 2] = hsum(a2) * scale, s[t + 3] = hsum(a3) * scale;                                    \
        }                                                                                                \
        for (; t < n; ++t) {                                                                             \
            const kv_t *k0 = k + t * stride;                                                             \
            vf a0 = qv[0] * load_kv(k0);                                                                 \
            for (int64_t i = 1; i < nv; ++i) a0 += qv[i] * load_kv(k0 + i * LANES);                      \
            s[t] = hsum(a0) * scale;                                                                     \
        }                                                                                                \
    }

/* acc = acc * correction + sum_t p[t] * v_t, the accumulator held in registers across the block. */
#define AXPYS(NV)                                                                                        \
    static inline void axpys_##NV(float *acc, float correction, const float *p, const kv_t *v,          \
                                  int64_t stride, int64_t n, int64_t nv_rt) {                            \
        const int64_t nv = NV > 0 ? NV : nv_rt;                                                          \
        vf a[NV > 0 ? NV : MAX_VECS];                                                                    \
        for (int64_t i = 0; i < nv; ++i) a[i] = load(acc + i * LANES) * splat(correction);               \
        for (int64_t t = 0; t < n; ++t) {                                                                \
            const vf pt = splat(p[t]);                                                                   \
            for (int64_t i = 0; i < nv; ++i) a[i] += pt * load_kv(v + t * stride + i * LANES);           \
        }                                                                                                \
        for (int64_t i = 0; i < nv; ++i) store(acc + i * LANES, a[i]);                                   \
    }

/* Online softmax over one block for one row: exponentiate s[0..n) in place, return the correction factor. */
static inline float softmax_block(float *s, int64_t n, float *row_max, float *row_sum) {
    float block_max = *row_max;
    for (int64_t t = 0; t < n; ++t) block_max = s[t] > block_max ? s[t] : block_max;
    const int64_t padded = (n + LANES - 1) / LANES * LANES;
    for (int64_t t = n; t < padded; ++t) s[t] = block_max; /* lanes past n: computed, never summed */
    vf sum = splat(0.0f);
    for (int64_t t = 0; t < padded; t += LANES) {
        vf e = vexp(load(s + t) - splat(block_max));
        store(s + t, e);
        if (t + LANES <= n) sum += e;
    }
    float total = hsum(sum);
    for (int64_t t = n / LANES * LANES; t < n; ++t) total += s[t];
    const float correction = expf(*row_max - block_max); /* 0 on the first block: row_max = -inf */
    *row_sum = *row_sum * correction + total;
    *row_max = block_max;
    return correction;
}

/* Ask for the keys and values of one block: block_size rows of `span` elements (the item's kv heads). Into L2
 * (locality 1), not L1: a block's lines (192 for SmolLM2 in bf16) overflow L1's miss buffers, and decode attention
 * from a KV cache larger than the L3 ran 8-14% faster this way (4 interleaved runs; fetching 2-8 blocks ahead, no
 * better). */
static inline void prefetch_block(const Args *args, int64_t offset, int64_t row_stride, int64_t span) {
    for (int64_t t = 0; t < args->block_size; ++t)
        for (int64_t d = 0; d < span; d += 64 / sizeof(kv_t)) {
            __builtin_prefetch(args->k_cache + offset + t * row_stride + d, 0, 1);
            __builtin_prefetch(args->v_cache + offset + t * row_stride + d, 0, 1);
        }
}

#define TILE(NV)                                                                                         \
    DOTS(NV)                                                                                             \
    AXPYS(NV)                                                                                            \
    static void tile_##NV(const Args *args, WorkItem item, int64_t nv_rt) {                              \
        const int64_t nv = NV > 0 ? NV : nv_rt, head_dim = nv * LANES;                                   \
        const int64_t group = args->num_q_heads / args->num_kv_heads;                                    \
        const int64_t heads = item.num_kv_heads * group; /* q heads per query in this item */            \
        const int64_t rows = item.num_queries * heads;                                                   \
        if (rows <= 0) return;                                                                           \
        const int64_t row_stride = args->num_kv_heads * head_dim;                                        \
        const int64_t block_stride = args->block_size * row_stride;                                      \
        const int64_t seq_len = args->seq_lens[item.seq], token0 = args->query_start_loc[item.seq];      \
        const int64_t num_queries = args->query_start_loc[item.seq + 1] - token0;                        \
        const int32_t *block_table = args->block_tables + item.seq * args->max_blocks;                   \
        float acc[MAX_ROWS][NV > 0 ? NV * LANES : MAX_VECS * LANES];                                     \
        float scores[MAX_BLOCK_SIZE + LANES];                                                            \
        float row_max[MAX_ROWS], row_sum[MAX_ROWS];                                                      \
        int64_t last_pos[MAX_ROWS], kv_offset[MAX_ROWS];                                                 \
        const act_t *q_rows[MAX_ROWS];                                                                   \
        for (int64_t r = 0; r < rows; ++r) {                                                             \
            const int64_t j = item.first_query + r / heads;                                              \
            const int64_t head = item.first_kv_head * group + r % heads;                                 \
            q_rows[r] = args->q + ((token0 + j) * args->num_q_heads + head) * head_dim;                  \
            kv_offset[r] = (head / group) * head_dim;                                                    \
            last_pos[r] = seq_len - num_queries + j;                                                     \
            row_max[r] = -INFINITY, row_sum[r] = 0.0f;                                                   \
            memset(acc[r], 0, head_dim * sizeof(float));                                                 \
        }                                                                                                \
        const int64_t tile_last = last_pos[rows - 1];                                                    \
        const int64_t span = item.num_kv_heads * head_dim, first = item.first_kv_head * head_dim;        \
        kv_t kbuf[COPY_ELEMENTS], vbuf[COPY_ELEMENTS];                                                   \
        const int copy = span == row_stride && args->block_size * row_stride <= COPY_ELEMENTS;           \
        for (int64_t start = 0, b = 0; start <= tile_last; start += args->block_size, ++b) {             \
            const int64_t offset = (int64_t)block_table[b] * block_stride;                               \
            if (start + args->block_size <= tile_last) /* next block: overlap its latency with work */   \
                prefetch_block(args, (int64_t)block_table[b + 1] * block_stride + first, row_stride, span); \
            if (copy) { /* one contiguous read of the block, then every row reads it from L1 (see top) */ \
                memcpy(kbuf, args->k_cache + offset, args->block_size * row_stride * sizeof(kv_t));      \
                memcpy(vbuf, args->v_cache + offset, args->block_size * row_stride * sizeof(kv_t));      \
            }                                                                                            \
            for (int64_t r = 0; r < rows; ++r) {                                                         \
                int64_t seen = last_pos[r] - start + 1;                                                  \
                if (seen <= 0) continue;                                                                 \
                if (seen > args->block_size) seen = args->block_size;                                    \
                const kv_t *kb = copy ? kbuf + kv_offset[r] : args->k_cache + offset + kv_offset[r];     \
                const kv_t *vb = copy ? vbuf + kv_offset[r] : args->v_cache + offset + kv_offset[r];     \
                dots_##NV(q_rows[r], kb, row_stride, seen, args->scale, nv, scores);                     \
                const float correction = softmax_block(scores, seen, &row_max[r], &row_sum[r]);          \
                axpys_##NV(acc[r], correction, scores, vb, row_stride, seen, nv);                        \
            }                                                                                            \
        }                                                                                                \
        for (int64_t r = 0; r < rows; ++r) {                                                             \
            const int64_t j = item.first_query + r / heads;                                              \
            const int64_t head = item.first_kv_head * group + r % heads;                                 \
            act_t *o = args->out + ((token0 + j) * args->num_q_heads + head) * head_dim;                 \
            const vf inv = splat(1.0f / row_sum[r]);                                                     \
            for (int64_t i = 0; i < nv; ++i) store_act(o + i * LANES, load(acc[r] + i * LANES) * inv);   \
        }                                                                                                \
    }

TILE(8)  /* head_dim 64 */
TILE(16) /* head_dim 128 */
TILE(0)  /* any other multiple of 8 up to 256 */

/* The metadata promises of the op, checked before any memory is touched: queries within the context, the
 * context within the block table, block ids within the cache. */
static int valid_metadata(const int32_t *block_tables, int64_t max_blocks, const int32_t *seq_lens,
                          const int32_t *query_start_loc, const int32_t *seq_ids, int64_t num_seq_ids,
                          int64_t num_blocks, int64_t block_size) {
    for (int64_t i = 0; i < num_seq_ids; ++i) {
        const int32_t s = seq_ids[i], n = query_start_loc[s + 1] - query_start_loc[s], len = seq_lens[s];
        if (n < 0 || len < n || (n > 0 && len < 1) || (len + block_size - 1) / block_size > max_blocks) return 0;
        for (int64_t b = 0; b < (len + block_size - 1) / block_size; ++b) {
            const int32_t block = block_tables[s * max_blocks + b];
            if (block < 0 || block >= num_blocks) return 0;
        }
    }
    return 1;
}

/* Attention of the sequences listed in seq_ids. Returns 0; -1 if a size is outside the compiled limits (the
 * caller falls back to torch); -2 if the metadata breaks the op's contract (nothing is read or written). */
int paged_attention(const act_t *q, act_t *out, const kv_t *k_cache, const kv_t *v_cache, int64_t num_blocks,
                    const int32_t *block_tables, int64_t max_blocks, const int32_t *seq_lens,
                    const int32_t *query_start_loc, const int32_t *seq_ids, int64_t num_seq_ids,
                    int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                    float scale, int64_t num_threads) {
    const int64_t group = num_q_heads / num_kv_heads;
    if (group > MAX_ROWS || head_dim % LANES || head_dim > MAX_VECS * LANES || block_size > MAX_BLOCK_SIZE)
        return -1;
    if (!valid_metadata(block_tables, max_blocks, seq_lens, query_start_loc, seq_ids, num_seq_ids, num_blocks,
                        block_size))
        return -2;
    const Args args = {q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc,
                       max_blocks, num_q_heads, num_kv_heads, block_size, scale};
    /* Few sequences: one kv head per item so every thread has work. Many: all heads of a sequence in one
     * item, so each block is read as one contiguous stream. */
    const int32_t heads_per_item = num_seq_ids >= 4 * num_threads && group * num_kv_heads <= MAX_ROWS
                                       ? (int32_t)num_kv_heads : 1;
    const int32_t tile = MAX_ROWS / (group * heads_per_item);
    int64_t num_items = 0;
    for (int64_t i = 0; i < num_seq_ids; ++i) {
        const int32_t s = seq_ids[i];
        num_items += (num_kv_heads / heads_per_item) *
                     ((query_start_loc[s + 1] - query_start_loc[s] + tile - 1) / tile);
    }
    WorkItem *items = malloc((num_items > 0 ? num_items : 1) * sizeof(WorkItem));
    if (items == NULL) return -1;
    int64_t next = 0;
    for (int64_t i = 0; i < num_seq_ids; ++i) {
        const int32_t s = seq_ids[i], n = query_start_loc[s + 1] - query_start_loc[s];
        for (int32_t first = 0; first < n; first += tile)
            for (int32_t h = 0; h < num_kv_heads; h += heads_per_item)
                items[next++] = (WorkItem){s, h, heads_per_item, first, n - first < tile ? n - first : tile};
    }
    const int64_t nv = head_dim / LANES;
#pragma omp parallel for schedule(dynamic, 4) num_threads(num_threads)
    for (int64_t i = 0; i < num_items; ++i) {
        if (nv == 8)
            tile_8(&args, items[i], nv);
        else if (nv == 16)
            tile_16(&args, items[i], nv);
        else
            tile_0(&args, items[i], nv);
    }
    free(items);
    return 0;
}
