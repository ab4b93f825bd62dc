/* Decode attention over each row's real tokens only (djl_handlers.kernels.decode_attention).
 *
 * One query token per row (a decode step), grouped-query attention, keys/values in a strided
 * [rows, kv_heads, columns, head_dim] view whose last dimension is contiguous. Row b attends to
 * columns [start[b], T): the left padding of a padded batch is never read. Each (row, kv head)
 * pair is one task: it reads that head's keys and values once for all the query heads that share
 * it, accumulates in fp32, and writes out[b, head, :] (contiguous [rows, heads, head_dim]).
 * A row's result depends only on its own tokens, never on the other rows of the call.
 *
 * Built at first use by djl_handlers/kernels/build.py (gcc -O3 -march=native -ffast-math
 * -fopenmp); called through ctypes with data pointers and element strides.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM 512
#define MAX_REP 16

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

typedef struct {
    int64_t rows, heads, kv_heads, dim, width;
    int64_t q_row, q_head;            /* query [rows, heads, dim] strides (elements) */
    int64_t k_row, k_head, k_col;     /* key view strides */
    int64_t v_row, v_head, v_col;     /* value view strides */
    float scale;
    int threads;
} attn_shape;

/* One task: row b, kv head g, fp32 storage. */
static void task_f32(const attn_shape *s, const float *q, const float *k, const float *v,
                     int64_t start, float *out, int64_t b, int64_t g, float *scores) {
    const int64_t d = s->dim, rep = s->heads / s->kv_heads, n = s->width - start;
    float qs[MAX_REP][MAX_DIM];
    float acc[MAX_REP][MAX_DIM];
    float mx[MAX_REP], sum[MAX_REP];
    for (int64_t r = 0; r < rep; r++) {
        const float *qr = q + b * s->q_row + (g * rep + r) * s->q_head;
        for (int64_t i = 0; i < d; i++) qs[r][i] = qr[i] * s->scale;
    }
    const float *kb = k + b * s->k_row + g * s->k_head + start * s->k_col;
    const float *vb = v + b * s->v_row + g * s->v_head + start * s->v_col;
    for (int64_t t = 0; t < n; t++) {
        const float *kt = kb + t * s->k_col;
        for (int64_t r = 0; r < rep; r++) {
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < d; i++) dot += qs[r][i] * kt[i];
            scores[r * n + t] = dot;
        }
    }
    for (int64_t r = 0; r < rep; r++) {
        float *sr = scores + r * n;
        float m = sr[0];
        for (int64_t t = 1; t < n; t++) m = sr[t] > m ? sr[t] : m;
        float total = 0.f;
#pragma omp simd reduction(+ : total)
        for (int64_t t = 0; t < n; t++) {
            sr[t] = expf(sr[t] - m);
            total += sr[t];
        }
        mx[r] = m;
        sum[r] = total;
        memset(acc[r], 0, sizeof(float) * d);
    }
    for (int64_t t = 0; t < n; t++) {
        const float *vt = vb + t * s->v_col;
        for (int64_t r = 0; r < rep; r++) {
            const float p = scores[r * n + t];
#pragma omp simd
            for (int64_t i = 0; i < d; i++) acc[r][i] += p * vt[i];
        }
    }
    for (int64_t r = 0; r < rep; r++) {
        float *o = out + (b * s->heads + g * rep + r) * d;
        const float inv = 1.f / sum[r];
        for (int64_t i = 0; i < d; i++) o[i] = acc[r][i] * inv;
    }
    (void)mx;
}

/* One task, bf16 storage (fp32 arithmetic). */
static void task_bf16(const attn_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                      int64_t start, uint16_t *out, int64_t b, int64_t g, float *scores) {
    const int64_t d = s->dim, rep = s->heads / s->kv_heads, n = s->width - start;
    float qs[MAX_REP][MAX_DIM];
    float acc[MAX_REP][MAX_DIM];
    float sum[MAX_REP];
    float row[MAX_DIM];
    for (int64_t r = 0; r < rep; r++) {
        const uint16_t *qr = q + b * s->q_row + (g * rep + r) * s->q_head;
        for (int64_t i = 0; i < d; i++) qs[r][i] = bf16_to_f32(qr[i]) * s->scale;
    }
    const uint16_t *kb = k + b * s->k_row + g * s->k_head + start * s->k_col;
    const uint16_t *vb = v + b * s->v_row + g * s->v_head + start * s->v_col;
    for (int64_t t = 0; t < n; t++) {
        const uint16_t *kt = kb + t * s->k_col;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) row[i] = bf16_to_f32(kt[i]);
        for (int64_t r = 0; r < rep; r++) {
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < d; i++) dot += qs[r][i] * row[i];
            scores[r * n + t] = dot;
        }
    }
    for (int64_t r = 0; r < rep; r++) {
        float *sr = scores + r * n;
        float m = sr[0];
        for (int64_t t = 1; t < n; t++) m = sr[t] > m ? sr[t] : m;
        float total = 0.f;
#pragma omp simd reduction(+ : total)
        for (int64_t t = 0; t < n; t++) {
            sr[t] = expf(sr[t] - m);
            total += sr[t];
        }
        sum[r] = total;
        memset(acc[r], 0, sizeof(float) * d);
    }
    for (int64_t t = 0; t < n; t++) {
        const uint16_t *vt = vb + t * s->v_col;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) row[i] = bf16_to_f32(vt[i]);
        for (int64_t r = 0; r < rep; r++) {
            const float p = scores[r * n + t];
#pragma omp simd
            for (int64_t i = 0; i < d; i++) acc[r][i] += p * row[i];
        }
    }
    for (int64_t r = 0; r < rep; r++) {
        uint16_t *o = out + (b * s->heads + g * rep + r) * d;
        const float inv = 1.f / sum[r];
        for (int64_t i = 0; i < d; i++) o[i] = f32_to_bf16(acc[r][i] * inv);
    }
}

/* Returns 0, or -1 when the shape is outside the kernel's limits (the caller falls back). */
int djl_decode_attention(const attn_shape *s, int is_bf16, const void *q, const void *k, const void *v,
                         const int64_t *starts, void *out) {
    if (s->dim > MAX_DIM || s->kv_heads <= 0 || s->heads % s->kv_heads || s->heads / s->kv_heads > MAX_REP)
        return -1;
    const int64_t rep = s->heads / s->kv_heads, tasks = s->rows * s->kv_heads;
    for (int64_t b = 0; b < s->rows; b++)
        if (starts[b] < 0 || starts[b] >= s->width) return -1;
    int failed = 0;
#pragma omp parallel num_threads(s->threads) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * (size_t)(rep * s->width));
        if (!scores) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (!scores) continue; /* every thread still takes part in the loop */
            const int64_t b = task / s->kv_heads, g = task % s->kv_heads;
            if (is_bf16)
                task_bf16(s, q, k, v, starts[b], out, b, g, scores);
            else
                task_f32(s, q, k, v, starts[b], out, b, g, scores);
        }
        free(scores);
    }
    return failed ? -2 : 0;
}
