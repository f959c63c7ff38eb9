/* RMSNorm in bfloat16 or float32 (act_t, vec8.h), with the residual add before it, in one C call instead of the half
 * dozen torch ops it is made of: at a decode batch each torch op costs tens of microseconds of dispatch and thread
 * wake-up for a few microseconds of arithmetic (RMSNorm took 0.2 ms a call on 64 tokens of SmolLM2 in bfloat16, 6%
 * of a step; this takes 14-20 us; measured on a 2-core AMD EPYC VM). SiLU-and-multiply on 8 lanes was tried here
 * too and lost to torch's from 16 tokens up (its exp is most of its work): silu_mul.c takes 16 lanes on AVX-512.
 *
 * In bfloat16, the same roundings as torch's ops, in the same places (values widen to float32 exactly, the add
 * rounds, then x * rstd * w rounds once), so the result differs from torch's only where the float32 sum of squares,
 * taken in another order, tips a rounding: one bfloat16 unit in the last place, rarely
 * (tests/kernels/test_rms_norm.py). In float32 the add is torch's exactly and the norm differs from torch's (and
 * HF's) by the sum's order only: a few float32 units in the last place. torch's float32 op is eight ops (pow, mean,
 * add, rsqrt, two muls and two copies): 110-120 us a call at one token on a 2-core AMD EPYC Zen 1 VM, 61 calls a
 * step; with this build the batch-1 decode step went 51.8 -> 49.0 ms there.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vec8.h"


/* The fewest elements worth a second thread. A sleeping worker's wake-up costs ~10 us, but within a step the workers
 * spin between the kernels: at 64 tokens of SmolLM2 (36,864 elements) a call took 37 us on one thread. */
#define PARALLEL_ELEMENTS (1 << 13)

/* One row of torch's rms_norm: out = round(x * rsqrt(mean(x^2) + eps) * w). With delta, the residual stream takes
 * the step's output first: x = round(x + delta), written back to x. */
static void norm_row(act_t *x, const act_t *delta, const act_t *weight, act_t *out, int64_t hidden, float eps) {
    if (delta != NULL) {
#pragma omp simd
        for (int64_t i = 0; i < hidden; ++i)
            x[i] = float_to_act(act_to_float(x[i]) + act_to_float(delta[i]));
    }
    /* One loop for both cases, so a row's sum is taken in one order whether or not it was added to here (with the
     * add fused in, the compiler vectorized the two loops differently on AVX2 and the sums differed). */
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < hidden; ++i) {
        const float v = act_to_float(x[i]);
        squares += v * v;
    }
    const float rstd = 1.0f / sqrtf(squares / (float)hidden + eps);
#pragma omp simd
    for (int64_t i = 0; i < hidden; ++i)
        out[i] = float_to_act(act_to_float(x[i]) * rstd * act_to_float(weight[i]));
}

/* out[r] = rms_norm(x[r]) for rows of `hidden` contiguous values; with delta (may be NULL) x[r] += delta[r]
 * first, in place. */
void add_rms_norm(act_t *x, const act_t *delta, const act_t *weight, act_t *out, int64_t rows, int64_t hidden,
                  float eps, int64_t num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * hidden >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; ++r)
        norm_row(x + r * hidden, delta != NULL ? delta + r * hidden : NULL, weight, out + r * hidden, hidden, eps);
}
