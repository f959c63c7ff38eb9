/* Rotary embedding and the KV cache write for CPUs: one call each per layer instead of a dozen torch ops, which at
 * one decode token cost more than their arithmetic (about 35 us of the ~40 us the two took per layer, measured on
 * a 2-core VM); rotary_qkv does both for a fused q/k/v projection's output in one call.
 *
 * Bit for bit what the torch formulas give (engine/models/rotary.py, kernels/cpu/attention.py): native.py builds
 * this file without -ffast-math and with -ffp-contract=off, so every product is rounded to float32 before the sum
 * (no FMA), as torch computes ``x1 * cos - x2 * sin`` in float32 op by op. act_t/kv_t and the loads come from
 * vec8.h; stores to bfloat16 round to nearest even in software, as torch does (NaN -> 0x7fc0), never through
 * vcvtneps2bf16, which flushes denormals.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vec8.h"

#ifdef ACT_BF16
#define ACT_TO_FLOAT(x) bf16_to_float(x)
#define FLOAT_TO_ACT(x) float_to_bf16(x)
#else
#define ACT_TO_FLOAT(x) (x)
#define FLOAT_TO_ACT(x) (x)
#endif

#ifdef KV_INT8
/* rows quantized by store_row below */
#elif defined(KV_BF16)
#define ACT_TO_KV(x) float_to_bf16(ACT_TO_FLOAT(x))
#elif defined(ACT_BF16)
#define ACT_TO_KV(x) bf16_to_float(x)
#else
#define ACT_TO_KV(x) (x)
#endif

/* out[t, h] = (x1 * cos - x2 * sin, x2 * cos + x1 * sin) of x[t, h] = (x1, x2), with cos/sin [T, head_dim / 2] the
 * rows of the tokens' positions. x's token rows are token_stride elements apart, its heads head_dim apart; out is
 * contiguous [T, H, head_dim]. */
void rotary(const act_t *x, int64_t token_stride, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
            const float *cos, const float *sin, act_t *out) {
    const int64_t half = head_dim / 2;
    for (int64_t t = 0; t < num_tokens; ++t) {
        const float *c = cos + t * half, *s = sin + t * half;
        for (int64_t h = 0; h < num_heads; ++h) {
            const act_t *x1 = x + t * token_stride + h * head_dim, *x2 = x1 + half;
            act_t *o1 = out + (t * num_heads + h) * head_dim, *o2 = o1 + half;
            for (int64_t i = 0; i < half; ++i) {
                const float a = ACT_TO_FLOAT(x1[i]), b = ACT_TO_FLOAT(x2[i]);
                const float ac = a * c[i], bs = b * s[i], bc = b * c[i], as = a * s[i];
                o1[i] = FLOAT_TO_ACT(ac - bs);
                o2[i] = FLOAT_TO_ACT(bc + as);
            }
        }
    }
}

#ifdef KV_INT8
#define KV_ROW(head_dim) ((head_dim) + KV_SCALE_BYTES)

/* One head's values to kernels/kv_int8.py's row: round(x / scale) (to nearest even) clamped to +-127, scale =
 * max |x| / 127, then the scale's bytes; the float ops of kv_int8.quantize, so the rows are the same bit for bit. */
static void store_row(kv_t *out, const act_t *x, int64_t head_dim) {
    float amax = 0.0f;
    for (int64_t i = 0; i < head_dim; ++i) {
        const float a = fabsf(ACT_TO_FLOAT(x[i]));
        amax = a > amax ? a : amax;
    }
    const float scale = amax / 127.0f;
    for (int64_t i = 0; i < head_dim; ++i) {
        float q = scale > 0.0f ? rintf(ACT_TO_FLOAT(x[i]) / scale) : 0.0f;
        q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
        out[i] = (kv_t)q;
    }
    memcpy(out + head_dim, &scale, sizeof scale);
}
#else
#define KV_ROW(head_dim) (head_dim)

static void store_row(kv_t *out, const act_t *x, int64_t head_dim) {
    for (int64_t i = 0; i < head_dim; ++i) out[i] = ACT_TO_KV(x[i]);
}
#endif

/* k_cache[slot[t]] = k[t], v_cache[slot[t]] = v[t] (num_kv_heads rows of head_dim each; KV_ROW(head_dim) elements
 * each in the caches) for every token whose slot is >= 0. Returns 0, or -2 without writing anything if a slot is
 * past the cache's num_slots. */
int write_kv(const act_t *k, int64_t k_stride, const act_t *v, int64_t v_stride, int64_t num_tokens,
             int64_t num_kv_heads, int64_t head_dim, const int64_t *slots, kv_t *k_cache, kv_t *v_cache,
             int64_t num_slots) {
    for (int64_t t = 0; t < num_tokens; ++t)
        if (slots[t] >= num_slots) return -2;
    const int64_t row = KV_ROW(head_dim), slot_size = num_kv_heads * row;
    for (int64_t t = 0; t < num_tokens; ++t) {
        if (slots[t] < 0) continue;
        const act_t *kt = k + t * k_stride, *vt = v + t * v_stride;
        kv_t *kc = k_cache + slots[t] * slot_size, *vc = v_cache + slots[t] * slot_size;
        for (int64_t h = 0; h < num_kv_heads; ++h) {
            store_row(kc + h * row, kt + h * head_dim, head_dim);
            store_row(vc + h * row, vt + h * head_dim, head_dim);
        }
    }
    return 0;
}

/* rotary() of the q heads into q_out, and of the k heads into k_cache's slots with v's rows into v_cache's: the
 * q/k/v split, the two rotary calls and write_kv of one layer in one call, made of those two functions (one token's
 * k heads rotated into an act_t buffer, then stored with v), so the floats are theirs. qkv rows are [q heads | k heads
 * | v heads], token_stride elements apart. Tokens are split over num_threads threads from 8 of them (each token's
 * floats are the same whichever thread computes them): a 64-token decode step's 30 calls took 2.3 ms on one thread
 * (2-core AMD EPYC Zen 4). Returns 0, or -2 without writing anything if a slot is past the cache's num_slots. */
int rotary_qkv(const act_t *qkv, int64_t token_stride, int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
               int64_t head_dim, const float *cos, const float *sin, act_t *q_out, const int64_t *slots,
               kv_t *k_cache, kv_t *v_cache, int64_t num_slots, int64_t num_threads) {
    for (int64_t t = 0; t < num_tokens; ++t)
        if (slots[t] >= num_slots) return -2;
    const int64_t half = head_dim / 2, row_size = num_kv_heads * head_dim;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_tokens >= 8)
    for (int64_t t = 0; t < num_tokens; ++t) {
        rotary(qkv + t * token_stride, token_stride, 1, num_q_heads, head_dim, cos + t * half, sin + t * half,
               q_out + t * num_q_heads * head_dim);
        if (slots[t] < 0) continue;
        act_t k[row_size];
        const act_t *row = qkv + t * token_stride + num_q_heads * head_dim; /* this token's k heads, then its v */
        rotary(row, row_size, 1, num_kv_heads, head_dim, cos + t * half, sin + t * half, k);
        write_kv(k, row_size, row + row_size, row_size, 1, num_kv_heads, head_dim, slots + t, k_cache, v_cache,
                 num_slots);
    }
    return 0;
}
