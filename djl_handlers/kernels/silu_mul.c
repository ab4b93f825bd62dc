/* SiLU(gate) * up over the fused gate/up projection output (djl_handlers.kernels.silu_mul).
 *
 * Input: [rows, 2 * inter] (fp32 or bf16 storage; rows `stride` elements apart), the gate in the
 * first `inter` columns and the up projection in the next `inter` (the layout of
 * engines.hf.cpu.fused's gate/up GEMM). Output: a contiguous [rows, inter] of the same storage:
 *
 *     out = silu(gate) * up,  silu(g) = g / (1 + exp(-g))
 *
 * with torch's rounding steps for bf16 (silu computed in fp32 and rounded to bf16, then the
 * product of two bf16 values computed in fp32 and rounded), so the result differs from torch's
 * two operations only where glibc's expf and torch's (Sleef) differ in the last bit. One pass
 * instead of two operations and a temporary; rows (or, for few rows, the columns) are spread over
 * OpenMP threads when the matrix is large enough to pay for waking them.
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

static inline float bf16_in(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t bf16_out(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static void span_f32(const float *g, const float *u, float *o, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void span_bf16(const uint16_t *g, const uint16_t *u, uint16_t *o, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float x = bf16_in(g[i]);
        float s = bf16_in(bf16_out(x / (1.0f + expf(-x))));
        o[i] = bf16_out(s * bf16_in(u[i]));
    }
}

#define CHUNK 4096 /* columns per task when a few long rows are split */
#define PARALLEL_MIN 131072 /* elements below which one thread is faster than waking another */

int djl_silu_mul(const void *in, void *out, int is_bf16, int64_t rows, int64_t inter, int64_t stride,
                 int threads) {
    if (rows <= 0 || inter <= 0) return 0;
    int64_t chunks = (inter + CHUNK - 1) / CHUNK;
    int64_t tasks = rows * chunks;
    int use = (rows * inter >= PARALLEL_MIN && threads > 1) ? threads : 1;
#pragma omp parallel for num_threads(use) schedule(static) if (use > 1)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t r = t / chunks, c0 = (t % chunks) * CHUNK;
        int64_t n = inter - c0 < CHUNK ? inter - c0 : CHUNK;
        if (is_bf16) {
            const uint16_t *row = (const uint16_t *)in + r * stride;
            span_bf16(row + c0, row + inter + c0, (uint16_t *)out + r * inter + c0, n);
        } else {
            const float *row = (const float *)in + r * stride;
            span_f32(row + c0, row + inter + c0, (float *)out + r * inter + c0, n);
        }
    }
    return 0;
}
