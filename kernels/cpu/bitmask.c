/* Apply a token bitmask to float32 logits in place: a disallowed token's logit becomes -inf.
 *
 * Why C: a constrained decode step masks every constrained row of [batch, vocab] logits (49,152 tokens for
 * SmolLM2). Most grammar positions allow a few tokens, so nearly every word of a row is 0: torch paid for a
 * nonzero() over the words, another over their bits, gathers and scatters (2.2 ms of CPU for 50 rows here), and
 * xgrammar's CPU kernel tests every bit. Here each row is one pass over its words: an all-allowed word is skipped,
 * an all-refused one is eight stores of eight lanes, a mixed one is tested bit by bit.
 *
 * Layouts: logits [*, width] float32 with row stride logits_stride; bitmask [*, words] int32 contiguous, bit
 * t % 32 of word t / 32 set when token t is allowed; rows[i], i < num_rows: the rows to mask (the same index in
 * both). Tokens at or past covered (= min(width, 32 * words)) are refused: they are in no grammar.
 */
#include <math.h>
#include <stdint.h>

void apply_token_bitmask(float *logits, int64_t logits_stride, int64_t width, const int32_t *bitmask,
                         int64_t words, const int64_t *rows, int64_t num_rows, int64_t num_threads) {
    const int64_t covered = width < 32 * words ? width : 32 * words;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_rows > 8)
    for (int64_t i = 0; i < num_rows; ++i) {
        float *row = logits + rows[i] * logits_stride;
        const int32_t *mask = bitmask + rows[i] * words;
        for (int64_t w = 0; w * 32 < covered; ++w) {
            const uint32_t bits = (uint32_t)mask[w];
            if (bits == UINT32_MAX) continue;
            float *out = row + w * 32;
            const int64_t n = covered - w * 32 < 32 ? covered - w * 32 : 32;
            if (bits == 0) {
                for (int64_t b = 0; b < n; ++b) out[b] = -INFINITY;
            } else {
                for (int64_t b = 0; b < n; ++b)
                    if (!((bits >> b) & 1u)) out[b] = -INFINITY;
            }
        }
        for (int64_t t = covered; t < width; ++t) row[t] = -INFINITY;
    }
}
