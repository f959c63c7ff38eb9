/* Vectors of 8 floats for the CPU kernels (GCC/Clang vector extensions: -march=native picks AVX2/AVX-512 on
 * x86 and NEON on ARM), eight horizontal sums at once, and the element types of a build. Included by each
 * kernel's .c file; native.py builds a kernel again when this file changes.
 *
 * Element types: native.py compiles a kernel once per variant. With ACT_BF16 the activations (and, for LoRA,
 * the adapter weights) are bfloat16, else float32; with KV_BF16 the KV cache is (with KV_INT8 it holds int8 rows).
 * Arithmetic is float32 either way: bf16 values widen exactly on load and round to nearest even on store. */
#ifndef LORA_PLATFORM_VEC8_H
#define LORA_PLATFORM_VEC8_H

#include <stdint.h>
#include <string.h>

#define LANES 8

typedef float vf __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(LANES * sizeof(int32_t))));

static inline vf load(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf splat(float x) { return (vf){x, x, x, x, x, x, x, x}; }
static inline float hsum(vf v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

static inline vf vmax(vf a, vf b) { vi m = a > b; return (vf)(((vi)a & m) | ((vi)b & ~m)); }

/* exp(x) for x <= 88 (softmax arguments; silu_mul's exp(-x)), Cephes' expf polynomial: relative error ~2e-7. */
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

/* bfloat16 as its raw bits: the high half of a float32. */
typedef uint16_t bf16;
typedef uint16_t vh __attribute__((vector_size(LANES * sizeof(uint16_t))));
typedef uint32_t vu __attribute__((vector_size(LANES * sizeof(uint32_t))));

/* One bfloat16 to float32 and back, scalar: exact widening, and rounding to nearest even as torch does (a NaN to
 * the quiet NaN 0x7fc0, denormals kept). Branch-free, so loops over them vectorize. */
static inline float bf16_to_float(bf16 h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline bf16 float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (bf16)((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX2__)
/* One vpmovzxwd and a shift: GCC splits the generic conversion below into two halves and shuffles them back
 * together, which took paged attention in bf16 to twice the time of fp32 (shuffle port bound). */
static inline vf load_bf16(const bf16 *p) {
    return (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
}
#else
static inline vf load_bf16(const bf16 *p) {
    vh h;
    memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vu) << 16);
}
#endif

#if defined(__AVX512BF16__) && defined(__AVX512VL__)
/* vcvtneps2bf16: round to nearest even in one instruction (denormal inputs count as zero). */
static inline void store_bf16(bf16 *p, vf v) {
    const __m128bh h = _mm256_cvtneps_pbh((__m256)v);
    memcpy(p, &h, sizeof h);
}
#else
/* Round to nearest even, as torch does; a NaN stays a (quiet) NaN instead of rounding into infinity. */
static inline void store_bf16(bf16 *p, vf v) {
    const vu u = (vu)v;
    const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const vu nan = (vu)((u & 0x7fffffffu) > 0x7f800000u);
    const vh h = __builtin_convertvector((rounded & ~nan) | (((u >> 16) | 0x40u) & nan), vh);
    memcpy(p, &h, sizeof h);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* 32 floats (lo then hi) to 32 bfloat16 at p, rounded to nearest even: vcvtne2ps2bf16 where the CPU has AVX512-BF16
 * (denormal inputs count as zero), else the same rounding in integer steps (denormals kept, a NaN stays a quiet
 * NaN), for CPUs with AVX-512 VNNI but no BF16 (Ice Lake, and Xeon VMs that hide it). */
static inline void store_bf16x32(bf16 *p, __m512 lo, __m512 hi) {
#if defined(__AVX512BF16__)
    _mm512_storeu_si512(p, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
#else
    const __m512 halves[2] = {lo, hi};
    for (int i = 0; i < 2; ++i) {
        const __m512i u = _mm512_castps_si512(halves[i]);
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i h = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
        const __mmask16 nan = _mm512_cmp_ps_mask(halves[i], halves[i], _CMP_UNORD_Q);
        h = _mm512_mask_mov_epi32(h, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
        _mm256_storeu_si256((__m256i *)(p + 16 * i), _mm512_cvtepi32_epi16(h));
    }
#endif
}
#endif

#if defined(__AVX512F__)
/* {hsum(a[0]), ..., hsum(a[15])} of 16 floats each: a transpose folded into the sums, 30 shuffles and 15 adds. */
static inline __m512 hsum16(const __m512 a[16]) {
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; ++i) /* 256-bit halves: b[i] = [8 partials of a[2i] | 8 of a[2i+1]] */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; ++i) /* 128-bit lanes: c[i] = [4 partials of a[4i], a[4i+1], a[4i+2], a[4i+3]] */
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i) /* in each 128-bit lane j: 2 partials of a[8i+j], 2 of a[8i+j+4] */
        d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
    /* lane j: a[j], a[j+4], a[j+8], a[j+12]; then the sum of a[k] to lane k */
    const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, e);
}
#endif

#ifdef ACT_BF16
typedef bf16 act_t;
#define load_act load_bf16
#define store_act store_bf16
#define act_to_float bf16_to_float
#define float_to_act float_to_bf16
#else
typedef float act_t;
#define load_act load
#define store_act store
static inline float act_to_float(float x) { return x; }
static inline float float_to_act(float x) { return x; }
#endif

#ifdef KV_BF16
typedef bf16 kv_t;
#define load_kv load_bf16
#elif defined(KV_INT8)
/* kernels/kv_int8.py's format: a (token, kv head) row is head_dim int8 values, then their float32 scale's 4 bytes.
 * Only the kernels that know the format read or write it (paged_attention.c's tile_dp, rotary_kv.c). */
typedef int8_t kv_t;
#define KV_SCALE_BYTES 4
#else
typedef float kv_t;
#define load_kv load
#endif

#if defined(__clang__)
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (vi){__VA_ARGS__})
#endif

/* {hsum(a[0]), ..., hsum(a[7])} in 12 shuffles and 7 adds (a transpose folded into the sums). */
static inline vf hsum8(const vf a[8]) {
    vf b[4], c[2];
    for (int i = 0; i < 4; ++i)
        b[i] = SHUFFLE(a[2 * i], a[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
               SHUFFLE(a[2 * i], a[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int i = 0; i < 2; ++i)
        c[i] = SHUFFLE(b[2 * i], b[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               SHUFFLE(b[2 * i], b[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return SHUFFLE(c[0], c[1], 0, 1, 2, 3, 8, 9, 10, 11) + SHUFFLE(c[0], c[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

#endif
