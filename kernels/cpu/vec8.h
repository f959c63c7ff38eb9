/* Vectors of 8 floats for the CPU kernels (GCC/Clang vector extensions: -march=native picks AVX2/AVX-512 on
 * x86 and NEON on ARM), and eight horizontal sums at once. Included by each kernel's .c file; native.py builds
 * a kernel again when this file changes. */
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
