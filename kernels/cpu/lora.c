/* Multi-LoRA shrink and expand for CPUs: one call per projection for a whole batch of mixed adapters.
 *
 * Why C and not torch: in a decode step each projection's LoRA is a few small products per adapter (64 tokens
 * over 8 adapters at rank 16 is a few MFLOP), and torch pays tens of microseconds per op for the gathers,
 * batched products, scatters and scalings around them: about 60 ms of a decode step of SmolLM2-135M with 8
 * adapters, against under 10 ms of arithmetic. Here up to TILE consecutive tokens of one slot are a work item: the
 * slot's A or B rows are read once for all of them, and each token's h or y row is written once. On CPUs with
 * AMX-BF16, a slot with many tokens in a bf16 call runs on tiles instead (below).
 *
 * Layouts (row-major): x [tokens, in] with row stride x_stride; lora_a [slots, R, in] with R = parts * max_rank;
 * h [tokens, R] contiguous; lora_b [slots, out_total, max_rank]; y [tokens, out_total] with row stride y_stride.
 * x, y, lora_a and lora_b are act_t (float32 or bfloat16, see vec8.h: the slot buffers follow the model's dtype);
 * h, scales and every sum are float32, and y is rounded once, after its delta is added. rows[i] / slots[i],
 * i < num_rows: the token rows that have an adapter and their slots, in slot order.
 * Vectors of 8 floats (GCC/Clang vector extensions: AVX2/AVX-512 on x86, NEON on ARM); in_features, max_rank and
 * every part's size must be multiples of 8, else the functions return -1 and the caller uses torch.
 */
#define _GNU_SOURCE /* syscall(), for the AMX tile state */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec8.h"

/* Tokens come in slot order, so runs of consecutive rows share an adapter: a work item is up to TILE of them with one
 * slot, and each row of A (or B) it loads serves all of them. With one token an item, each token read the whole of
 * its A from L2 (55 KB for SmolLM2's q|k|v in bf16): q|k|v's shrink and expand for 512 tokens over 8 slots took
 * 578 us in bf16, 403 us tiled (Zen 4 VM; fp32 about the same either way). */
#define TILE 4

/* Sums of four rows' dot products with each of two tokens (acc[t * 4 + j]: token t, row j) -> out[t][0:4]. */
static inline void store_sums(const vf acc[8], float *out0, float *out1) {
    const vf sums = hsum8(acc);
    for (int j = 0; j < 4; ++j) out0[j] = sums[j], out1[j] = sums[4 + j];
}

#if defined(ACT_BF16) && defined(__AVX512BF16__)
/* bf16 x and A on a CPU with AVX512-BF16: vdpbf16ps multiplies 32 bf16 pairs into 16 float32 sums in one instruction
 * (the products of two bf16 are exact in float32, as in the loop below; the sums go in another order). A tile of
 * TILE tokens x 4 rows of A is 16 accumulators, reduced together. in_features must be a multiple of 32. The next four
 * rows are fetched meanwhile: in a decode step every slot's A comes from memory (q|k|v of 30 layers, 8 slots, 64
 * tokens, caches flushed, 2-core Sapphire Rapids VM: 0.80-1.26 -> 0.62-0.68 ms). */
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
            for (int j = 4; j < 8; ++j) _mm_prefetch((const char *)(ar + j * in_features + k), _MM_HINT_T0);
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

#if defined(__AVX512F__)
/* r[i] = column i of the 16 x 16 matrix of 32-bit elements whose row j was r[j]. */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* r[4g + c], lane L: column 4L + c of rows 4g .. 4g + 3 */
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int c = 0; c < 4; ++c) {
        const __m512i u0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), u1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee);
        const __m512i v0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
        const __m512i v1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
        t[c] = _mm512_shuffle_i32x4(u0, v0, 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(u0, v0, 0xdd);
        t[8 + c] = _mm512_shuffle_i32x4(u1, v1, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(u1, v1, 0xdd);
    }
    for (int i = 0; i < 16; ++i) r[i] = t[i];
}

/* ---- The expand on AVX-512 (every CPU that has it; AMX or not): 16 outputs x up to EXPAND_TILE tokens of one slot
 * at a time. The 16 rows of B for those outputs are transposed once (16 ranks of 16 outputs each, float32) and each
 * token's y gets sum_k h[k] * column k: FMAs against a broadcast h, no horizontal sums. The 8-float loop below pays a
 * horizontal sum per 8 outputs per token and reloads B every TILE tokens (gate|up, 8 slots of rank 16, 2-core AMD
 * EPYC Zen 4: 132 us a call at 64 tokens, 2.9 ms at 2048). */
#if defined(__AVX512BW__) && defined(__AVX512VL__) && (!defined(ACT_BF16) || defined(__AVX512BF16__))
#define HAVE_EXPAND16 1
#define EXPAND_TILE 64 /* tokens of one slot an item: each transposed block of B serves them all */
#define EXPAND_GROUP 16 /* of them side by side in registers */
#define PREFETCH_BLOCKS 4 /* blocks of 16 rows of B fetched ahead of the one transposed (2 and 8: slower) */

/* r[i] = row i of B's block (float32 bits), ranks c .. c + w - 1 (w 8 or 16, zero past it); rows past `rows` zero. */
static inline void load_b16(const act_t *b, int64_t max_rank, int64_t rows, int64_t c, int64_t w, __m512i r[16]) {
    const __mmask16 m = w == 16 ? 0xffff : 0xff;
    for (int i = 0; i < 16; ++i) {
        if (i >= rows) {
            r[i] = _mm512_setzero_si512();
            continue;
        }
#ifdef ACT_BF16
        const __m256i raw = w == 16 ? _mm256_loadu_si256((const __m256i *)(b + i * max_rank + c)) /* 2x faster */
                                    : _mm256_maskz_loadu_epi16(m, b + i * max_rank + c);
        r[i] = _mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16);
#else
        r[i] = _mm512_castps_si512(w == 16 ? _mm512_loadu_ps(b + i * max_rank + c)
                                           : _mm512_maskz_loadu_ps(m, b + i * max_rank + c));
#endif
    }
}

/* Bytes of the transposed B an item of expand_item16 needs (its `columns`): for each block of 16 outputs, max_rank
 * rounded up to 16 columns of 16 float32. */
static size_t expand_columns_bytes(int64_t max_rank, const int64_t *part_sizes, int64_t num_parts) {
    int64_t num_blocks = 0;
    for (int64_t p = 0; p < num_parts; ++p) num_blocks += (part_sizes[p] + 15) / 16;
    return (size_t)num_blocks * ((max_rank + 15) / 16 * 16) * sizeof(__m512);
}

/* The block of B's rows o .. o + valid - 1 transposed into `ranks` columns (column k, lane i: B[o + i][k]). */
static inline void transpose_block(const act_t *b, int64_t o, int64_t valid, int64_t max_rank, int64_t ranks,
                                   __m512 *cols, const act_t *b_end) {
    /* the block PREFETCH_BLOCKS ahead, a line at a time (B of a decode step's slots comes from memory) */
    const char *ahead = (const char *)(b + (o + 16 * PREFETCH_BLOCKS) * max_rank);
    for (int64_t i = 0; i < 16 * max_rank * (int64_t)sizeof(act_t); i += 64)
        if (ahead + i < (const char *)b_end) _mm_prefetch(ahead + i, _MM_HINT_T0);
    for (int64_t c = 0; c < ranks; c += 16) {
        __m512i r[16];
        load_b16(b + o * max_rank, max_rank, valid, c, max_rank - c < 16 ? max_rank - c : 16, r);
        transpose16(r); /* r[k], lane i: B[o + i][c + k] */
        for (int k = 0; k < 16; ++k) cols[c + k] = (__m512)r[k];
    }
}

/* y[row t][o .. o + valid) += scale * sum_k h[t][k] * cols[k] for the count <= EXPAND_GROUP tokens of hp. */
static inline void apply_block(act_t *y, int64_t y_stride, const int64_t *rows, const float *const *hp, int64_t count,
                               const __m512 *cols, int64_t max_rank, int64_t o, int64_t valid, __m512 scale) {
    __m512 acc[EXPAND_GROUP];
    for (int t = 0; t < EXPAND_GROUP; ++t) acc[t] = _mm512_setzero_ps();
    /* rank by rank, the tokens' sums side by side: independent chains of FMAs, not a token's 16 in a row waiting on
     * each other; each token's sum adds in rank order. With that and plain loads where a block is whole (below:
     * masked loads of bf16 were slow on the Zen 5 VM), 4 projections x 30 layers x 8 slots at 64 tokens: 10.3 -> 4.7
     * ms (shrink 2.1; 2-vCPU AMD EPYC Zen 5) */
    if (count == EXPAND_GROUP) /* a full group without the guards */
        for (int64_t k = 0; k < max_rank; ++k)
            for (int t = 0; t < EXPAND_GROUP; ++t) acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(hp[t][k]), cols[k], acc[t]);
    else if (count == 8) /* a decode step's tokens of a slot, often */
        for (int64_t k = 0; k < max_rank; ++k)
            for (int t = 0; t < 8; ++t) acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(hp[t][k]), cols[k], acc[t]);
    else
        for (int64_t k = 0; k < max_rank; ++k)
            for (int t = 0; t < EXPAND_GROUP; ++t)
                if (t < count) acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(hp[t][k]), cols[k], acc[t]);
    const __mmask16 m = valid == 16 ? 0xffff : 0xff;
    for (int64_t t = 0; t < count; ++t) { /* y rounded once, after its delta */
        act_t *yt = y + rows[t] * y_stride + o;
#ifdef ACT_BF16
        if (valid == 16) { /* plain loads and stores, as load_b16's */
            const __m256i raw = _mm256_loadu_si256((const __m256i *)yt);
            const __m512 yv = (__m512)_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16);
            _mm256_storeu_si256((__m256i *)yt, (__m256i)_mm512_cvtneps_pbh(_mm512_fmadd_ps(scale, acc[t], yv)));
            continue;
        }
        const __m512 yv = (__m512)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, yt)), 16);
        _mm256_mask_storeu_epi16(yt, m, (__m256i)_mm512_cvtneps_pbh(_mm512_fmadd_ps(scale, acc[t], yv)));
#else
        if (valid == 16) {
            _mm512_storeu_ps(yt, _mm512_fmadd_ps(scale, acc[t], _mm512_loadu_ps(yt)));
            continue;
        }
        _mm512_mask_storeu_ps(yt, m, _mm512_fmadd_ps(scale, acc[t], _mm512_maskz_loadu_ps(m, yt)));
#endif
    }
}

/* An item of n tokens of one slot. Up to EXPAND_GROUP tokens (decode: a few a slot) take each block of B as it is
 * transposed, from L1. More first transpose the whole of the slot's B into `columns` (L2), then each group of
 * tokens walks its y rows from the first output to the last: transposing block by block and giving every token its
 * 16 outputs of the block read y by columns, 32 bytes a row, with B's loads waited on between blocks (4 projections x
 * 30 layers x 8 slots, bf16, 2-core AMD EPYC Zen 4, with the prefetch: 2048 tokens 136-199 -> 89-102 ms, 256 tokens
 * 26 -> 11.4-13.8, 64 tokens 6.4-6.6 -> 4.9-5.7; one call of gate|up at 2048 tokens, warm, runs the FMAs at ~65% of
 * the core's peak). */
static void expand_item16(act_t *y, int64_t y_stride, const float *h, int64_t h_stride, const act_t *lora_b,
                          int64_t out_total, int64_t max_rank, const int64_t *part_sizes, int64_t num_parts,
                          const float *scales, const int64_t *rows, const int64_t *slots, int64_t first, int64_t n,
                          __m512 *columns) {
    const act_t *b = lora_b + slots[first] * out_total * max_rank, *b_end = b + out_total * max_rank;
    const __m512 scale = _mm512_set1_ps(scales[slots[first]]);
    const int64_t ranks = (max_rank + 15) / 16 * 16; /* a block's columns, zero past max_rank */
    const int whole = n > EXPAND_GROUP;
    if (whole) {
        int64_t block = 0, offset = 0;
        for (int64_t p = 0; p < num_parts; ++p) {
            const int64_t end = offset + part_sizes[p];
            for (int64_t o = offset; o < end; o += 16, ++block) /* valid: 8 at the end of a part of 8 mod 16 */
                transpose_block(b, o, end - o < 16 ? end - o : 16, max_rank, ranks, columns + block * ranks, b_end);
            offset = end;
        }
    }
    for (int64_t g = 0; g < n; g += EXPAND_GROUP) {
        const int64_t count = n - g < EXPAND_GROUP ? n - g : EXPAND_GROUP;
        int64_t block = 0, offset = 0;
        for (int64_t p = 0; p < num_parts; ++p) {
            const int64_t end = offset + part_sizes[p];
            const float *hp[EXPAND_GROUP];
            for (int t = 0; t < EXPAND_GROUP; ++t)
                hp[t] = h + rows[first + g + (t < count ? t : 0)] * h_stride + p * max_rank;
            for (int64_t o = offset; o < end; o += 16, ++block) {
                const int64_t valid = end - o < 16 ? end - o : 16;
                __m512 *cols = whole ? columns + block * ranks : columns;
                if (!whole) transpose_block(b, o, valid, max_rank, ranks, cols, b_end);
                apply_block(y, y_stride, rows + first + g, hp, count, cols, max_rank, o, valid, scale);
            }
            offset = end;
        }
    }
}
#endif
#endif
#ifndef HAVE_EXPAND16
#define HAVE_EXPAND16 0
#define EXPAND_TILE TILE
#endif

/* ---- AMX-BF16 (Sapphire Rapids and later): the runs of a call with many tokens of one slot.
 * Tile products need the second operand in pairs of K ("VNNI": row kk holds, for each of 16 columns, the elements
 * 2kk and 2kk + 1 of K). Each slot's A (for the shrink) or B (for the expand) is rearranged so once a call, by 16 x 16
 * transposes of 32-bit pairs, then every tile of that slot's tokens reads it:
 *   shrink: h[16 tokens][16 ranks] += x[16 tokens][32 inputs] . A^T, A packed [in/32][R/16][16 pairs][16 ranks];
 *   expand: delta[16 tokens][16 outputs] += h[16 tokens][16 ranks] . B^T, B packed [out/16][rank/16][8 pairs][16
 *   outputs], h split into a bf16 high and low part (two products) so it keeps ~16 bits, as float32 sums would.
 * Products of bf16 pairs are exact in float32 and the tiles sum in float32, as vdpbf16ps does. Measured on the
 * 2-core Sapphire Rapids VM (gate|up, 8 slots, rank 16): see kernels/cpu/lora.py. */
#if HAVE_DP && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define HAVE_AMX 1

#include "amx.h"

/* A slot with fewer tokens than this in a call stays on the vector loop: packing its weights and the tiles' fixed
 * costs outweigh the products (gate|up of 8 slots on the 2-core Sapphire Rapids VM: the shrink at 8 tokens a slot
 * 21.6 us on tiles against 14.6 on vdpbf16ps, at 16 16.7 against 26.1; the expand at 4 tokens 45.4 against 57.2,
 * at 1 37.8 against 19.8). */
#define AMX_SHRINK_ROWS 16
#define AMX_EXPAND_ROWS 4
#define UNIT_ROWS 64   /* a work unit: up to this many tokens of one slot, four tiles of 16 */

/* A [R][in] (bf16) -> packed [in/32][R/16][16 pairs kk][16 ranks] (32-bit pairs). */
static void pack_a(const bf16 *a, int64_t in_features, int64_t rank_total, uint32_t *packed) {
    const uint32_t *a32 = (const uint32_t *)a;
    const int64_t pairs = in_features / 2, blocks = rank_total / 16;
    for (int64_t c = 0; c < in_features / 32; ++c)
        for (int64_t rb = 0; rb < blocks; ++rb) {
            __m512i r[16];
            for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(a32 + (rb * 16 + i) * pairs + c * 16);
            transpose16(r);
            uint32_t *dst = packed + (c * blocks + rb) * 256;
            for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(dst + kk * 16, r[kk]);
        }
}

/* B [out][max_rank] (bf16) -> packed [out/16][max_rank/16][8 pairs kk][16 outputs]. Two blocks of 16 outputs make
 * one transpose: row i holds pairs rc*8 .. rc*8+7 of output o + i, then of output o + 16 + i (zero past the end). */
static void pack_b(const bf16 *b, int64_t out_total, int64_t max_rank, uint32_t *packed) {
    const uint32_t *b32 = (const uint32_t *)b;
    const int64_t pairs = max_rank / 2, chunks = max_rank / 16;
    for (int64_t o = 0; o < out_total; o += 32) {
        const int second = o + 16 < out_total;
        for (int64_t rc = 0; rc < chunks; ++rc) {
            __m512i r[16];
            for (int i = 0; i < 16; ++i) {
                const __m256i lo = _mm256_loadu_si256((const __m256i *)(b32 + (o + i) * pairs + rc * 8));
                const __m256i hi = second ? _mm256_loadu_si256((const __m256i *)(b32 + (o + 16 + i) * pairs + rc * 8))
                                          : _mm256_setzero_si256();
                r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            }
            transpose16(r);
            uint32_t *dst = packed + ((o / 16) * chunks + rc) * 128;
            for (int kk = 0; kk < 8; ++kk) _mm512_store_si512(dst + kk * 16, r[kk]);
            if (second) {
                dst = packed + ((o / 16 + 1) * chunks + rc) * 128;
                for (int kk = 0; kk < 8; ++kk) _mm512_store_si512(dst + kk * 16, r[8 + kk]);
            }
        }
    }
}

/* Tiles of the shrink: 0-3 sums [16 tokens][16 ranks], 4 x [16 tokens][32 inputs], 6-7 packed A [16 pairs][16]. */
static void configure_shrink(void) {
    TileConfig config = {0};
    config.palette = 1;
    for (int t = 0; t < 8; ++t) config.rows[t] = 16, config.colsb[t] = 64;
    _tile_loadconfig(&config);
}

/* Tiles of the expand: 0-1 sums [16 tokens][16 outputs], 4-5 h high / low [16 tokens][16 ranks], 6-7 packed B
 * [8 pairs][16 outputs]. */
static void configure_expand(void) {
    TileConfig config = {0};
    config.palette = 1;
    config.rows[0] = config.rows[1] = 16, config.colsb[0] = config.colsb[1] = 64;
    config.rows[4] = config.rows[5] = 16, config.colsb[4] = config.colsb[5] = 32;
    config.rows[6] = config.rows[7] = 8, config.colsb[6] = config.colsb[7] = 64;
    _tile_loadconfig(&config);
}

/* Rows first .. first + n (n <= 16) of a slot run are rows[first] + 0 .. 15 of x (or h, or y): one tile's stride. */
static inline int contiguous16(const int64_t *rows, int64_t first, int64_t n) {
    return n == 16 && rows[first + 15] - rows[first] == 15;
}

/* One rank block's products (b: which of up to four blocks of this pass; tile 6 or 7 by parity). */
#define SHRINK_BLOCK(C, B, b)                                                                                        \
    if (blocks_now > (b)) {                                                                                        \
        _tile_loadd(B, packed + (c * blocks + rb + (b)) * 256, 64);                                                \
        _tile_dpbf16ps(C, 4, B);                                                                                   \
    }

/* h rows of n <= UNIT_ROWS tokens of one slot (rows[first ...]), whose A is packed. xbuf: 16 x in, cbuf: 16 x 16. */
static void shrink_amx(const bf16 *x, int64_t x_stride, const uint32_t *packed, int64_t in_features,
                       int64_t rank_total, const int64_t *rows, int64_t first, int64_t n, float *h, bf16 *xbuf,
                       float *cbuf) {
    const int64_t blocks = rank_total / 16;
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
        const int64_t f = first + t0, nt = n - t0 < 16 ? n - t0 : 16;
        const int direct = contiguous16(rows, f, nt);
        const bf16 *xs = x + rows[f] * x_stride;
        int64_t stride = x_stride * (int64_t)sizeof(bf16);
        if (!direct) { /* gather the tokens' rows; padding rows are zero and their sums are dropped */
            for (int64_t i = 0; i < 16; ++i)
                if (i < nt)
                    memcpy(xbuf + i * in_features, x + rows[f + i] * x_stride, in_features * sizeof(bf16));
                else
                    memset(xbuf + i * in_features, 0, in_features * sizeof(bf16));
            xs = xbuf, stride = in_features * (int64_t)sizeof(bf16);
        }
        for (int64_t rb = 0; rb < blocks; rb += 4) {
            const int64_t blocks_now = blocks - rb < 4 ? blocks - rb : 4;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t c = 0; c < in_features / 32; ++c) {
                _tile_loadd(4, xs + c * 32, stride);
                SHRINK_BLOCK(0, 6, 0)
                SHRINK_BLOCK(1, 7, 1)
                SHRINK_BLOCK(2, 6, 2)
                SHRINK_BLOCK(3, 7, 3)
            }
            for (int64_t b = 0; b < blocks_now; ++b) {
                float *out = direct ? h + rows[f] * rank_total + (rb + b) * 16 : cbuf;
                const int64_t out_stride = direct ? rank_total * (int64_t)sizeof(float) : 64;
                switch (b) { /* tile numbers are immediates */
                case 0: _tile_stored(0, out, out_stride); break;
                case 1: _tile_stored(1, out, out_stride); break;
                case 2: _tile_stored(2, out, out_stride); break;
                default: _tile_stored(3, out, out_stride); break;
                }
                if (!direct)
                    for (int64_t i = 0; i < nt; ++i)
                        memcpy(h + rows[f + i] * rank_total + (rb + b) * 16, cbuf + i * 16, 16 * sizeof(float));
            }
        }
    }
}

/* y rows of n <= UNIT_ROWS tokens of one slot, whose B is packed: y += scale * B h, rounded once.
 * hbuf: 2 x 16 x rank_total bf16 (high, low); cbuf: 16 x 32. */
static void expand_amx(bf16 *y, int64_t y_stride, const float *h, int64_t h_stride, const uint32_t *packed,
                       int64_t max_rank, const int64_t *part_sizes, int64_t num_parts, float scale,
                       const int64_t *rows, int64_t first, int64_t n, bf16 *hbuf, float *cbuf) {
    const int64_t rank_total = num_parts * max_rank, chunks = max_rank / 16;
    bf16 *high = hbuf, *low = hbuf + 16 * rank_total;
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
        const int64_t f = first + t0, nt = n - t0 < 16 ? n - t0 : 16;
        for (int64_t i = 0; i < 16; ++i)
            for (int64_t r = 0; r < rank_total; r += 16) {
                const __m512 v = i < nt ? _mm512_loadu_ps(h + rows[f + i] * h_stride + r) : _mm512_setzero_ps();
                const __m256bh hi = _mm512_cvtneps_pbh(v);
                const __m512 back = (__m512)_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)hi), 16);
                _mm256_storeu_si256((__m256i *)(high + i * rank_total + r), (__m256i)hi);
                _mm256_storeu_si256((__m256i *)(low + i * rank_total + r),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back)));
            }
        int64_t o = 0;
        for (int64_t p = 0; p < num_parts; ++p) {
            const int64_t end = o + part_sizes[p], hstride = rank_total * (int64_t)sizeof(bf16);
            if (chunks == 1) { /* rank 16: the part's h tiles serve all its outputs */
                _tile_loadd(4, high + p * max_rank, hstride);
                _tile_loadd(5, low + p * max_rank, hstride);
            }
            for (; o < end; o += 32) { /* two blocks of 16 outputs (sums 0 and 1), the second absent at a part's end */
                const int two = o + 16 < end;
                _tile_zero(0);
                _tile_zero(1);
                for (int64_t rc = 0; rc < chunks; ++rc) {
                    if (chunks > 1) {
                        _tile_loadd(4, high + p * max_rank + rc * 16, hstride);
                        _tile_loadd(5, low + p * max_rank + rc * 16, hstride);
                    }
                    _tile_loadd(6, packed + ((o / 16) * chunks + rc) * 128, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(0, 5, 6);
                    if (two) {
                        _tile_loadd(7, packed + ((o / 16 + 1) * chunks + rc) * 128, 64);
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_dpbf16ps(1, 5, 7);
                    }
                }
                _tile_stored(0, cbuf, 128);
                if (two) _tile_stored(1, cbuf + 16, 128);
                const __mmask32 mask = two ? 0xffffffffu : 0xffffu;
                for (int64_t i = 0; i < nt; ++i) {
                    bf16 *yt = y + rows[f + i] * y_stride + o;
                    const __m512i yv = _mm512_maskz_loadu_epi16(mask, yt);
                    const __m512 y0 = (__m512)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(yv)), 16);
                    const __m512 y1 = (__m512)_mm512_slli_epi32(
                        _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(yv, 1)), 16);
                    const __m512 s0 = _mm512_fmadd_ps(vscale, _mm512_load_ps(cbuf + i * 32), y0);
                    const __m512 s1 = _mm512_fmadd_ps(vscale, _mm512_load_ps(cbuf + i * 32 + 16), y1);
                    _mm512_mask_storeu_epi16(yt, mask, (__m512i)_mm512_cvtne2ps_pbh(s1, s0));
                }
            }
            o = end;
        }
    }
}
#else
#define HAVE_AMX 0
#define AMX_SHRINK_ROWS 0
#define AMX_EXPAND_ROWS 0
#define UNIT_ROWS 1
#endif

/* 1 when this build runs slots with many tokens on AMX tiles and the OS grants the tile state, else 0. */
int lora_amx(void) {
#if HAVE_AMX
    return amx_usable();
#else
    return 0;
#endif
}

/* A call's work: items of up to `tile` tokens of one slot for the vector loops (TILE for the shrink, EXPAND_TILE for
 * the expand), units of up to UNIT_ROWS for AMX
 * (pack: index of the slot's packed weights). Rows are in slot order, so a slot's tokens are one run. */
typedef struct {
    int64_t first, n, pack;
} Item;

static int64_t plan_items(const int64_t *slots, int64_t num_rows, int64_t tile, int64_t amx_rows, Item *items,
                          int64_t *pack_rows, int64_t *num_packs) {
    int64_t num_items = 0;
    *num_packs = 0;
    for (int64_t i = 0; i < num_rows;) {
        int64_t j = i + 1;
        while (j < num_rows && slots[j] == slots[i]) ++j;
        if (amx_rows > 0 && j - i >= amx_rows) {
            for (int64_t f = i; f < j; f += UNIT_ROWS)
                items[num_items++] = (Item){f, j - f < UNIT_ROWS ? j - f : UNIT_ROWS, *num_packs};
            pack_rows[(*num_packs)++] = i;
        } else {
            for (int64_t f = i; f < j; f += tile) items[num_items++] = (Item){f, j - f < tile ? j - f : tile, -1};
        }
        i = j;
    }
    return num_items;
}

/* The calling thread's buffer for packed weights and the threads' scratch, kept between calls (grown as needed). */
static __thread void *workspace_ptr;
static __thread size_t workspace_bytes;

static void *workspace(size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    if (bytes > workspace_bytes) {
        free(workspace_ptr);
        workspace_ptr = aligned_alloc(64, bytes);
        workspace_bytes = workspace_ptr != NULL ? bytes : 0;
    }
    return workspace_ptr;
}

/* A call's plan: its items, the first row of each slot whose weights are packed, and the workspace holding the packs
 * (pack_bytes each) and every thread's scratch (scratch_bytes). */
typedef struct {
    Item *items;
    int64_t *pack_rows, num_items, num_packs;
    char *ws;
} Plan;

/* Plans a call (slots with amx_rows tokens and more on tiles; 0: none). Returns -1 when memory is short (nothing is
 * left to free), else 0; plan_free releases it. */
static int plan_call(const int64_t *slots, int64_t num_rows, int64_t tile, int64_t amx_rows, size_t pack_bytes,
                     size_t scratch_bytes, int64_t num_threads, Plan *plan) {
    plan->items = malloc(num_rows * (sizeof(Item) + sizeof(int64_t)));
    if (plan->items == NULL) return -1;
    plan->pack_rows = (int64_t *)(plan->items + num_rows);
    plan->num_items = plan_items(slots, num_rows, tile, amx_rows, plan->items, plan->pack_rows, &plan->num_packs);
    const int needs = plan->num_packs || scratch_bytes > 0;
    plan->ws = needs ? workspace(plan->num_packs * pack_bytes + num_threads * scratch_bytes) : NULL;
    if (needs && plan->ws == NULL) {
        free(plan->items);
        return -1;
    }
    return 0;
}

static void plan_free(Plan *plan) { free(plan->items); }

/* 1 when this build's bf16 shrink runs on vdpbf16ps (above), else 0: for the tests. */
int lora_bf16_dots(void) { return HAVE_DP; }

/* The vector loop's shrink of one item: n <= TILE tokens of one slot (rows first ...), four rows of A at a time. */
static void shrink_item(const act_t *x, int64_t x_stride, const act_t *lora_a, int64_t in_features,
                        int64_t rank_total, const int64_t *rows, const int64_t *slots, int64_t first, int64_t n,
                        float *h) {
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
        return;
    }
#endif
    const int64_t vecs = in_features / LANES;
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

/* h[rows[i], 0:R] = lora_a[slots[i]] @ x[rows[i]]: items of up to TILE tokens on the vector loop, or, for a slot
 * with AMX_SHRINK_ROWS tokens and more on a CPU with AMX, units of UNIT_ROWS on tiles against its packed A. */
int lora_shrink(const act_t *x, int64_t x_stride, const act_t *lora_a, int64_t in_features, int64_t rank_total,
                const int64_t *rows, const int64_t *slots, int64_t num_rows, float *h, int64_t num_threads) {
    if (in_features % LANES || rank_total % LANES) return -1;
    if (num_rows <= 0) return 0;
    const int amx = HAVE_AMX && in_features % 32 == 0 && rank_total % 16 == 0 && lora_amx();
    const size_t pack_bytes = (size_t)rank_total * in_features * sizeof(act_t);
    const size_t scratch_bytes = amx ? 16 * in_features * sizeof(act_t) + 16 * 16 * sizeof(float) : 0;
    Plan plan;
    if (plan_call(slots, num_rows, TILE, amx ? AMX_SHRINK_ROWS : 0, pack_bytes, scratch_bytes, num_threads, &plan))
        return -1;
    const Item *items = plan.items;
    const int64_t num_items = plan.num_items, num_packs = plan.num_packs;
    if (num_packs == 0) { /* the vector loop only: items of equal cost */
#pragma omp parallel for schedule(static) num_threads(num_threads)
        for (int64_t i = 0; i < num_items; ++i) {
            const Item item = items[i];
            shrink_item(x, x_stride, lora_a, in_features, rank_total, rows, slots, item.first, item.n, h);
        }
    }
#if HAVE_AMX
    else {
#pragma omp parallel num_threads(num_threads)
        {
#pragma omp for schedule(static)
            for (int64_t p = 0; p < num_packs; ++p)
                pack_a(lora_a + slots[plan.pack_rows[p]] * rank_total * in_features, in_features, rank_total,
                       (uint32_t *)(plan.ws + p * pack_bytes));
            char *scratch = plan.ws + num_packs * pack_bytes + omp_get_thread_num() * scratch_bytes;
            configure_shrink(); /* the tile configuration is each thread's own */
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < num_items; ++i) {
                const Item item = items[i];
                if (item.pack >= 0)
                    shrink_amx(x, x_stride, (const uint32_t *)(plan.ws + item.pack * pack_bytes), in_features,
                               rank_total, rows, item.first, item.n, h, (bf16 *)scratch,
                               (float *)(scratch + 16 * in_features * sizeof(act_t)));
                else
                    shrink_item(x, x_stride, lora_a, in_features, rank_total, rows, slots, item.first, item.n, h);
            }
            _tile_release();
        }
    }
#endif
    plan_free(&plan);
    return 0;
}

#if !HAVE_EXPAND16
/* The vector loop's expand of one item: eight outputs at a time (eight rows of B, held in registers up to rank 16)
 * against each of its n <= TILE tokens' h. */
static void expand_item(act_t *y, int64_t y_stride, const float *h, int64_t h_stride, const act_t *lora_b,
                        int64_t out_total, int64_t max_rank, const int64_t *part_sizes, int64_t num_parts,
                        const float *scales, const int64_t *rows, const int64_t *slots, int64_t first, int64_t n,
                        void *unused) {
    (void)unused;
    const int64_t s = slots[first], rvecs = max_rank / LANES;
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
#endif

#if HAVE_EXPAND16
#define EXPAND_ITEM expand_item16
#define EXPAND_SCRATCH(max_rank, part_sizes, num_parts) expand_columns_bytes(max_rank, part_sizes, num_parts)
#else
#define EXPAND_ITEM expand_item
#define EXPAND_SCRATCH(max_rank, part_sizes, num_parts) ((size_t)0)
#endif

/* y[rows[i], part p] += scales[s] * lora_b[s][part p rows] @ h[rows[i], p * max_rank : (p + 1) * max_rank] with
 * s = slots[i]: items of up to TILE tokens on the vector loop, or AMX units against the slot's packed B (as the
 * shrink, from AMX_EXPAND_ROWS tokens). */
int lora_expand(act_t *y, int64_t y_stride, const float *h, int64_t h_stride, const act_t *lora_b,
                int64_t out_total, int64_t max_rank, const int64_t *part_sizes, int64_t num_parts,
                const float *scales, const int64_t *rows, const int64_t *slots, int64_t num_rows,
                int64_t num_threads) {
    if (max_rank % LANES) return -1;
    int amx = HAVE_AMX && max_rank % 16 == 0;
    for (int64_t p = 0; p < num_parts; ++p) {
        if (part_sizes[p] % LANES) return -1;
        amx = amx && part_sizes[p] % 16 == 0;
    }
    if (num_rows <= 0) return 0;
    amx = amx && lora_amx();
    const int64_t rank_total = num_parts * max_rank;
    const size_t pack_bytes = (size_t)out_total * max_rank * sizeof(act_t);
    /* a thread's scratch: the AMX units' (on CPUs with tiles), then the vector loop's transposed B */
    const size_t amx_bytes = amx ? 2 * 16 * rank_total * sizeof(act_t) + 16 * 32 * sizeof(float) : 0;
    const size_t scratch_bytes = amx_bytes + EXPAND_SCRATCH(max_rank, part_sizes, num_parts);
    Plan plan;
    if (plan_call(slots, num_rows, EXPAND_TILE, amx ? AMX_EXPAND_ROWS : 0, pack_bytes, scratch_bytes, num_threads,
                  &plan))
        return -1;
    const Item *items = plan.items;
    const int64_t num_items = plan.num_items, num_packs = plan.num_packs;
    if (num_packs == 0) { /* the vector loop only: items of up to EXPAND_TILE tokens, one at a time */
#pragma omp parallel num_threads(num_threads)
        {
            void *columns = plan.ws == NULL ? NULL : plan.ws + omp_get_thread_num() * scratch_bytes + amx_bytes;
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < num_items; ++i) {
                const Item item = items[i];
                EXPAND_ITEM(y, y_stride, h, h_stride, lora_b, out_total, max_rank, part_sizes, num_parts, scales,
                            rows, slots, item.first, item.n, columns);
            }
        }
    }
#if HAVE_AMX
    else {
#pragma omp parallel num_threads(num_threads)
        {
#pragma omp for schedule(static)
            for (int64_t p = 0; p < num_packs; ++p)
                pack_b(lora_b + slots[plan.pack_rows[p]] * out_total * max_rank, out_total, max_rank,
                       (uint32_t *)(plan.ws + p * pack_bytes));
            char *scratch = plan.ws + num_packs * pack_bytes + omp_get_thread_num() * scratch_bytes;
            configure_expand(); /* the tile configuration is each thread's own */
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < num_items; ++i) {
                const Item item = items[i];
                if (item.pack >= 0)
                    expand_amx(y, y_stride, h, h_stride, (const uint32_t *)(plan.ws + item.pack * pack_bytes), max_rank,
                               part_sizes, num_parts, scales[slots[item.first]], rows, item.first, item.n,
                               (bf16 *)scratch, (float *)(scratch + 2 * 16 * rank_total * sizeof(act_t)));
                else
                    EXPAND_ITEM(y, y_stride, h, h_stride, lora_b, out_total, max_rank, part_sizes, num_parts, scales,
                                rows, slots, item.first, item.n, (void *)(scratch + amx_bytes));
            }
            _tile_release();
        }
    }
#endif
    plan_free(&plan);
    return 0;
}
