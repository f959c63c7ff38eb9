/* SiLU-and-multiply, the gated MLP's activation: out[r] = silu(gate_up[r][:I]) * gate_up[r][I:], in bfloat16 or
 * float32 (act_t, vec8.h), one C call on the gate|up projection's output instead of torch's silu on a strided half
 * and a multiply. On the 2-core Sapphire Rapids class VM (2026-12-05) torch's two ops took 82 us on SmolLM2's 64
 * decode tokens ([64, 2 x 1536] bf16) and 1.7-2.0 ms on a 2048-token prefill chunk: 30 layers a step, 4% of a decode
 * step; this takes 41 us and 1.0 ms. (On an AMD EPYC VM an 8-lane version of this with vdivps lost to torch
 * from 16 tokens up: the exp is most of the work. This one takes 16 lanes on AVX-512, x / d as x times a refined
 * reciprocal: vdivps alone is a 16-cycle instruction. On AVX2 + FMA an 8-lane version with the same reciprocal: on
 * the Zen 3 VM (2026-12-06, fp32, a busy machine) 46 against torch's 85 us at 64 tokens, 1.7 against 3.9 ms at
 * 2048; in bf16 (which `auto` does not take there) 10-40% slower than torch; the decoder-layer replay
 * (native_forward) needs it to run at all.)
 *
 * Numbers: the same roundings as torch's two ops, in the same places: silu(g) = g / (1 + exp(-g)) in float32,
 * rounded to the activations' dtype, times up in float32, rounded again. The exp is Cephes' polynomial (relative
 * error ~2e-7, torch's is within an ulp of the true value) and 1 / d a refined vrcp14ps, so a silu whose float32
 * value lies that close to a bfloat16 rounding boundary may round the other way: one bfloat16 unit of the silu, up
 * to two of the product, in under 0.1% of the values (tests/kernels/test_silu_mul.py); in float32 a few units in
 * the last place.
 */
#include <math.h>
#include <stdint.h>

#include "vec8.h"

/* The fewest elements worth a second thread (its wake-up costs ~10 us). */
#define PARALLEL_ELEMENTS (1 << 15)

#if (defined(__AVX512F__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__FMA__))
#define HAVE_KERNEL 1 /* a vector build: 16 lanes (AVX-512) or 8 (AVX2) */
#else
#define HAVE_KERNEL 0
#endif

#if HAVE_KERNEL
/* The scalar tail of a row (its last size % 16 values, % 8 on AVX2): libm's exp. */
static inline float silu_mul_one(act_t g, act_t u) {
    const float x = act_to_float(g);
    /* below -88 torch's x / inf: -0, NaN for -inf (written out: -ffast-math would fold x * 0 to 0) */
    const float silu = x < -88.0f ? (isinf(x) ? NAN : -0.0f) : x / (1.0f + expf(-x));
    return act_to_float(u) * act_to_float(float_to_act(silu));
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)

/* The same polynomial on 16 lanes. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f),
                                                          _mm512_set1_ps(0.5f)), _MM_FROUND_TO_NEG_INF);
    x = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f))),
                      _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(y, x), x, x), _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}

#ifdef ACT_BF16
static inline __m512 load16(const act_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#if defined(__AVX512BF16__)
/* vcvtneps2bf16: round to nearest even in one instruction (denormal inputs count as zero), as store_bf16 does. */
static inline __m256i round16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
#else
/* Round to nearest even as torch does (float_to_bf16 on 16 lanes; a NaN to the quiet NaN). */
static inline __m256i round16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd),
                                              16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc0)));
}
#endif
static inline __m512 through_act(__m512 v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(round16(v)), 16));
}
static inline void store16(act_t *p, __m512 v) { _mm256_storeu_si256((__m256i *)p, round16(v)); }
#else
static inline __m512 load16(const act_t *p) { return _mm512_loadu_ps(p); }
static inline __m512 through_act(__m512 v) { return v; }
static inline void store16(act_t *p, __m512 v) { _mm512_storeu_ps(p, v); }
#endif

static void row(const act_t *gate, const act_t *up, act_t *out, int64_t size) {
    int64_t i = 0;
    for (; i + 16 <= size; i += 16) {
        const __m512 x = load16(gate + i);
        /* x / d as x times 1/d: vrcp14ps and one Newton step (vdivps is a 16-cycle instruction) */
        const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), x)));
        const __m512 r = _mm512_rcp14_ps(d);
        const __m512 inverse = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
        /* where exp(-x) overflows (x < -88, -inf), torch's x / inf: a zero of x's sign (NaN for -inf) */
        const __m512 silu = _mm512_mask_mul_ps(_mm512_mul_ps(x, inverse), _mm512_cmp_ps_mask(x, _mm512_set1_ps(-88.0f),
                                               _CMP_LT_OQ), x, _mm512_setzero_ps());
        store16(out + i, _mm512_mul_ps(through_act(silu), load16(up + i)));
    }
    for (; i < size; ++i) out[i] = float_to_act(silu_mul_one(gate[i], up[i]));
}
#elif defined(__AVX2__) && defined(__FMA__)
/* The same on 8 lanes (AVX2 + FMA): the exp's polynomial (vec8.h's vexp), 1 / d as vrcpps and two Newton steps
 * (12 bits, then 23), the tail and the special values as above. */
static inline __m256 load8(const act_t *p) { return (__m256)load_act(p); }
static inline __m256 through_act(__m256 v) {
#ifdef ACT_BF16
    bf16 h[8];
    store_bf16(h, (vf)v);
    return (__m256)load_bf16(h);
#else
    return v;
#endif
}

static void row(const act_t *gate, const act_t *up, act_t *out, int64_t size) {
    int64_t i = 0;
    for (; i + 8 <= size; i += 8) {
        const __m256 x = load8(gate + i), two = _mm256_set1_ps(2.0f);
        const __m256 e = (__m256)vexp((vf)_mm256_min_ps(-x, _mm256_set1_ps(88.0f))); /* exp(-x) */
        const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), e);
        __m256 r = _mm256_rcp_ps(d);
        r = _mm256_mul_ps(r, _mm256_fnmadd_ps(d, r, two));
        r = _mm256_mul_ps(r, _mm256_fnmadd_ps(d, r, two));
        /* below -88, torch's x / inf: x * 0, the zero hidden from GCC, which (-ffast-math) would fold x * 0 to 0 */
        __m256 zero = _mm256_setzero_ps();
        __asm__("" : "+x"(zero));
        const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(-88.0f), _CMP_LT_OQ);
        const __m256 silu = _mm256_blendv_ps(_mm256_mul_ps(x, r), _mm256_mul_ps(x, zero), below);
        store_act(out + i, (vf)_mm256_mul_ps(through_act(silu), load8(up + i)));
    }
    for (; i < size; ++i) out[i] = float_to_act(silu_mul_one(gate[i], up[i]));
}
#endif

#if HAVE_KERNEL
int silu_mul_available(void) { return 1; }

/* out [rows, size] = silu(gate_up[:, :size]) * gate_up[:, size:] for gate_up [rows, 2 * size], both contiguous. */
void silu_mul(const act_t *gate_up, act_t *out, int64_t rows, int64_t size, int64_t num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * size >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; ++r) row(gate_up + r * 2 * size, gate_up + r * 2 * size + size, out + r * size, size);
}
#else
/* Without AVX-512 or AVX2 torch's ops run instead. */
int silu_mul_available(void) { return 0; }

void silu_mul(const act_t *gate_up, act_t *out, int64_t rows, int64_t size, int64_t num_threads) {
    (void)gate_up, (void)out, (void)rows, (void)size, (void)num_threads;
}
#endif
