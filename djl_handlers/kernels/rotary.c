/* Rotary position embedding of queries and keys (djl_handlers.kernels.rotary).
 *
 * transformers' Llama-family apply_rotary_pos_emb, for x of shape [B, H, S, D] (any strides,
 * unit stride over D) and cos/sin of shape [B or 1, S, D] (contiguous):
 *
 *     out = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])
 *
 * evaluated exactly as torch evaluates those three operations on the CPU: every product and the
 * sum rounded once to the storage type (fp32: IEEE single operations; bf16: computed in fp32 and
 * rounded to nearest even after each operation, as torch's bf16 kernels do). So the result is
 * torch's bit for bit; built without fast-math or FMA contraction (see rotary.py). Outputs are
 * contiguous [B, H, S, D]. Work is split over (B, H) pairs and OpenMP threads when large enough.
 */
#include <stdint.h>
#include <string.h>

static inline float bf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t to_bf(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

typedef struct {
    int64_t batch, heads, seq, dim;
    int64_t sb, sh, ss; /* input strides in elements (unit stride over dim) */
} View;

static void rotate_f32(const float *x, const float *c, const float *s, float *o, int64_t dim) {
    int64_t half = dim / 2;
    for (int64_t d = 0; d < half; d++) o[d] = x[d] * c[d] + (-x[d + half]) * s[d];
    for (int64_t d = half; d < dim; d++) o[d] = x[d] * c[d] + x[d - half] * s[d];
}

static void rotate_bf16(const uint16_t *x, const uint16_t *c, const uint16_t *s, uint16_t *o, int64_t dim) {
    int64_t half = dim / 2;
    for (int64_t d = 0; d < half; d++) {
        float a = bf(to_bf(bf(x[d]) * bf(c[d])));
        float b = bf(to_bf(-bf(x[d + half]) * bf(s[d])));
        o[d] = to_bf(a + b);
    }
    for (int64_t d = half; d < dim; d++) {
        float a = bf(to_bf(bf(x[d]) * bf(c[d])));
        float b = bf(to_bf(bf(x[d - half]) * bf(s[d])));
        o[d] = to_bf(a + b);
    }
}

static void one(const void *x, const View *v, const void *cos, const void *sin, int64_t cs_batch, void *out,
                int is_bf16, int64_t pair) {
    int64_t b = pair / v->heads, h = pair % v->heads;
    int64_t cb = cs_batch == 1 ? 0 : b;
    for (int64_t t = 0; t < v->seq; t++) {
        int64_t in_off = b * v->sb + h * v->sh + t * v->ss;
        int64_t cs_off = (cb * v->seq + t) * v->dim;
        int64_t out_off = ((b * v->heads + h) * v->seq + t) * v->dim;
        if (is_bf16)
            rotate_bf16((const uint16_t *)x + in_off, (const uint16_t *)cos + cs_off, (const uint16_t *)sin + cs_off,
                        (uint16_t *)out + out_off, v->dim);
        else
            rotate_f32((const float *)x + in_off, (const float *)cos + cs_off, (const float *)sin + cs_off,
                       (float *)out + out_off, v->dim);
    }
}

/* q and k share cos/sin ([cs_batch, seq, dim]); q_out/k_out are contiguous [B, H, S, D]. */
int djl_rotary(const void *q, const int64_t *q_shape_strides, const void *k, const int64_t *k_shape_strides,
               const void *cos, const void *sin, int64_t cs_batch, void *q_out, void *k_out, int is_bf16,
               int threads) {
    View vq = {q_shape_strides[0], q_shape_strides[1], q_shape_strides[2], q_shape_strides[3],
               q_shape_strides[4], q_shape_strides[5], q_shape_strides[6]};
    View vk = {k_shape_strides[0], k_shape_strides[1], k_shape_strides[2], k_shape_strides[3],
               k_shape_strides[4], k_shape_strides[5], k_shape_strides[6]};
    int64_t nq = vq.batch * vq.heads, nk = vk.batch * vk.heads, total = nq + nk;
    int64_t elements = (nq + nk) * vq.seq * vq.dim;
    int use = (threads > 1 && elements >= 65536) ? threads : 1;
#pragma omp parallel for num_threads(use) schedule(static) if (use > 1)
    for (int64_t p = 0; p < total; p++) {
        if (p < nq)
            one(q, &vq, cos, sin, cs_batch, q_out, is_bf16, p);
        else
            one(k, &vk, cos, sin, cs_batch, k_out, is_bf16, p - nq);
    }
    return 0;
}
