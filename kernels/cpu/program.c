/* A recorded list of this package's C kernel calls, replayed in one call: a forward pass's layers without the Python
 * between the kernels.
 *
 * At a decode step of one sequence every kernel is short (a projection's GEMV 50-100 us, a norm a few), and the
 * Python around each call (argument checks, output allocation, ctypes' conversions, the module calls) cost as much
 * as the norms, rotary, attention and SiLU together: about 3.5 ms of an 11.6 ms step (SmolLM2 in bf16, 2-vCPU AMD
 * EPYC Zen 4, perf). `engine.models.native_forward` records the layers' calls once, with their buffers and weights
 * as constants, and each step passes only what changes: the token count and the step's metadata.
 *
 * An op is a kernel (a function pointer from another of this package's libraries, called with that library's own
 * signature: `kind` says which) and up to 16 arguments. Argument i is the constant a[i], or, where bit i of `vars` is
 * set, the step's value number a[i] (see PROGRAM_VARS in program.py). Kernels run in order; the first that
 * returns non-zero stops the replay. Where the caller passes `ns`, each op's wall time (CLOCK_MONOTONIC, about 20 ns
 * a reading through the vDSO, against ops of 5 us and more) is added to ns[kind]: where a step's time goes.
 */
#include <stdint.h>
#include <time.h>

enum {
    OP_ADD_RMS_NORM = 1, /* rms_norm.c add_rms_norm */
    OP_GEMM = 2,         /* gemv.c gemv_bf16/gemv_f32, packed_gemm.c packed_gemm/packed_gemm_f32 */
    OP_GEMM_INT8 = 3,    /* int8_gemm.c int8_gemm */
    OP_ROTARY_QKV = 4,   /* rotary_kv.c rotary_qkv */
    OP_ATTENTION = 5,    /* paged_attention.c paged_attention */
    OP_SILU_MUL = 6,     /* silu_mul.c silu_mul */
    OP_LORA_SHRINK = 7,  /* lora.c lora_shrink */
    OP_LORA_EXPAND = 8,  /* lora.c lora_expand */
    NUM_KINDS = 9,
};

#define MAX_ARGS 16

typedef struct {
    int64_t kind;
    void *fn;
    int64_t vars; /* bit i: a[i] is the index of a step value, not a constant */
    double f;     /* the op's float argument (a norm's eps, attention's scale) */
    int64_t a[MAX_ARGS];
} Op;

typedef void (*norm_fn)(void *, const void *, const void *, void *, int64_t, int64_t, float, int64_t);
typedef int (*gemm_fn)(const void *, int64_t, const void *, const void *, int64_t, int64_t, void *, int64_t);
typedef int (*int8_fn)(const void *, int64_t, int, const void *, const float *, const float *, int64_t, int64_t,
                       void *, int64_t);
typedef int (*rotary_fn)(const void *, int64_t, int64_t, int64_t, int64_t, int64_t, const float *, const float *,
                         void *, const int64_t *, void *, void *, int64_t, int64_t);
typedef int (*attention_fn)(const void *, void *, const void *, const void *, int64_t, const int32_t *, int64_t,
                            const int32_t *, const int32_t *, const int32_t *, int64_t, int64_t, int64_t, int64_t,
                            int64_t, float, int64_t);
typedef void (*silu_fn)(const void *, void *, int64_t, int64_t, int64_t);
typedef int (*shrink_fn)(const void *, int64_t, const void *, int64_t, int64_t, const int64_t *, const int64_t *,
                         int64_t, float *, int64_t);
typedef int (*expand_fn)(void *, int64_t, const float *, int64_t, const void *, int64_t, int64_t, const int64_t *,
                         int64_t, const float *, const int64_t *, const int64_t *, int64_t, int64_t);

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Replays ops[0..num_ops) with the step values `values`, adding each op's nanoseconds to ns[kind] where `ns` (NUM_KINDS
 * counters) is not NULL. Returns -1 when all ran; else the index of the op that failed, its status in *status (-3 for
 * an op kind this build does not know). */
int64_t program_run(const Op *ops, int64_t num_ops, const int64_t *values, int64_t *status, int64_t *ns) {
    int64_t start = ns ? now_ns() : 0;
    for (int64_t i = 0; i < num_ops; ++i) {
        const Op *op = &ops[i];
        int64_t v[MAX_ARGS];
        for (int j = 0; j < MAX_ARGS; ++j) v[j] = (op->vars >> j & 1) ? values[op->a[j]] : op->a[j];
#define P(j) ((void *)(intptr_t)v[j])
        int rc = 0;
        switch (op->kind) {
        case OP_ADD_RMS_NORM:
            ((norm_fn)op->fn)(P(0), P(1), P(2), P(3), v[4], v[5], (float)op->f, v[6]);
            break;
        case OP_GEMM:
            rc = ((gemm_fn)op->fn)(P(0), v[1], P(2), P(3), v[4], v[5], P(6), v[7]);
            break;
        case OP_GEMM_INT8:
            rc = ((int8_fn)op->fn)(P(0), v[1], (int)v[2], P(3), P(4), P(5), v[6], v[7], P(8), v[9]);
            break;
        case OP_ROTARY_QKV:
            rc = ((rotary_fn)op->fn)(P(0), v[1], v[2], v[3], v[4], v[5], P(6), P(7), P(8), P(9), P(10), P(11), v[12],
                                     v[13]);
            break;
        case OP_ATTENTION:
            rc = ((attention_fn)op->fn)(P(0), P(1), P(2), P(3), v[4], P(5), v[6], P(7), P(8), P(9), v[10], v[11],
                                        v[12], v[13], v[14], (float)op->f, v[15]);
            break;
        case OP_SILU_MUL:
            ((silu_fn)op->fn)(P(0), P(1), v[2], v[3], v[4]);
            break;
        case OP_LORA_SHRINK:
            rc = ((shrink_fn)op->fn)(P(0), v[1], P(2), v[3], v[4], P(5), P(6), v[7], P(8), v[9]);
            break;
        case OP_LORA_EXPAND:
            rc = ((expand_fn)op->fn)(P(0), v[1], P(2), v[3], P(4), v[5], v[6], P(7), v[8], P(9), P(10), P(11), v[12],
                                     v[13]);
            break;
        default:
            rc = -3;
        }
#undef P
        if (ns && op->kind > 0 && op->kind < NUM_KINDS) {
            int64_t end = now_ns();
            ns[op->kind] += end - start;
            start = end;
        }
        if (rc != 0) {
            *status = rc;
            return i;
        }
    }
    return -1;
}

/* sizeof(Op), for the Python side's check of its own layout. */
int64_t program_op_size(void) { return (int64_t)sizeof(Op); }

/* The size of the `ns` array program_run takes, for the same check. */
int64_t program_num_kinds(void) { return NUM_KINDS; }
