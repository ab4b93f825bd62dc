/* Per-row argmax and log-sum-exp of next-token logits (djl_handlers.kernels.row_stats).
 *
 * For each row of a [rows, vocab] matrix (fp32 or bf16 storage, rows `stride` elements apart):
 *
 *     argmax[r] = the first index of the row's largest value (torch.argmax's tie rule)
 *     log_z[r]  = max + log(sum(exp(x - max)))            (torch.logsumexp's formula)
 *
 * in two passes over the row (max, then the sum of exponentials), instead of torch's five
 * (to fp32, argmax, amax, sub, exp, sum: each a full pass and a dispatch). Non-finite input is not
 * handled here: a row holding NaN or +inf, or only -inf, is reported (the return value counts such
 * rows) and the caller falls back to torch, which defines those cases. -inf entries (masked tokens)
 * are fine. Built with -ffast-math (for glibc's vectorised expf), so no infinity or NaN is ever
 * tested with a float comparison: both checks run on the bit patterns, and the max starts from
 * the row's first value.
 *
 * Rows are independent and spread over OpenMP threads.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_bits_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* 1 when the row cannot be handled: a NaN or +inf anywhere, or nothing but -inf. */
static int bad_f32(const uint32_t *u, int64_t n) {
    int bad = 0, finite = 0;
#pragma omp simd reduction(| : bad, finite)
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = u[i] & 0x7fffffffu;
        bad |= (a > 0x7f800000u) | (u[i] == 0x7f800000u);
        finite |= a < 0x7f800000u;
    }
    return bad | !finite;
}

static int bad_bf16(const uint16_t *u, int64_t n) {
    int bad = 0, finite = 0;
#pragma omp simd reduction(| : bad, finite)
    for (int64_t i = 0; i < n; i++) {
        uint16_t a = (uint16_t)(u[i] & 0x7fffu);
        bad |= (a > 0x7f80u) | (u[i] == 0x7f80u);
        finite |= a < 0x7f80u;
    }
    return bad | !finite;
}

static int row_f32(const float *x, int64_t n, int64_t *argmax, float *log_z) {
    if (bad_f32((const uint32_t *)x, n)) return 1;
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int64_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    int64_t at = 0;
    while (x[at] != m) at++;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += expf(x[i] - m);
    *argmax = at;
    *log_z = m + logf(s);
    return 0;
}

static int row_bf16(const uint16_t *x, int64_t n, int64_t *argmax, float *log_z) {
    if (bad_bf16(x, n)) return 1;
    float m = bf16_bits_to_f32(x[0]);
#pragma omp simd reduction(max : m)
    for (int64_t i = 1; i < n; i++) {
        float v = bf16_bits_to_f32(x[i]);
        m = v > m ? v : m;
    }
    int64_t at = 0;
    while (bf16_bits_to_f32(x[at]) != m) at++;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += expf(bf16_bits_to_f32(x[i]) - m);
    *argmax = at;
    *log_z = m + logf(s);
    return 0;
}

/* Returns how many rows could not be handled (0: every argmax[r] and log_z[r] is set). */
int djl_row_stats(const void *logits, int is_bf16, int64_t rows, int64_t vocab, int64_t stride,
                  int64_t *argmax, float *log_z, int threads) {
    int bad = 0;
    if (vocab <= 0) return (int)rows;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : bad) if (rows > 1 && threads > 1)
    for (int64_t r = 0; r < rows; r++) {
        if (is_bf16)
            bad += row_bf16((const uint16_t *)logits + r * stride, vocab, argmax + r, log_z + r);
        else
            bad += row_f32((const float *)logits + r * stride, vocab, argmax + r, log_z + r);
    }
    return bad;
}
