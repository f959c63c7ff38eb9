/* Paged attention for CPUs: reads K/V in place from the block pool (no gather of the context). q and out are
 * act_t, the caches kv_t (float32 or bfloat16 each, see vec8.h); scores, softmax and sums are float32.
 *
 * Why C and not torch: torch has no op that indexes a paged cache inside a matmul, and gathering the context
 * every layer costs more than the model's weight GEMMs on this class of machine (see DESIGN.md). This loop
 * reads each sequence's K/V once per kv head with an online softmax, so decode attention runs near memory speed.
 *
 * Work item = (sequence, kv head, tile of query tokens). Rows of a tile = its queries x the q heads of the kv
 * head's group; the block's keys stay in L1 while every row uses them. An item that holds every kv head of its
 * sequence (decode, many sequences) first copies each step's K and V to the stack, one contiguous read a block:
 * the rows' head-strided reads straight from the pool ran decode attention 17-20% slower on a KV cache that does
 * not fit in the L3 (SmolLM2, 64 sequences, bf16, 2-core AMD EPYC VM); bf16 K read in place 16-key run by run was
 * slower too (2026-12-07, Zen 4 VM: 17.2-19.1 against 16.4-17.1 ms a step over 30 layers), while an fp32 step that
 * lies inside one block is read where it is (the same from memory, faster from the L3). Causal: query j of a
 * sequence with n queries and context length L sits at position L - n + j and sees positions 0..L - n + j.
 *
 * Written with GCC/Clang vector extensions (8 floats), so -march=native picks AVX2/AVX-512 on x86 and NEON on
 * ARM. head_dim must be a multiple of 8; the caller falls back to torch otherwise (return value -1). bf16 q and KV
 * with head_dim a multiple of 32 take a path of AVX512-BF16 dot products where the CPU has them (tile_dp below), an
 * int8 cache one of integer products (VNNI) beside them.
 */
#define _GNU_SOURCE /* syscall(), for the AMX tile state */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec8.h"

#define MAX_ROWS 32
#define MAX_VECS 32 /* head_dim <= 256 */
#define MAX_BLOCK_SIZE 256
#define COPY_BYTES 16384 /* K (and V) of one step an item copies to the stack: both stay in L1 */
#define COPY_ELEMENTS (COPY_BYTES / 2) /* the most elements of them (bf16) */

typedef struct {
    int32_t seq, first_kv_head, num_kv_heads, first_query, num_queries, amx; /* amx: run by tile_amx */
    int64_t cost; /* keys times rows, about: the order items are handed out in, largest first */
} WorkItem;

static int larger_cost_first(const void *a, const void *b) {
    const int64_t x = ((const WorkItem *)a)->cost, y = ((const WorkItem *)b)->cost;
    return (x < y) - (x > y);
}

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
                                  int64_t stride, int64_t n, int64_t nv_rt, Fetcher *fetch) {            \
        const int64_t nv = NV > 0 ? NV : nv_rt;                                                          \
        vf a[NV > 0 ? NV : MAX_VECS];                                                                    \
        for (int64_t i = 0; i < nv; ++i) a[i] = load(acc + i * LANES) * splat(correction);               \
        for (int64_t t = 0; t < n; ++t) {                                                                \
            fetch_tick(fetch);                                                                           \
            const vf pt = splat(p[t]);                                                                   \
            for (int64_t i = 0; i < nv; ++i) a[i] += pt * load_kv(v + t * stride + i * LANES);           \
        }                                                                                                \
        for (int64_t i = 0; i < nv; ++i) store(acc + i * LANES, a[i]);                                   \
    }

/* Online softmax over one block for one row: exponentiate s[0..n) in place, return the correction factor. */
static inline float softmax_block(float *s, int64_t n, float *row_max, float *row_sum) {
    const int64_t padded = (n + LANES - 1) / LANES * LANES;
    for (int64_t t = n; t < padded; ++t) s[t] = -INFINITY;
    vf m = splat(*row_max); /* a vector max: the scalar loop was one long dependency chain */
    for (int64_t t = 0; t < padded; t += LANES) m = vmax(m, load(s + t));
    float block_max = m[0];
    for (int i = 1; i < LANES; ++i) block_max = m[i] > block_max ? m[i] : block_max;
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

/* The lines of the `step` keys from position `from` (at most to `last`) as offsets into either cache (K and V share
 * them): `span` elements from `first` of rows `stride` apart, whole runs of a block when the span is the row; at most
 * MAX_STEP_LINES (what is past it is not fetched ahead). Listed once a step, while the rows compute on the step
 * before, and fetched into L2 (locality 1) a few at a time along the rows' own loops (Fetcher): a step's lines (384
 * for SmolLM2's decode in bf16) overflow the miss buffers, and asked for all at once they stalled the loads behind
 * them so that memory and arithmetic took turns (decode from a KV cache larger than the L3, SmolLM2, 64 sequences,
 * bf16, 2-core AMD EPYC Zen 4: 0.95 -> 0.67 ms a layer with a slice at each row's start; fetching 2 blocks ahead or
 * into L1, no better). */
#define MAX_STEP_LINES 520 /* a step's K: COPY_BYTES in lines (256 in bf16), plus one a key where runs are short */
static inline int64_t list_step_lines(const Args *args, const int32_t *table, int64_t from, int64_t last,
                                      int64_t first, int64_t span, int64_t stride, int64_t step, int64_t *lines) {
    const int64_t block_size = args->block_size, block_stride = block_size * stride, line = 64 / sizeof(kv_t);
    const int64_t end = from + step <= last + 1 ? from + step : last + 1;
    int64_t count = 0;
    for (int64_t t = from, run; t < end; t += run) {
        run = block_size - t % block_size;
        if (run > end - t) run = end - t;
        const int64_t at = (int64_t)table[t / block_size] * block_stride + (t % block_size) * stride + first;
        const int64_t rows = span == stride ? 1 : run, row_elements = span == stride ? run * span : span;
        /* int8 rows (head_dim + 4 bytes) start anywhere in a line: one more line covers the row's end */
        const int64_t per_row = (row_elements + line - 1) / line + (sizeof(kv_t) == 1);
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < per_row && count < MAX_STEP_LINES; ++c) lines[count++] = at + r * stride + c * line;
    }
    return count;
}

/* The listed lines of the next step, issued a few at a time: `ticks` calls of fetch_tick issue all `count` of them,
 * evenly; fetch_rest what is left (rows that saw fewer keys ticked less). */
typedef struct {
    const kv_t *k, *v;
    const int64_t *lines;
    int64_t count, done, due, ticks;
} Fetcher;

static inline void fetch_tick(Fetcher *f) {
    for (f->due += f->count; f->due >= f->ticks; f->due -= f->ticks, ++f->done) {
        __builtin_prefetch(f->k + f->lines[f->done], 0, 1);
        __builtin_prefetch(f->v + f->lines[f->done], 0, 1);
    }
}

static inline void fetch_rest(Fetcher *f) {
    for (; f->done < f->count; ++f->done) {
        __builtin_prefetch(f->k + f->lines[f->done], 0, 1);
        __builtin_prefetch(f->v + f->lines[f->done], 0, 1);
    }
}

/* `n` keys from position `pos` of one cache (`span` elements from `first` of rows `stride` apart) into buf, `span`
 * apart: whole runs of a block in one read each when the span is the whole row. */
static inline void copy_step(const Args *args, const kv_t *cache, const int32_t *table, int64_t pos, int64_t n,
                             int64_t first, int64_t span, int64_t stride, kv_t *buf) {
    const int64_t block_size = args->block_size, block_stride = block_size * stride;
    for (int64_t t = 0, run; t < n; t += run) {
        run = span == stride ? block_size - (pos + t) % block_size : 1;
        if (run > n - t) run = n - t;
        const int64_t at = (int64_t)table[(pos + t) / block_size] * block_stride + ((pos + t) % block_size) * stride +
                           first;
        memcpy(buf + t * span, cache + at, run * span * sizeof(kv_t));
    }
}

/* Where the item's span of position p starts in the caches. */
#define KV_AT(p) ((int64_t)block_table[(p) / block_size] * block_stride + ((p) % block_size) * row_stride + first)

/* An item walks its context in steps of COPY_BYTES of K (at most MAX_BLOCK_SIZE keys): the step's K and V copied to
 * the stack (whole runs of a block in one read when the item holds every kv head: the rows' head-strided reads
 * straight from the pool ran decode attention 17-20% slower on a KV cache larger than the L3), then each row takes
 * the whole step: its scores, one softmax, one P.V. A row pays its fixed costs once a step, not once a block: fp32
 * prefill of 4 prompts of 200 tokens 1.83 -> 1.45 ms a layer (SmolLM2 shapes, 2-core AMD EPYC Zen 5, C harness),
 * decode as before (steps of 16 keys there, a block: K and V of larger steps fell out of L1 and ran slower). The
 * next step's lines are fetched along the rows' P.V, one tick a key. */
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
        const int64_t block_size = args->block_size, block_stride = block_size * row_stride;             \
        const int64_t seq_len = args->seq_lens[item.seq], token0 = args->query_start_loc[item.seq];      \
        const int64_t num_queries = args->query_start_loc[item.seq + 1] - token0;                        \
        const int32_t *block_table = args->block_tables + item.seq * args->max_blocks;                   \
        const int64_t span = item.num_kv_heads * head_dim, first = item.first_kv_head * head_dim;        \
        int64_t step = COPY_BYTES / (int64_t)sizeof(kv_t) / span; /* keys a step: what the buffers hold */ \
        step = step > MAX_BLOCK_SIZE ? MAX_BLOCK_SIZE : step >= LANES ? step / LANES * LANES : step > 0 ? step : 1; \
        float acc[MAX_ROWS][NV > 0 ? NV * LANES : MAX_VECS * LANES];                                     \
        float scores[MAX_BLOCK_SIZE + LANES];                                                            \
        float row_max[MAX_ROWS], row_sum[MAX_ROWS];                                                      \
        int64_t last_pos[MAX_ROWS], kv_offset[MAX_ROWS];                                                 \
        const act_t *q_rows[MAX_ROWS];                                                                   \
        for (int64_t r = 0; r < rows; ++r) {                                                             \
            const int64_t j = item.first_query + r / heads;                                              \
            const int64_t head = item.first_kv_head * group + r % heads;                                 \
            q_rows[r] = args->q + ((token0 + j) * args->num_q_heads + head) * head_dim;                  \
            kv_offset[r] = (head / group) * head_dim - first; /* within the item's span */               \
            last_pos[r] = seq_len - num_queries + j;                                                     \
            row_max[r] = -INFINITY, row_sum[r] = 0.0f;                                                   \
            memset(acc[r], 0, head_dim * sizeof(float));                                                 \
        }                                                                                                \
        const int64_t tile_last = last_pos[rows - 1];                                                    \
        kv_t kbuf[COPY_ELEMENTS], vbuf[COPY_ELEMENTS];                                                   \
        int64_t fetch_lines[MAX_STEP_LINES];                                                             \
        for (int64_t pos = 0; pos <= tile_last; pos += step) {                                           \
            const int64_t n = tile_last - pos + 1 < step ? tile_last - pos + 1 : step;                   \
            const int64_t next = pos + step <= tile_last ? pos + step : -1;                              \
            /* a step inside one block of an item holding every kv head is contiguous in the pool already: \
             * read in place (from the L3: 64 sequences' decode 24-25 -> 20-22 ms over 30 layers, the same \
             * from memory, Zen 4 VM); else copied to the stack */                                      \
            const kv_t *keys = kbuf, *values = vbuf;                                                     \
            if (span == row_stride && pos / block_size == (pos + n - 1) / block_size) {                  \
                keys = args->k_cache + KV_AT(pos), values = args->v_cache + KV_AT(pos);                  \
            } else {                                                                                     \
                copy_step(args, args->k_cache, block_table, pos, n, first, span, row_stride, kbuf);       \
                copy_step(args, args->v_cache, block_table, pos, n, first, span, row_stride, vbuf);       \
            }                                                                                            \
            Fetcher fetch = {args->k_cache, args->v_cache, fetch_lines, 0, 0, 0, rows * n}; /* a tick a key */ \
            if (next >= 0)                                                                               \
                fetch.count = list_step_lines(args, block_table, next, tile_last, first, span, row_stride, step, \
                                              fetch_lines);                                              \
            for (int64_t r = 0; r < rows; ++r) {                                                         \
                int64_t seen = last_pos[r] - pos + 1;                                                    \
                if (seen <= 0) continue;                                                                 \
                if (seen > n) seen = n;                                                                  \
                dots_##NV(q_rows[r], keys + kv_offset[r], span, seen, args->scale, nv, scores);          \
                const float correction = softmax_block(scores, seen, &row_max[r], &row_sum[r]);          \
                axpys_##NV(acc[r], correction, scores, values + kv_offset[r], span, seen, nv, &fetch);   \
            }                                                                                            \
            fetch_rest(&fetch);                                                                          \
        }                                                                                                \
        for (int64_t r = 0; r < rows; ++r) {                                                             \
            const int64_t j = item.first_query + r / heads;                                              \
            const int64_t head = item.first_kv_head * group + r % heads;                                 \
            act_t *o = args->out + ((token0 + j) * args->num_q_heads + head) * head_dim;                 \
            const vf inv = splat(1.0f / row_sum[r]);                                                     \
            for (int64_t i = 0; i < nv; ++i) store_act(o + i * LANES, load(acc[r] + i * LANES) * inv);   \
        }                                                                                                \
    }

#ifndef KV_INT8 /* int8 rows are read by tile_dp alone */
TILE(8)  /* head_dim 64 */
TILE(16) /* head_dim 128 */
TILE(0)  /* any other multiple of 8 up to 256 */
#endif

#if defined(ACT_BF16) && defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    (defined(KV_BF16) || (defined(KV_INT8) && defined(__AVX512VNNI__)))
/* bf16 q and KV on a CPU with AVX512-BF16: vdpbf16ps multiplies 32 bf16 pairs and adds them into 16 float32 sums in
 * one instruction, where the loop above widens every element, then multiplies and adds it (4 uops per 8 values).
 * Decode attention from the L3 spent as long computing as reading memory (0.53 and 0.49 ms a layer, SmolLM2,
 * 64 sequences, 2-core AMD EPYC Zen 4); this path cuts the computing: 0.70 -> 0.61 ms a layer from a KV cache
 * larger than the L3, both with the spread prefetch.
 *
 * q.k: a key's head_dim products in head_dim / 32 instructions, 16 keys reduced together (hsum16). P.V: two keys at
 * a time against V copied to the stack with the two keys' values interleaved ([pair][dim][2]), so each instruction
 * adds p_t * v_t + p_t+1 * v_t+1 for 16 dims. P is split into a bf16 high part (its top 16 bits) and the bf16 of
 * the rest, each multiplied by V: P rounded to bf16 alone (FlashAttention's choice) put outputs of short contexts
 * 2e-3 off the float32 result, beyond one bf16 rounding; the split keeps 16 bits of P for 10% of the time.
 * Scores, softmax and sums stay float32. */
#define DP_KEYS 16
#define DP_STEP 256 /* the most keys of one step of tile_dp */

/* e^x on 16 lanes as 2^(x log2 e): the fraction's 2^f by a degree-5 fit on [-0.5, 0.5] (2.3e-7 relative), the
 * integer part by vscalefps; 9 operations where the 8-lane vexp's range reduction and degree-6 polynomial take 18
 * (x log2 e rounds to ~1e-6 relative at the softmax's x >= -20, far below P's 16 bits). */
static inline __m512 vexp16(__m512 x) {
    const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(1.44269504f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(1.327646547e-3f), f, _mm512_set1_ps(9.675541893e-3f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.550713465e-2f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.402212024e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.931469440e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.000000119f));
    return _mm512_scalef_ps(y, n);
}

static inline __mmask16 first_lanes(int64_t k) { return k >= 16 ? 0xffff : k <= 0 ? 0 : (__mmask16)((1u << k) - 1); }

/* Online softmax of one row over its scores s[0..n) in 16-lane steps (the 8-lane softmax_block, with its scalar
 * reductions, was a quarter of decode attention); P goes out as the bf16 high part and the bf16 of the rest, by key
 * pairs, zero past n up to a multiple of 32 keys.
 * Returns the correction of the row's earlier sums. */
static inline float softmax_split(const float *s, int64_t n, float *row_max, float *row_sum, uint32_t *high,
                                  uint32_t *low) {
    __m512 m = _mm512_set1_ps(*row_max);
    for (int64_t t = 0; t < n; t += 16) m = _mm512_mask_max_ps(m, first_lanes(n - t), m, _mm512_loadu_ps(s + t));
    const float block_max = _mm512_reduce_max_ps(m);
    const __m512 mx = _mm512_set1_ps(block_max);
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t += 32) {
        const __mmask16 m0 = first_lanes(n - t), m1 = first_lanes(n - t - 16);
        const __m512 x0 = _mm512_maskz_sub_ps(m0, _mm512_loadu_ps(s + t), mx);
        const __m512 x1 = _mm512_maskz_sub_ps(m1, _mm512_loadu_ps(s + t + 16), mx);
        __m512 p0 = _mm512_maskz_mov_ps(m0, vexp16(x0));
        __m512 p1 = _mm512_maskz_mov_ps(m1, vexp16(x1));
        sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
        const __m512 h0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(p0), top));
        const __m512 h1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(p1), top));
        _mm512_storeu_si512(high + t / 2, (__m512i)_mm512_cvtne2ps_pbh(h1, h0));
        _mm512_storeu_si512(low + t / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(p1, h1), _mm512_sub_ps(p0, h0)));
    }
    const float correction = expf(*row_max - block_max); /* 0 on the row's first keys: row_max = -inf */
    *row_sum = *row_sum * correction + _mm512_reduce_add_ps(sum);
    *row_max = block_max;
    return correction;
}


/* The values of two keys (span elements each; the second missing when NULL) interleaved: out[2d] = v0[d],
 * out[2d+1] = v1[d]. span is a multiple of 32. */
static inline void interleave_pair(bf16 *out, const bf16 *v0, const bf16 *v1, int64_t span) {
    static const uint16_t order[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                       8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i low = _mm512_loadu_si512(order), high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
    for (int64_t d = 0; d < span; d += 32) {
        const __m512i x = _mm512_loadu_si512(v0 + d);
        const __m512i y = v1 == NULL ? _mm512_setzero_si512() : _mm512_loadu_si512(v1 + d);
        _mm512_storeu_si512(out + 2 * d, _mm512_permutex2var_epi16(x, low, y));
        _mm512_storeu_si512(out + 2 * d + 32, _mm512_permutex2var_epi16(x, high, y));
    }
}

#ifdef KV_INT8
#define KV_ROW(head_dim) ((head_dim) + KV_SCALE_BYTES)
#define KV_SCALES 768 /* an item's scales of one step: heads x step rounded up to 16 (<= 256 + 15 x MAX_ROWS) */
#define I16_MAX 32767.0f

/* n int8 values (a multiple of 32) widened to int16. */
static inline void int8_to_int16(int16_t *out, const int8_t *in, int64_t n) {
    for (int64_t d = 0; d < n; d += 32)
        _mm512_storeu_si512(out + d, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(in + d))));
}

/* The int8 build's copy of a step (kernels/kv_int8.py's rows): the n keys' K values to kbuf and V's to vbuf by key
 * pairs, laid out as the bf16 build's copy lays them out, widened to int16; each row's scale to
 * k_scales/v_scales[kh * scale_stride + t], for the scores and for P. */
static inline void widen_step(const Args *args, const int32_t *table, int64_t pos, int64_t n, int64_t first,
                              int64_t heads, int64_t head_dim, int64_t row_stride, int64_t scale_stride,
                              int16_t *kbuf, int16_t *vbuf, float *k_scales, float *v_scales) {
    const int64_t row = KV_ROW(head_dim), span = heads * head_dim;
    const int64_t block_size = args->block_size, block_stride = block_size * row_stride;
    int16_t v0[MAX_VECS * LANES], v1[MAX_VECS * LANES];
    for (int64_t t = 0; t < n; t += 2) {
        const int64_t at0 = (int64_t)table[(pos + t) / block_size] * block_stride +
                            ((pos + t) % block_size) * row_stride + first;
        const int64_t at1 = t + 1 < n ? (int64_t)table[(pos + t + 1) / block_size] * block_stride +
                                            ((pos + t + 1) % block_size) * row_stride + first
                                      : -1;
        for (int64_t kh = 0; kh < heads; ++kh) {
            const int8_t *k0 = args->k_cache + at0 + kh * row, *x0 = args->v_cache + at0 + kh * row;
            int8_to_int16(kbuf + t * span + kh * head_dim, k0, head_dim);
            int8_to_int16(v0, x0, head_dim);
            memcpy(k_scales + kh * scale_stride + t, k0 + head_dim, sizeof(float));
            memcpy(v_scales + kh * scale_stride + t, x0 + head_dim, sizeof(float));
            if (at1 >= 0) {
                const int8_t *k1 = args->k_cache + at1 + kh * row, *x1 = args->v_cache + at1 + kh * row;
                int8_to_int16(kbuf + (t + 1) * span + kh * head_dim, k1, head_dim);
                int8_to_int16(v1, x1, head_dim);
                memcpy(k_scales + kh * scale_stride + t + 1, k1 + head_dim, sizeof(float));
                memcpy(v_scales + kh * scale_stride + t + 1, x1 + head_dim, sizeof(float));
            }
            interleave_pair((bf16 *)vbuf + t * span + 2 * kh * head_dim, (const bf16 *)v0,
                            at1 >= 0 ? (const bf16 *)v1 : NULL, head_dim); /* 16-bit lanes: same moves */
        }
    }
}

/* head_dim bf16 values (a multiple of 32) to int16 at out, x = out * the returned scale (max |x| / 32767: 15
 * significant bits against bf16's 8; 0 for an all-zero row). */
static inline float quantize_q(int16_t *out, const bf16 *q, int64_t head_dim) {
    __m512 m = _mm512_setzero_ps();
    for (int64_t d = 0; d < head_dim; d += 16)
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_castsi512_ps(_mm512_slli_epi32(
                                 _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(q + d))), 16))));
    const float top = _mm512_reduce_max_ps(m), f = top > 0.0f ? I16_MAX / top : 0.0f;
    for (int64_t d = 0; d < head_dim; d += 16) {
        const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(q + d))), 16));
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(f)));
        _mm256_storeu_si256((__m256i *)(out + d), _mm512_cvtsepi32_epi16(v));
    }
    return top / I16_MAX;
}

/* hsum16 on int32 sums (exact). */
static inline __m512i hsum16_epi32(const __m512i a[16]) {
#define PS(x) _mm512_castsi512_ps(x)
#define PI(x) _mm512_castps_si512(x)
    __m512i b[8], c[4], d[2];
    for (int i = 0; i < 8; ++i)
        b[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(a[2 * i], a[2 * i + 1], 0x44),
                                _mm512_shuffle_i32x4(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; ++i)
        c[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(b[2 * i], b[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(b[2 * i], b[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i)
        d[i] = _mm512_add_epi32(PI(_mm512_shuffle_ps(PS(c[2 * i]), PS(c[2 * i + 1]), 0x44)),
                                PI(_mm512_shuffle_ps(PS(c[2 * i]), PS(c[2 * i + 1]), 0xEE)));
    const __m512i e = _mm512_add_epi32(PI(_mm512_shuffle_ps(PS(d[0]), PS(d[1]), 0x88)),
                                       PI(_mm512_shuffle_ps(PS(d[0]), PS(d[1]), 0xDD)));
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), e);
#undef PS
#undef PI
}

/* Online softmax of one row over its scores s[0..n) (softmax_split's), P times each key's V scale quantized to int16
 * against the step's largest (15 bits, where softmax_split keeps 16 of P), by key pairs, zero past n up to a multiple
 * of 32 keys; *factor turns the step's integer P.V back (the largest over 32767). Returns the correction of the
 * row's earlier sums. */
static inline float softmax_i16(float *s, int64_t n, float *row_max, float *row_sum, uint32_t *pairs,
                                const float *v_scales, float *factor) {
    __m512 m = _mm512_set1_ps(*row_max);
    for (int64_t t = 0; t < n; t += 16) m = _mm512_mask_max_ps(m, first_lanes(n - t), m, _mm512_loadu_ps(s + t));
    const float block_max = _mm512_reduce_max_ps(m);
    const __m512 mx = _mm512_set1_ps(block_max);
    __m512 sum = _mm512_setzero_ps(), top = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t += 32) {
        const __mmask16 m0 = first_lanes(n - t), m1 = first_lanes(n - t - 16);
        const __m512 x0 = _mm512_maskz_sub_ps(m0, _mm512_loadu_ps(s + t), mx);
        const __m512 x1 = _mm512_maskz_sub_ps(m1, _mm512_loadu_ps(s + t + 16), mx);
        const __m512 p0 = _mm512_maskz_mov_ps(m0, vexp16(x0));
        const __m512 p1 = _mm512_maskz_mov_ps(m1, vexp16(x1));
        sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
        /* plain loads, masked after: masked loads from memory were slow on the Zen 5 VM (lora.c's expand) */
        const __m512 w0 = _mm512_mul_ps(p0, _mm512_maskz_mov_ps(m0, _mm512_loadu_ps(v_scales + t)));
        const __m512 w1 = _mm512_mul_ps(p1, _mm512_maskz_mov_ps(m1, _mm512_loadu_ps(v_scales + t + 16)));
        top = _mm512_max_ps(top, _mm512_max_ps(w0, w1));
        _mm512_storeu_ps(s + t, w0);
        _mm512_storeu_ps(s + t + 16, w1);
    }
    const float largest = _mm512_reduce_max_ps(top), f = largest > 0.0f ? I16_MAX / largest : 0.0f;
    const __m512 scale = _mm512_set1_ps(f);
    for (int64_t t = 0; t < n; t += 32) {
        const __m256i a = _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(s + t), scale)));
        const __m256i b = _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(s + t + 16), scale)));
        _mm512_storeu_si512(pairs + t / 2, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
    }
    *factor = largest / I16_MAX;
    const float correction = expf(*row_max - block_max); /* 0 on the row's first keys: row_max = -inf */
    *row_sum = *row_sum * correction + _mm512_reduce_add_ps(sum);
    *row_max = block_max;
    return correction;
}
#else
#define KV_ROW(head_dim) (head_dim)
#endif


/* What tile_dp and the int8 build's tile share: an item's shapes (DP_ITEM), its rows' positions and sums
 * (DP_ROWS), a step's keys and the next step's lines listed for the Fetcher (DP_STEP_FETCH), the rows' outputs
 * (DP_ROWS_OUT). */
#define DP_ITEM(NZ)                                                                                      \
        const int64_t nz = NZ > 0 ? NZ : nz_rt, head_dim = nz * 32;                                      \
        const int64_t group = args->num_q_heads / args->num_kv_heads;                                    \
        const int64_t heads = item.num_kv_heads * group;                                                 \
        const int64_t rows = item.num_queries * heads;                                                   \
        if (rows <= 0) return;                                                                           \
        const int64_t kv_row = KV_ROW(head_dim), row_stride = args->num_kv_heads * kv_row;               \
        const int64_t seq_len = args->seq_lens[item.seq], token0 = args->query_start_loc[item.seq];      \
        const int64_t num_queries = args->query_start_loc[item.seq + 1] - token0;                        \
        const int32_t *block_table = args->block_tables + item.seq * args->max_blocks;                   \
        const int64_t span = item.num_kv_heads * head_dim, first = item.first_kv_head * kv_row;          \
        const int64_t kv_span = item.num_kv_heads * kv_row; /* the span's elements in the caches */     \
        int64_t step = COPY_ELEMENTS / span; /* keys a step: what the buffers hold, in whole 32s if it can */ \
        step = step > DP_STEP ? DP_STEP : step >= 32 ? step / 32 * 32 : step > 0 ? step : 1;
#define DP_ROWS()                                                                                        \
        float row_max[MAX_ROWS], row_sum[MAX_ROWS];                                                      \
        int64_t last_pos[MAX_ROWS];                                                                      \
        for (int64_t r = 0; r < rows; ++r) {                                                             \
            last_pos[r] = seq_len - num_queries + item.first_query + r / heads;                          \
            row_max[r] = -INFINITY, row_sum[r] = 0.0f;                                                   \
            memset(acc[r], 0, head_dim * sizeof(float));                                                 \
        }                                                                                                \
        const int64_t tile_last = last_pos[rows - 1];
#define DP_STEP_FETCH()                                                                                  \
            const int64_t n = tile_last - pos + 1 < step ? tile_last - pos + 1 : step;                   \
            const int64_t next = pos + step <= tile_last ? pos + step : -1;                              \
            /* the next step's lines, a few each pair of keys a row multiplies: asked for at once (a slice \
             * at each row's start), they filled the miss queue and stalled the loads behind them */       \
            Fetcher fetch = {args->k_cache, args->v_cache, fetch_lines, 0, 0, 0, rows * ((n + 1) / 2)};    \
            if (next >= 0) /* ticks: the pairs of keys the rows take this step */                        \
                fetch.count = list_step_lines(args, block_table, next, tile_last, first, kv_span, row_stride, step, \
                                              fetch_lines);
#define DP_ROWS_OUT()                                                                                    \
        for (int64_t r = 0; r < rows; ++r) {                                                             \
            const int64_t j = item.first_query + r / heads;                                              \
            const int64_t head = item.first_kv_head * group + r % heads;                                 \
            act_t *out = args->out + ((token0 + j) * args->num_q_heads + head) * head_dim;               \
            const vf inv = splat(1.0f / row_sum[r]);                                                     \
            for (int64_t i = 0; i < 4 * nz; ++i) store_act(out + i * LANES, load(acc[r] + i * LANES) * inv); \
        }

/* An item walks its context in steps of COPY_ELEMENTS / span keys (32 for a decode item of SmolLM2's three kv heads,
 * 128 for one kv head of a prefill tile): the step's K copied to the stack (whole runs of a block in one read when
 * the item holds every kv head) and its V interleaved by key pairs, both in L1; then kv head by kv head, each row
 * takes the whole step at once: its scores, one softmax, then P.V with the sums in registers. A row pays its fixed
 * costs (the softmax's reductions, loading and rescaling its sums) once a step, not once a block of 16 keys. In a
 * C harness (SmolLM2 shapes, bf16, 2-core AMD EPYC Zen 5): decode of 64 sequences of 200 tokens 0.337 -> 0.305 ms
 * from the L3 and 0.483 -> 0.432 from memory (30 layers' caches); prefill of 4 prompts of 200 tokens 1.83 -> 0.94
 * ms, its tiles of 30 rows sharing each 128-key step. The next step's lines are listed once and fetched along the
 * rows' P.V loops, a few per pair of keys: a slice at each row's start (the lines counted out with a division each)
 * took decode of 64 sequences of ~230 tokens, 30 layers' caches, 0.61 -> 0.55 ms a layer, and 0.49 -> 0.42 from the
 * L3 (2-vCPU Zen 4 VM, 2026-12-07); issued twice as fast (or into L1) they ran slower than before. */
#define TILE_DP(NZ)                                                                                      \
    static void tile_dp_##NZ(const Args *args, WorkItem item, int64_t nz_rt) {                           \
        DP_ITEM(NZ);                                                                                     \
        const int64_t block_size = args->block_size, block_stride = block_size * row_stride;             \
        float acc[MAX_ROWS][NZ > 0 ? NZ * 32 : MAX_VECS * LANES];                                        \
        float scores[DP_STEP + 2 * DP_KEYS];                                                             \
        uint32_t high[DP_STEP / 2 + DP_KEYS], low[DP_STEP / 2 + DP_KEYS];                                \
        DP_ROWS();                                                                                       \
        bf16 kbuf[COPY_ELEMENTS], vbuf[2 * COPY_ELEMENTS]; /* V by pairs: an odd step's last pair is padded */ \
        int64_t fetch_lines[MAX_STEP_LINES];                                                             \
        for (int64_t pos = 0; pos <= tile_last; pos += step) {                                           \
            DP_STEP_FETCH();                                                                             \
            copy_step(args, args->k_cache, block_table, pos, n, first, span, row_stride, (kv_t *)kbuf);     \
            for (int64_t t = 0; t < n; t += 2)                                                           \
                interleave_pair(vbuf + t * span, (const bf16 *)(args->v_cache + KV_AT(pos + t)),         \
                                t + 1 < n ? (const bf16 *)(args->v_cache + KV_AT(pos + t + 1)) : NULL, span); \
            for (int64_t kh = 0; kh < item.num_kv_heads; ++kh) {                                         \
                const bf16 *kh_keys = kbuf + kh * head_dim, *kh_values = vbuf + 2 * kh * head_dim;      \
                for (int64_t jq = 0; jq < item.num_queries; ++jq)                                        \
                    for (int64_t g = 0; g < group; ++g) {                                                \
                        const int64_t r = jq * heads + kh * group + g;                                   \
                        int64_t seen = last_pos[r] - pos + 1;                                            \
                        if (seen <= 0) continue;                                                         \
                        if (seen > n) seen = n;                                                          \
                        const bf16 *q = args->q + ((token0 + item.first_query + jq) * args->num_q_heads + \
                                                   (item.first_kv_head + kh) * group + g) * head_dim;     \
                        __m512bh qv[NZ > 0 ? NZ : MAX_VECS * LANES / 32];                                \
                        for (int64_t i = 0; i < nz; ++i) qv[i] = (__m512bh)_mm512_loadu_si512(q + 32 * i); \
                        for (int64_t t0 = 0; t0 < seen; t0 += DP_KEYS) {                                 \
                            __m512 a[DP_KEYS];                                                           \
                            for (int j = 0; j < DP_KEYS; ++j) {                                          \
                                a[j] = _mm512_setzero_ps();                                              \
                                if (t0 + j < seen)                                                       \
                                    for (int64_t i = 0; i < nz; ++i)                                     \
                                        a[j] = _mm512_dpbf16_ps(a[j], qv[i], (__m512bh)_mm512_loadu_si512( \
                                                                   kh_keys + (t0 + j) * span + 32 * i)); \
                            }                                                                            \
                            _mm512_storeu_ps(scores + t0, _mm512_mul_ps(hsum16(a), _mm512_set1_ps(args->scale))); \
                        }                                                                                \
                        const float correction = softmax_split(scores, seen, &row_max[r], &row_sum[r], high, low); \
                        __m512 o[NZ > 0 ? 2 * NZ : MAX_VECS * LANES / 16];                               \
                        __m512 o2[NZ > 0 ? 2 * NZ : MAX_VECS * LANES / 16];                              \
                        for (int64_t i = 0; i < 2 * nz; ++i) o[i] = _mm512_setzero_ps(), o2[i] = o[i];   \
                        for (int64_t u = 0; u < (seen + 1) / 2; ++u) {                                   \
                            const __m512bh ph = (__m512bh)_mm512_set1_epi32((int)high[u]);               \
                            const __m512bh pl = (__m512bh)_mm512_set1_epi32((int)low[u]);                \
                            fetch_tick(&fetch);                                                          \
                            for (int64_t i = 0; i < 2 * nz; ++i) {                                       \
                                const __m512bh vv = (__m512bh)_mm512_loadu_si512(kh_values + u * 2 * span + 32 * i); \
                                o[i] = _mm512_dpbf16_ps(o[i], ph, vv);                                   \
                                o2[i] = _mm512_dpbf16_ps(o2[i], pl, vv);                                 \
                            }                                                                            \
                        }                                                                                \
                        const __m512 c = _mm512_set1_ps(correction);                                     \
                        for (int64_t i = 0; i < 2 * nz; ++i)                                             \
                            _mm512_storeu_ps(acc[r] + 16 * i, _mm512_fmadd_ps(_mm512_loadu_ps(acc[r] + 16 * i), c, \
                                                                              _mm512_add_ps(o[i], o2[i]))); \
                    }                                                                                    \
            }                                                                                            \
            fetch_rest(&fetch);                                                                          \
        }                                                                                                \
        DP_ROWS_OUT();                                                                                   \
    }

/* The int8 build's tile: tile_dp's walk with integer products (AVX512-VNNI's vpdpwssd: 32 int16 pairs into 16 int32
 * sums). The step's K and V are widened to int16 (one instruction per 32 values, where the bf16 copy took seven), q
 * is quantized once per row to int16 against its largest value (15 bits against bf16's 8), and P times each key's V
 * scale is quantized per row and step to int16 against the largest of them: one pass of V where the bf16 split of P
 * takes two. The sums are exact in int32 (64 products of 32767 x 127; a step's <= 256 keys of P x V); the scales
 * and the softmax stay float32. Against the bf16 conversion it replaces (C harness, SmolLM2 shapes, 30 layers'
 * caches, 2-core AMD EPYC Zen 5, 2026-12-07): decode of 64 sequences of 150-280 tokens 9.8-10.0 -> 9.1-9.2 ms a
 * step, prefill of 15 prompts of 16-256 tokens 121-122 -> 109-111 ms. From the L3 (2 layers' caches) that decode
 * takes 0.24 ms a layer against 0.30 from memory: most of it is the tile's own arithmetic. P quantized against the
 * step's largest V scale instead (P <= 1: no reduction a row) ran decode 2-9% and prefill ~10% faster, and put
 * SmolLM2's perplexity with int8 weights and KV at +2.7% of fp32 against +0.2-0.6% (gate 3%): a row whose largest
 * weight lies in an earlier step (the first token's, often) keeps few bits of its later P. Not kept. */
#define TILE_I8(NZ)                                                                                      \
    static void tile_dp_##NZ(const Args *args, WorkItem item, int64_t nz_rt) {                           \
        DP_ITEM(NZ);                                                                                     \
        const int64_t scale_stride = (step + 15) / 16 * 16;                                              \
        float k_scales[KV_SCALES], v_scales[KV_SCALES]; /* the rows' scales: [kv head][key] */           \
        float acc[MAX_ROWS][NZ > 0 ? NZ * 32 : MAX_VECS * LANES];                                        \
        float scores[DP_STEP + 2 * DP_KEYS];                                                             \
        uint32_t pairs[DP_STEP / 2 + DP_KEYS];                                                           \
        int16_t q16[MAX_ROWS][NZ > 0 ? NZ * 32 : MAX_VECS * LANES];                                      \
        float q_scale[MAX_ROWS]; /* times the softmax scale */                                           \
        DP_ROWS();                                                                                       \
        for (int64_t r = 0; r < rows; ++r)                                                               \
            q_scale[r] = args->scale * quantize_q(q16[r], args->q + ((token0 + item.first_query + r / heads) * \
                                                  args->num_q_heads + item.first_kv_head * group + r % heads) * \
                                                  head_dim, head_dim);                                    \
        int16_t kbuf[COPY_ELEMENTS], vbuf[2 * COPY_ELEMENTS]; /* V by pairs: an odd step's last pair is padded */ \
        int64_t fetch_lines[MAX_STEP_LINES];                                                             \
        for (int64_t pos = 0; pos <= tile_last; pos += step) {                                           \
            DP_STEP_FETCH();                                                                             \
            widen_step(args, block_table, pos, n, first, item.num_kv_heads, head_dim, row_stride, scale_stride, \
                       kbuf, vbuf, k_scales, v_scales);                                                  \
            for (int64_t kh = 0; kh < item.num_kv_heads; ++kh) {                                         \
                const int16_t *kh_keys = kbuf + kh * head_dim, *kh_values = vbuf + 2 * kh * head_dim;   \
                const float *kh_k_scales = k_scales + kh * scale_stride;                                  \
                for (int64_t jq = 0; jq < item.num_queries; ++jq)                                        \
                    for (int64_t g = 0; g < group; ++g) {                                                \
                        const int64_t r = jq * heads + kh * group + g;                                   \
                        int64_t seen = last_pos[r] - pos + 1;                                            \
                        if (seen <= 0) continue;                                                         \
                        if (seen > n) seen = n;                                                          \
                        __m512i qv[NZ > 0 ? NZ : MAX_VECS * LANES / 32];                                 \
                        for (int64_t i = 0; i < nz; ++i) qv[i] = _mm512_loadu_si512(q16[r] + 32 * i);    \
                        const __m512 qs = _mm512_set1_ps(q_scale[r]);                                    \
                        for (int64_t t0 = 0; t0 < seen; t0 += DP_KEYS) {                                 \
                            __m512i a[DP_KEYS];                                                          \
                            for (int j = 0; j < DP_KEYS; ++j) {                                          \
                                a[j] = _mm512_setzero_si512();                                           \
                                if (t0 + j < seen)                                                       \
                                    for (int64_t i = 0; i < nz; ++i)                                     \
                                        a[j] = _mm512_dpwssd_epi32(a[j], qv[i], _mm512_loadu_si512(      \
                                                                       kh_keys + (t0 + j) * span + 32 * i)); \
                            }                                                                            \
                            const __m512 ks = _mm512_maskz_mov_ps(first_lanes(seen - t0),                \
                                                                  _mm512_loadu_ps(kh_k_scales + t0));    \
                            _mm512_storeu_ps(scores + t0, _mm512_mul_ps(_mm512_cvtepi32_ps(hsum16_epi32(a)), \
                                                                        _mm512_mul_ps(qs, ks)));         \
                        }                                                                                \
                        float factor;                                                                    \
                        const float correction = softmax_i16(scores, seen, &row_max[r], &row_sum[r], pairs, \
                                                             v_scales + kh * scale_stride, &factor);     \
                        __m512i o[NZ > 0 ? 2 * NZ : MAX_VECS * LANES / 16];                              \
                        __m512i o2[NZ > 0 ? 2 * NZ : MAX_VECS * LANES / 16];                             \
                        for (int64_t i = 0; i < 2 * nz; ++i) o[i] = _mm512_setzero_si512(), o2[i] = o[i]; \
                        const int64_t npairs = (seen + 1) / 2;                                           \
                        int64_t u = 0;                                                                   \
                        for (; u + 1 < npairs; u += 2) { /* two sets of sums: twice the chains in flight */ \
                            const __m512i p0 = _mm512_set1_epi32((int)pairs[u]);                         \
                            const __m512i p1 = _mm512_set1_epi32((int)pairs[u + 1]);                     \
                            fetch_tick(&fetch);                                                          \
                            fetch_tick(&fetch);                                                          \
                            const int16_t *v0 = kh_values + u * 2 * span, *v1 = v0 + 2 * span;          \
                            for (int64_t i = 0; i < 2 * nz; ++i) {                                       \
                                o[i] = _mm512_dpwssd_epi32(o[i], p0, _mm512_loadu_si512(v0 + 32 * i));  \
                                o2[i] = _mm512_dpwssd_epi32(o2[i], p1, _mm512_loadu_si512(v1 + 32 * i)); \
                            }                                                                            \
                        }                                                                                \
                        if (u < npairs) {                                                                \
                            const __m512i p0 = _mm512_set1_epi32((int)pairs[u]);                         \
                            fetch_tick(&fetch);                                                          \
                            for (int64_t i = 0; i < 2 * nz; ++i)                                         \
                                o[i] = _mm512_dpwssd_epi32(o[i], p0,                                     \
                                                           _mm512_loadu_si512(kh_values + u * 2 * span + 32 * i)); \
                        }                                                                                \
                        const __m512 c = _mm512_set1_ps(correction), f = _mm512_set1_ps(factor);         \
                        for (int64_t i = 0; i < 2 * nz; ++i)                                             \
                            _mm512_storeu_ps(acc[r] + 16 * i, _mm512_fmadd_ps(_mm512_loadu_ps(acc[r] + 16 * i), c, \
                                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(o[i], o2[i])), f)));   \
                    }                                                                                    \
            }                                                                                            \
            fetch_rest(&fetch);                                                                          \
        }                                                                                                \
        DP_ROWS_OUT();                                                                                   \
    }

#ifdef KV_INT8
TILE_I8(2) /* head_dim 64 */
TILE_I8(4) /* head_dim 128 */
TILE_I8(0) /* any other multiple of 32 up to 256 */
#else
TILE_DP(2) /* head_dim 64 */
TILE_DP(4) /* head_dim 128 */
TILE_DP(0) /* any other multiple of 32 up to 256 */
#endif
#define HAVE_DP 1
#else
#define HAVE_DP 0
#endif

#if HAVE_DP && !defined(KV_INT8) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
/* Prefill on a CPU with AMX: a work item holds one kv head and up to AMX_ROWS rows (its queries x the group's q heads),
 * walked as tiles of 16 rows against 32 keys at a time. Q.K^T and P.V are tile products (tdpbf16ps: a 16 x 16 x 32
 * product in one instruction); the online softmax runs on AVX-512 between them, in float32, and P.V takes P as a bf16
 * high part plus the bf16 of the rest, as tile_dp does (its comment says why). Prefill attention of SmolLM2
 * (10 prompts of 157 tokens, 2-core Sapphire Rapids VM) ran at 59 GFLOP/s through tile_dp: vdpbf16ps computes one
 * query row at a time, so every key's dot products end in a horizontal sum. Decode rows (one query) stay there:
 * through here (AMX_MIN_QUERIES 1) decode of 64 sequences of 200 tokens ran 1.29 ms a layer against tile_dp's
 * 0.64 (Sapphire Rapids class VM, 2026-12-05; a tile of 16 rows holds a decode item's 3).
 *
 * Tile operands: Q rows as A ([16 rows][32 of head_dim] bf16); K as B, packed per step into the pair layout tiles
 * want ([16 dim pairs][16 keys] of two bf16); the scores tile C ([16 rows][16 keys] float32); then P as A
 * ([16 rows][32 keys]), V interleaved by key pairs as B ([16 key pairs][16 dims] of two bf16) and the output rows as
 * C, kept in memory between steps (the online softmax rescales them). The tile state: amx.h. */
#define AMX_ROWS 64        /* rows of one item: four tiles of 16 */
#define AMX_KEYS 32        /* keys a step */
#define AMX_MAX_DIM 128    /* head_dim <= 128: the item's buffers live on the stack */
#define AMX_MIN_QUERIES 8  /* sequences with fewer queries this step stay on tile_dp */

#include "amx.h"

static void tile_amx(const Args *args, WorkItem item, int64_t head_dim) {
    const int64_t group = args->num_q_heads / args->num_kv_heads;
    const int64_t rows = item.num_queries * group, tiles = (rows + 15) / 16;
    if (rows <= 0) return;
    const int64_t nd = head_dim / 32, ns = head_dim / 16, pairs = head_dim / 2;
    const int64_t row_stride = args->num_kv_heads * head_dim, block_size = args->block_size;
    const int64_t block_stride = block_size * row_stride, head_offset = item.first_kv_head * head_dim;
    const int64_t seq_len = args->seq_lens[item.seq], token0 = args->query_start_loc[item.seq];
    const int64_t num_queries = args->query_start_loc[item.seq + 1] - token0;
    const int32_t *block_table = args->block_tables + item.seq * args->max_blocks;
    bf16 qbuf[AMX_ROWS * AMX_MAX_DIM] __attribute__((aligned(64)));
    float obuf[AMX_ROWS * AMX_MAX_DIM] __attribute__((aligned(64)));
    uint32_t kpack[2 * (AMX_MAX_DIM / 32) * 256] __attribute__((aligned(64))); /* [key tile][dim half][pair][key] */
    bf16 vpack[(AMX_KEYS / 2) * 2 * AMX_MAX_DIM] __attribute__((aligned(64)));  /* [key pair][dim][2] */
    float scores[16 * AMX_KEYS] __attribute__((aligned(64)));
    bf16 p_high[16 * AMX_KEYS] __attribute__((aligned(64))), p_low[16 * AMX_KEYS] __attribute__((aligned(64)));
    float row_max[AMX_ROWS], row_sum[AMX_ROWS];
    int64_t last_pos[AMX_ROWS];
    memset(qbuf, 0, tiles * 16 * head_dim * sizeof(bf16));
    memset(obuf, 0, tiles * 16 * head_dim * sizeof(float));
    for (int64_t r = 0; r < tiles * 16; ++r) {
        row_max[r] = -INFINITY, row_sum[r] = 0.0f, last_pos[r] = -1; /* padding rows see nothing */
        if (r >= rows) continue;
        const int64_t j = item.first_query + r / group, head = item.first_kv_head * group + r % group;
        memcpy(qbuf + r * head_dim, args->q + ((token0 + j) * args->num_q_heads + head) * head_dim,
               head_dim * sizeof(bf16));
        last_pos[r] = seq_len - num_queries + j;
    }
    const int64_t tile_last = last_pos[rows - 1];
    TileConfig config = {0};
    config.palette = 1;
    for (int t = 0; t < 5; ++t) config.rows[t] = 16, config.colsb[t] = 64;
    _tile_loadconfig(&config);
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t pos = 0; pos <= tile_last; pos += AMX_KEYS) {
        const int64_t n = tile_last - pos + 1 < AMX_KEYS ? tile_last - pos + 1 : AMX_KEYS;
        /* K into the pair layout, V interleaved by key pairs; keys past n as zeros (P is 0 there, V must be finite) */
        memset(vpack, 0, (AMX_KEYS / 2) * 2 * head_dim * sizeof(bf16));
        if (n < AMX_KEYS) memset(kpack, 0, 2 * nd * 256 * sizeof(uint32_t));
        for (int64_t t = 0; t < n; ++t) {
            const int64_t at = (int64_t)block_table[(pos + t) / block_size] * block_stride +
                               ((pos + t) % block_size) * row_stride + head_offset;
            const uint32_t *k = (const uint32_t *)(args->k_cache + at);
            uint32_t *kt = kpack + (t / 16) * nd * 256 + t % 16;
            for (int64_t p = 0; p < pairs; ++p) kt[(p / 16) * 256 + (p % 16) * 16] = k[p];
            const kv_t *v = args->v_cache + at;
            bf16 *vt = vpack + (t / 2) * 2 * head_dim + t % 2;
            for (int64_t d = 0; d < head_dim; ++d) vt[2 * d] = v[d];
        }
        for (int64_t tile = 0; tile < tiles; ++tile) {
            const int64_t r0 = tile * 16;
            if (last_pos[r0 + 15 < rows ? r0 + 15 : rows - 1] < pos) continue; /* every row of the tile: before pos */
            for (int64_t kt = 0; kt < (n + 15) / 16; ++kt) {
                _tile_zero(0);
                for (int64_t dh = 0; dh < nd; ++dh) {
                    _tile_loadd(2, qbuf + r0 * head_dim + 32 * dh, head_dim * sizeof(bf16));
                    _tile_loadd(4, kpack + (kt * nd + dh) * 256, 64);
                    _tile_dpbf16ps(0, 2, 4);
                }
                _tile_stored(0, scores + 16 * kt, AMX_KEYS * sizeof(float));
            }
            for (int64_t i = 0; i < 16; ++i) {
                const int64_t r = r0 + i;
                int64_t seen = last_pos[r] - pos + 1;
                if (seen > n) seen = n;
                float *s = scores + i * AMX_KEYS;
                if (seen <= 0) { /* nothing for this row in these keys: P = 0, the output unchanged */
                    memset(p_high + i * AMX_KEYS, 0, AMX_KEYS * sizeof(bf16));
                    memset(p_low + i * AMX_KEYS, 0, AMX_KEYS * sizeof(bf16));
                    continue;
                }
                const __mmask16 m0 = seen >= 16 ? 0xffff : (__mmask16)((1u << seen) - 1);
                const __mmask16 m1 = seen >= 32 ? 0xffff : seen <= 16 ? 0 : (__mmask16)((1u << (seen - 16)) - 1);
                const __m512 minus_inf = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(args->scale);
                const __m512 s0 = _mm512_mask_mov_ps(minus_inf, m0, _mm512_mul_ps(_mm512_loadu_ps(s), scale));
                const __m512 s1 = _mm512_mask_mov_ps(minus_inf, m1, _mm512_mul_ps(_mm512_loadu_ps(s + 16), scale));
                float block_max = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
                if (row_max[r] > block_max) block_max = row_max[r];
                const __m512 mx = _mm512_set1_ps(block_max);
                /* masked lanes: exp(0), then zeroed */
                const __m512 x0 = _mm512_sub_ps(_mm512_mask_mov_ps(mx, m0, s0), mx);
                const __m512 x1 = _mm512_sub_ps(_mm512_mask_mov_ps(mx, m1, s1), mx);
                const __m512 p0 = _mm512_maskz_mov_ps(m0, vexp16(x0));
                const __m512 p1 = _mm512_maskz_mov_ps(m1, vexp16(x1));
                const float correction = expf(row_max[r] - block_max); /* 0 on the row's first keys */
                row_sum[r] = row_sum[r] * correction + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
                row_max[r] = block_max;
                float *o = obuf + r * head_dim;
                const __m512 c = _mm512_set1_ps(correction);
                for (int64_t d = 0; d < head_dim; d += 16)
                    _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), c));
                const __m512 h0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(p0), top));
                const __m512 h1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(p1), top));
                _mm512_storeu_si512(p_high + i * AMX_KEYS, (__m512i)_mm512_cvtne2ps_pbh(h1, h0));
                _mm512_storeu_si512(p_low + i * AMX_KEYS,
                                    (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(p1, h1), _mm512_sub_ps(p0, h0)));
            }
            _tile_loadd(2, p_high, AMX_KEYS * sizeof(bf16));
            _tile_loadd(3, p_low, AMX_KEYS * sizeof(bf16));
            for (int64_t sl = 0; sl < ns; ++sl) {
                float *o = obuf + r0 * head_dim + 16 * sl;
                _tile_loadd(0, o, head_dim * sizeof(float));
                _tile_loadd(4, vpack + 32 * sl, 2 * head_dim * sizeof(bf16));
                _tile_dpbf16ps(0, 2, 4);
                _tile_dpbf16ps(0, 3, 4);
                _tile_stored(0, o, head_dim * sizeof(float));
            }
        }
    }
    _tile_release();
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t j = item.first_query + r / group, head = item.first_kv_head * group + r % group;
        act_t *out = args->out + ((token0 + j) * args->num_q_heads + head) * head_dim;
        const vf inv = splat(1.0f / row_sum[r]);
        for (int64_t i = 0; i < head_dim / LANES; ++i)
            store_act(out + i * LANES, load(obuf + r * head_dim + i * LANES) * inv);
    }
}
#define HAVE_AMX 1
#else
#define HAVE_AMX 0
#define AMX_MIN_QUERIES 1 /* unused: no item is an AMX one */
#endif

/* 1 when this build runs bf16 q and KV through vdpbf16ps (above), else 0: for the tests, which expect it on CPUs
 * that have the instruction. */
int paged_attention_bf16_dots(void) { return HAVE_DP; }

/* 1 when this build runs prefill through AMX tiles (tile_amx) and the OS grants the tile state, else 0. */
int paged_attention_amx(void) {
#if HAVE_AMX
    return amx_usable();
#else
    return 0;
#endif
}

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
#ifdef KV_INT8
    if (!HAVE_DP || head_dim % 32) return -1; /* int8 rows: tile_dp's shapes only */
#endif
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
#if HAVE_AMX
    /* Sequences with many queries this step (prefill) take tile_amx: one kv head an item, AMX_ROWS rows. */
    const int amx = head_dim % 32 == 0 && head_dim <= AMX_MAX_DIM && group <= AMX_ROWS && amx_usable();
    const int32_t amx_tile = (int32_t)(AMX_ROWS / group);
#else
    const int amx = 0;
    const int32_t amx_tile = 1;
#endif
    int64_t num_items = 0;
    for (int64_t i = 0; i < num_seq_ids; ++i) {
        const int32_t s = seq_ids[i], n = query_start_loc[s + 1] - query_start_loc[s];
        num_items += amx && n >= AMX_MIN_QUERIES ? num_kv_heads * ((n + amx_tile - 1) / amx_tile)
                                                 : (num_kv_heads / heads_per_item) * ((n + tile - 1) / tile);
    }
    WorkItem *items = malloc((num_items > 0 ? num_items : 1) * sizeof(WorkItem));
    if (items == NULL) return -1;
    int64_t next = 0;
    for (int64_t i = 0; i < num_seq_ids; ++i) {
        const int32_t s = seq_ids[i], n = query_start_loc[s + 1] - query_start_loc[s];
        const int64_t context0 = seq_lens[s] - n; /* keys before the sequence's first query */
        if (amx && n >= AMX_MIN_QUERIES) {
            for (int32_t first = 0; first < n; first += amx_tile) {
                const int32_t count = n - first < amx_tile ? n - first : amx_tile;
                for (int32_t h = 0; h < num_kv_heads; ++h)
                    items[next++] = (WorkItem){s, h, 1, first, count, 1, (context0 + first + count) * count};
            }
            continue;
        }
        for (int32_t first = 0; first < n; first += tile) {
            const int32_t count = n - first < tile ? n - first : tile;
            for (int32_t h = 0; h < num_kv_heads; h += heads_per_item)
                items[next++] = (WorkItem){s, h, heads_per_item, first, count, 0,
                                           (context0 + first + count) * count * heads_per_item};
        }
    }
    const int64_t nv = head_dim / LANES;
#ifdef KV_INT8
    (void)nv;
#endif
    /* One at a time, largest first: the thread that takes the last item finishes soon after the other. Decode of 64
     * sequences of 16-384 tokens (2-core AMD EPYC Zen 5, C harness): 0.484 -> 0.454 ms a layer from memory, 0.330 ->
     * 0.311 from the L3, one at a time against sequence order handed out in fours (in fours, a step of one sequence,
     * whose items are its kv heads, went to one thread). Largest first read the same there (0.455, 0.317); it is for
     * steps that mix a prompt's tiles, each costlier than the last, with decodes. */
    if (num_items > 1) qsort(items, num_items, sizeof(WorkItem), larger_cost_first);
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t i = 0; i < num_items; ++i) {
#if HAVE_AMX
        if (items[i].amx) {
            tile_amx(&args, items[i], head_dim);
            continue;
        }
#endif
#if HAVE_DP
        if (head_dim % 32 == 0) {
            if (head_dim == 64)
                tile_dp_2(&args, items[i], 2);
            else if (head_dim == 128)
                tile_dp_4(&args, items[i], 4);
            else
                tile_dp_0(&args, items[i], head_dim / 32);
            continue;
        }
#endif
#ifndef KV_INT8
        if (nv == 8)
            tile_8(&args, items[i], nv);
        else if (nv == 16)
            tile_16(&args, items[i], nv);
        else
            tile_0(&args, items[i], nv);
#endif
    }
    free(items);
    return 0;
}
