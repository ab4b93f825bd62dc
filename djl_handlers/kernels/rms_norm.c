/* Fused Llama RMSNorm (djl_handlers.kernels.rms_norm).
 *
 * Per row of a contiguous [rows, hidden] input (fp32 or bf16 storage), with a weight of the same
 * storage type, exactly the Llama formula as torch evaluates it on the CPU:
 *
 *     x32 = float(x); s = sum(x32 * x32); r = 1 / sqrt(s / hidden + eps)
 *     y   = x32 * r, rounded to the storage type;  out = weight * y (bf16: fp32 product rounded
 *     to nearest even, which is what torch's bf16 elementwise multiply does)
 *
 * Bit-for-bit with torch: the sum of squares follows the order of ATen's CPU sum kernel for a
 * contiguous inner reduction (SumKernel.cpp: vectors of `lanes` floats, summed four vectors at a
 * time in a four-level cascade of chunks of at least 16, then the scalar tail, then the lanes in
 * order); `lanes` is the width of the Vectorized<float> that ATen's sum kernel runs with here
 * (8 on x86-64, also under AVX512: the sum kernel has no AVX512 build), which the caller finds once
 * by comparing against torch. Rows shorter than `lanes` take ATen's scalar path (lanes = 1).
 * mean is sum / hidden (ATen's CPU mean is sum then div), rsqrt is 1 / sqrt (correctly rounded,
 * as Vectorized::rsqrt). The caller checks the result against the module's
 * own forward before using it, so a torch that changes its order only costs the speed-up.
 *
 * This needs IEEE arithmetic: built with -fno-fast-math -ffp-contract=off (see rms_norm.py), so
 * the compiler neither reassociates the sums nor fuses x*x + acc into an FMA. The lane arrays
 * keep the loops vectorizable anyway. Rows are independent (a row's result never depends on the
 * other rows of the call) and are spread over `threads` OpenMP threads.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LEVELS 4
#define ILP 4
#define MAX_LANES 16

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline int64_t ceil_log2(int64_t x) {
    if (x <= 2) return 1;
    int64_t bits = 0;
    for (uint64_t v = (uint64_t)(x - 1); v; v >>= 1) bits++;
    return bits;
}

/* The sum of squares of x[0..n) in ATen's order with L lanes (L: a compile-time constant at each
 * call site, so the loops below have constant trip counts and vectorize). acc[level] holds the
 * ILP partial vectors of one level side by side: element k * L + l is lane l of vector k, so a
 * block of ILP consecutive input vectors maps one-to-one onto it. */
static inline __attribute__((always_inline)) float sum_squares(const float *x, int64_t n, const int L) {
    const int W = ILP * L;
    const int64_t nvec = n / L, nilp = nvec / ILP;
    const int64_t power = ceil_log2(nilp) / LEVELS > 4 ? ceil_log2(nilp) / LEVELS : 4;
    const int64_t step = (int64_t)1 << power, mask = step - 1;
    float acc[LEVELS][ILP * MAX_LANES];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    while (i + step <= nilp) {
        for (int64_t j = 0; j < step; j++, i++) {
            const float *p = x + i * W;
            for (int t = 0; t < W; t++) acc[0][t] += p[t] * p[t];
        }
        for (int lev = 1; lev < LEVELS; lev++) {
            for (int t = 0; t < W; t++) {
                acc[lev][t] += acc[lev - 1][t];
                acc[lev - 1][t] = 0.f;
            }
            if (i & (mask << (lev * power))) break;
        }
    }
    for (; i < nilp; i++) {
        const float *p = x + i * W;
        for (int t = 0; t < W; t++) acc[0][t] += p[t] * p[t];
    }
    for (int lev = 1; lev < LEVELS; lev++)
        for (int t = 0; t < W; t++) acc[0][t] += acc[lev][t];
    /* vectors left over after the groups of ILP go into the first partial vector */
    for (int64_t v = nilp * ILP; v < nvec; v++)
        for (int l = 0; l < L; l++) acc[0][l] += x[v * L + l] * x[v * L + l];
    for (int k = 1; k < ILP; k++)
        for (int l = 0; l < L; l++) acc[0][l] += acc[0][k * L + l];
    float total = 0.f;
    for (int64_t t = nvec * L; t < n; t++) total += x[t] * x[t];
    for (int l = 0; l < L; l++) total += acc[0][l];
    return total;
}

static float row_sum_squares(const float *x, int64_t n, int lanes) {
    if (lanes == 16 && n >= 16) return sum_squares(x, n, 16);
    if (lanes == 8 && n >= 8) return sum_squares(x, n, 8);
    if (lanes == 4 && n >= 4) return sum_squares(x, n, 4);
    return sum_squares(x, n, 1); /* ATen's scalar inner sum */
}

static inline float inv_rms(float sum, int64_t hidden, float eps) {
    const float mean = sum / (float)hidden;
    return 1.f / sqrtf(mean + eps);
}

/* Returns 0; -1 for arguments outside the kernel (the caller falls back); -2 out of memory. */
int djl_rms_norm(const void *x, const void *weight, void *out, int64_t rows, int64_t hidden, float eps,
                 int is_bf16, int lanes, int threads) {
    if (rows < 0 || hidden <= 0 || (lanes != 1 && lanes != 4 && lanes != 8 && lanes != 16)) return -1;
    if (threads < 1) threads = 1;
    int failed = 0;
    /* a parallel region costs microseconds: only worth it for prefill-sized calls */
    const int parallel = threads > 1 && rows > 1 && rows * hidden >= 65536;
#pragma omp parallel num_threads(threads) if (parallel) reduction(| : failed)
    {
        float *buf = is_bf16 ? malloc(sizeof(float) * (size_t)hidden) : NULL;
        if (is_bf16 && !buf) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (is_bf16) {
                if (!buf) continue; /* every thread still takes part in the loop */
                const uint16_t *xr = (const uint16_t *)x + r * hidden;
                const uint16_t *w = weight;
                uint16_t *o = (uint16_t *)out + r * hidden;
                for (int64_t i = 0; i < hidden; i++) buf[i] = bf16_to_f32(xr[i]);
                const float inv = inv_rms(row_sum_squares(buf, hidden, lanes), hidden, eps);
                for (int64_t i = 0; i < hidden; i++) {
                    const float y = bf16_to_f32(f32_to_bf16(buf[i] * inv));
                    o[i] = f32_to_bf16(bf16_to_f32(w[i]) * y);
                }
            } else {
                const float *xr = (const float *)x + r * hidden;
                const float *w = weight;
                float *o = (float *)out + r * hidden;
                const float inv = inv_rms(row_sum_squares(xr, hidden, lanes), hidden, eps);
                for (int64_t i = 0; i < hidden; i++) o[i] = w[i] * (xr[i] * inv);
            }
        }
        free(buf);
    }
    return failed ? -2 : 0;
}
