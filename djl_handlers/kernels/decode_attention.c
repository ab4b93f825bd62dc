/* Attention over each row's real tokens only (djl_handlers.kernels.decode_attention).
 *
 * The last `queries` columns of a [rows, kv_heads, columns, head_dim] key/value view (strided, last
 * dimension contiguous) are the queries: one per row for a decode step, a prompt's tokens for a
 * prefill. Query i of row b attends causally to columns [start[b], width - queries + i]: the left
 * padding of a padded batch is never read. Grouped-query attention: each (row, kv head, query chunk)
 * is one task that reads the head's keys and values for all the query heads sharing it, accumulates
 * in fp32, and writes out[b, i, head, :] (contiguous [rows, queries, heads, head_dim]). A query's
 * result depends only on its own row's tokens, never on the other rows or the padding.
 *
 * Element kinds (q_kind for the query and the output, kv_kind for the keys and values): 0 = fp32,
 * 1 = bf16, 2 = fp16; the arithmetic is fp32 throughout. Supported pairs (query/out, key/value):
 * fp32/fp32, bf16/bf16, and fp32/bf16 or fp32/fp16 (a 16-bit KV cache under fp32 weights: the
 * key/value reads of a step are half the bytes). The vector paths read fp32 keys and values in place
 * and convert 16-bit ones to fp32 rows first (bf16 by a shift, fp16 with F16C / AVX-512 F); the
 * plain C path converts fp16 by bit manipulation (subnormals, inf and NaN included), no _Float16.
 *
 * Built at first use by djl_handlers/kernels/build.py (gcc -O3 -march=native -ffast-math
 * -fopenmp, linked without -ffast-math); called through ctypes with data pointers and element
 * strides.
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

/* fp16 -> fp32, exact for every input (portable C, no _Float16). */
static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1fu) {
        u = man ? 0x7fc00000u | (man << 13) : 0x7f800000u; /* NaN (made quiet, as F16C does), inf */
    } else if (exp) {
        u = ((exp + 112u) << 23) | (man << 13);             /* normal: exponent bias 15 -> 127 */
    } else if (man) {                                       /* subnormal: man * 2^-24 */
        const float f = (float)man;                         /* exact and normalised (man < 1024) */
        memcpy(&u, &f, sizeof u);
        u -= 24u << 23;                                     /* times 2^-24: stays a normal fp32 */
    } else {
        u = 0;
    }
    u |= sign;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Element kinds: q_kind (query and output), kv_kind (keys and values). */
enum { KIND_F32 = 0, KIND_BF16 = 1, KIND_F16 = 2 };

static inline int64_t kind_size(int kind) { return kind == KIND_F32 ? 4 : 2; }

/* Element i of an array of `kind` as fp32. */
static inline float load_elem(const void *p, int kind, int64_t i) {
    if (kind == KIND_F32) return ((const float *)p)[i];
    if (kind == KIND_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    return f16_to_f32(((const uint16_t *)p)[i]);
}

typedef struct {
    int64_t rows, heads, kv_heads, dim, width;
    int64_t q_row, q_head;            /* query [rows, heads, queries, dim] strides (elements) */
    int64_t k_row, k_head, k_col;     /* key view strides */
    int64_t v_row, v_head, v_col;     /* value view strides */
    int64_t queries, q_tok;           /* query tokens per row (1 for a decode step), their stride */
    float scale;
    int threads;
} attn_shape;

/* One task of the plain C path: row b, kv head g, query i. The kinds are constants at each call
 * (the function is inlined into one copy per supported pair): fp32 keys and values are read in
 * place, 16-bit ones converted to an fp32 row first. */
static inline __attribute__((always_inline)) void task_plain(
    const attn_shape *s, const int q_kind, const int kv_kind, const char *q, const char *k, const char *v,
    int64_t start, char *out, int64_t b, int64_t g, int64_t i, float *scores) {
    const int64_t d = s->dim, rep = s->heads / s->kv_heads, n = s->width - s->queries + i + 1 - start;
    const int64_t qsz = kind_size(q_kind), kvsz = kind_size(kv_kind);
    float qs[MAX_REP][MAX_DIM];
    float acc[MAX_REP][MAX_DIM];
    float sum[MAX_REP];
    float row[MAX_DIM];
    for (int64_t r = 0; r < rep; r++) {
        const char *qr = q + (b * s->q_row + (g * rep + r) * s->q_head + i * s->q_tok) * qsz;
        for (int64_t i = 0; i < d; i++) qs[r][i] = load_elem(qr, q_kind, i) * s->scale;
    }
    const char *kb = k + (b * s->k_row + g * s->k_head + start * s->k_col) * kvsz;
    const char *vb = v + (b * s->v_row + g * s->v_head + start * s->v_col) * kvsz;
    for (int64_t t = 0; t < n; t++) {
        const char *src = kb + t * s->k_col * kvsz;
        const float *kt = (const float *)src;
        if (kv_kind != KIND_F32) {
#pragma omp simd
            for (int64_t i = 0; i < d; i++) row[i] = load_elem(src, kv_kind, i);
            kt = row;
        }
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
        sum[r] = total;
        memset(acc[r], 0, sizeof(float) * d);
    }
    for (int64_t t = 0; t < n; t++) {
        const char *src = vb + t * s->v_col * kvsz;
        const float *vt = (const float *)src;
        if (kv_kind != KIND_F32) {
#pragma omp simd
            for (int64_t i = 0; i < d; i++) row[i] = load_elem(src, kv_kind, i);
            vt = row;
        }
        for (int64_t r = 0; r < rep; r++) {
            const float p = scores[r * n + t];
#pragma omp simd
            for (int64_t i = 0; i < d; i++) acc[r][i] += p * vt[i];
        }
    }
    for (int64_t r = 0; r < rep; r++) {
        char *o = out + ((b * s->queries + i) * s->heads + g * rep + r) * d * qsz;
        const float inv = 1.f / sum[r];
        if (q_kind == KIND_F32) {
            for (int64_t i = 0; i < d; i++) ((float *)o)[i] = acc[r][i] * inv;
        } else {
            for (int64_t i = 0; i < d; i++) ((uint16_t *)o)[i] = f32_to_bf16(acc[r][i] * inv);
        }
    }
}

/* The plain C path for a supported (q_kind, kv_kind) pair: one specialised copy each. */
static void task_c(const attn_shape *s, int q_kind, int kv_kind, const void *q, const void *k, const void *v,
                   int64_t start, void *out, int64_t b, int64_t g, int64_t i, float *scores) {
    if (q_kind == KIND_BF16)
        task_plain(s, KIND_BF16, KIND_BF16, q, k, v, start, out, b, g, i, scores);
    else if (kv_kind == KIND_BF16)
        task_plain(s, KIND_F32, KIND_BF16, q, k, v, start, out, b, g, i, scores);
    else if (kv_kind == KIND_F16)
        task_plain(s, KIND_F32, KIND_F16, q, k, v, start, out, b, g, i, scores);
    else
        task_plain(s, KIND_F32, KIND_F32, q, k, v, start, out, b, g, i, scores);
}


/* DJL_PLAIN_C: the plain C path whatever the target (benchmarks/attention_paths.py compares them) */
#if !defined(DJL_PLAIN_C) && defined(__AVX512F__)
#include <immintrin.h>

/* AVX-512 path (built with -march=native on a CPU that has it): head dims that are a multiple of
 * 16 up to 256. Keys are taken 16 at a time; the 16 dot products of one query are summed across
 * lanes together (one transposed reduction instead of 16 horizontal ones). Values are taken in
 * chunks, 16-bit ones converted to fp32 once for all the query heads of the group (fp32 ones read
 * in place). */
#define KEYS 16
#define CHUNK 64

/* Lane j of the result is the sum of the 16 lanes of v[j]. */
static inline __m512 sum16(const __m512 v[16]) {
    __m512 w[8], x[4];
    for (int i = 0; i < 8; i++)
        w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x88), _mm512_shuffle_f32x4(x[0], x[1], 0xDD));
    __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], 0x88), _mm512_shuffle_f32x4(x[2], x[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, 0x88), _mm512_shuffle_f32x4(z0, z1, 0xDD));
}

/* 16 elements of `kind` at p as fp32. */
static inline __m512 load_f32(const void *p, int kind) {
    if (kind == KIND_F32) return _mm512_loadu_ps((const float *)p);
    if (kind == KIND_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

static inline void store_out(void *p, int q_kind, __m512 x) {
    if (q_kind == KIND_F32) {
        _mm512_storeu_ps((float *)p, x);
        return;
    }
    float tmp[16];
    uint16_t *o = (uint16_t *)p;
    _mm512_storeu_ps(tmp, x);
    for (int i = 0; i < 16; i++) o[i] = f32_to_bf16(tmp[i]);
}

static inline __attribute__((always_inline)) void task_avx512(
    const attn_shape *s, int q_kind, int kv_kind, const char *q, const char *k, const char *v, int64_t start,
    char *out, int64_t b, int64_t g, int64_t i, float *scores, float *buf, const int nv) {
    const int64_t d = (int64_t)nv * 16, rep = s->heads / s->kv_heads, n = s->width - s->queries + i + 1 - start;
    const int64_t qsz = kind_size(q_kind), kvsz = kind_size(kv_kind);
    const __m512 scale = _mm512_set1_ps(s->scale);
    const char *kb = k + (b * s->k_row + g * s->k_head + start * s->k_col) * kvsz;
    const char *vb = v + (b * s->v_row + g * s->v_head + start * s->v_col) * kvsz;
    float *rows = buf;                 /* [CHUNK][d] fp32 copies of keys or values */
    float *zero = buf + CHUNK * d;     /* [d] zeros: the missing keys of a last block */
    memset(zero, 0, sizeof(float) * d);
    /* scores = q . k * scale, 16 keys at a time */
    for (int64_t t0 = 0; t0 < n; t0 += KEYS) {
        const int m = (int)(n - t0 < KEYS ? n - t0 : KEYS);
        const float *kr[KEYS];
        for (int j = 0; j < KEYS; j++) {
            if (j >= m) {
                kr[j] = zero;
            } else if (kv_kind != KIND_F32) {
                const char *src = kb + (t0 + j) * s->k_col * kvsz;
                for (int c = 0; c < nv; c++)
                    _mm512_storeu_ps(rows + j * d + 16 * c, load_f32(src + 32 * c, kv_kind));
                kr[j] = rows + j * d;
            } else {
                kr[j] = (const float *)(kb + (t0 + j) * s->k_col * kvsz);
            }
        }
        for (int64_t r = 0; r < rep; r++) {
            const char *qr = q + (b * s->q_row + (g * rep + r) * s->q_head + i * s->q_tok) * qsz;
            __m512 qv[16];
            for (int c = 0; c < nv; c++) qv[c] = load_f32(qr + 16 * c * qsz, q_kind);
            __m512 acc[KEYS];
            for (int j = 0; j < KEYS; j++) {
                __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr[j]));
                for (int c = 1; c < nv; c++) a = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr[j] + 16 * c), a);
                acc[j] = a;
            }
            _mm512_mask_storeu_ps(scores + r * n + t0, (__mmask16)((1u << m) - 1u), _mm512_mul_ps(sum16(acc), scale));
        }
    }
    /* softmax numerators and sums */
    float sum[MAX_REP];
    for (int64_t r = 0; r < rep; r++) {
        float *sr = scores + r * n;
        float mx = sr[0];
        for (int64_t t = 1; t < n; t++) mx = sr[t] > mx ? sr[t] : mx;
        float total = 0.f;
        for (int64_t t = 0; t < n; t++) {
            sr[t] = expf(sr[t] - mx);
            total += sr[t];
        }
        sum[r] = total;
    }
    /* out = p . V / sum, values in chunks converted once for all query heads */
    __m512 acc[MAX_REP][16];
    for (int64_t r = 0; r < rep; r++)
        for (int c = 0; c < nv; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t t0 = 0; t0 < n; t0 += CHUNK) {
        const int64_t m = n - t0 < CHUNK ? n - t0 : CHUNK;
        const float *vr = rows;
        int64_t stride = d;
        if (kv_kind != KIND_F32) {
            for (int64_t j = 0; j < m; j++) {
                const char *src = vb + (t0 + j) * s->v_col * kvsz;
                for (int c = 0; c < nv; c++)
                    _mm512_storeu_ps(rows + j * d + 16 * c, load_f32(src + 32 * c, kv_kind));
            }
        } else {
            vr = (const float *)(vb + t0 * s->v_col * kvsz);
            stride = s->v_col;
        }
        for (int64_t r = 0; r < rep; r++) {
            __m512 a[16];
            for (int c = 0; c < nv; c++) a[c] = acc[r][c];
            const float *p = scores + r * n + t0;
            for (int64_t j = 0; j < m; j++) {
                const __m512 pj = _mm512_set1_ps(p[j]);
                for (int c = 0; c < nv; c++) a[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + j * stride + 16 * c), a[c]);
            }
            for (int c = 0; c < nv; c++) acc[r][c] = a[c];
        }
    }
    for (int64_t r = 0; r < rep; r++) {
        const __m512 inv = _mm512_set1_ps(1.f / sum[r]);
        char *o = out + ((b * s->queries + i) * s->heads + g * rep + r) * d * qsz;
        for (int c = 0; c < nv; c++) store_out(o + 16 * c * qsz, q_kind, _mm512_mul_ps(acc[r][c], inv));
    }
}

/* Specialised copies (the head dim fixed at compile time keeps the accumulators in registers). */
static int task_vector(const attn_shape *s, int q_kind, int kv_kind, const void *q, const void *k, const void *v,
                       int64_t start, void *out, int64_t b, int64_t g, int64_t i, float *scores, float *buf) {
    switch (s->dim) {
    case 64: task_avx512(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 4); return 1;
    case 128: task_avx512(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 8); return 1;
    case 32: task_avx512(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 2); return 1;
    case 80: task_avx512(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 5); return 1;
    case 96: task_avx512(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 6); return 1;
    case 256: task_avx512(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 16); return 1;
    default: return 0;
    }
}
/* Widens elements [*i, d) of a 16-bit row to fp32, 16 at a time (the rest is left to the caller). */
static inline void widen_vector(float *dst, const char *src, int kind, int64_t *i, int64_t d) {
    for (; *i + 16 <= d; *i += 16) _mm512_storeu_ps(dst + *i, load_f32(src + *i * 2, kind));
}
#define VECTOR_BUF(d) ((size_t)(CHUNK + 1) * (size_t)(d))
#define VECTOR_PATH "avx512"
#elif !defined(DJL_PLAIN_C) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* AVX2 path (an x86-64-v3 CPU without AVX-512, or a build capped at that level): the same scheme as
 * the AVX-512 one with 8 lanes: head dims that are a multiple of 8 up to 256, keys taken 8 at a
 * time with their 8 dot products summed across lanes together, values in chunks (16-bit ones
 * converted to fp32 once for all the query heads of the group, fp32 ones read in place). fp16 keys
 * and values need F16C (every x86 level with AVX2 has it); a build without it leaves them to the
 * plain C path. */
#define KEYS 8
#define CHUNK 64
#define MAX_VEC 32

/* Lane j of the result is the sum of the 8 lanes of v[j]. */
static inline __m256 sum8(const __m256 v[8]) {
    const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    /* u0 = [v0..v3 low halves | v0..v3 high halves], u1 the same for v4..v7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* 8 elements of `kind` at p as fp32. */
static inline __m256 load8(const void *p, int kind) {
    if (kind == KIND_F32) return _mm256_loadu_ps((const float *)p);
#ifdef __F16C__
    if (kind == KIND_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#endif
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

static inline void store8(void *p, int q_kind, __m256 x) {
    if (q_kind == KIND_F32) {
        _mm256_storeu_ps((float *)p, x);
        return;
    }
    float tmp[8];
    uint16_t *o = (uint16_t *)p;
    _mm256_storeu_ps(tmp, x);
    for (int i = 0; i < 8; i++) o[i] = f32_to_bf16(tmp[i]);
}

static inline __attribute__((always_inline)) void task_avx2(
    const attn_shape *s, int q_kind, int kv_kind, const char *q, const char *k, const char *v, int64_t start,
    char *out, int64_t b, int64_t g, int64_t i, float *scores, float *buf, const int nv) {
    const int64_t d = (int64_t)nv * 8, rep = s->heads / s->kv_heads, n = s->width - s->queries + i + 1 - start;
    const int64_t qsz = kind_size(q_kind), kvsz = kind_size(kv_kind);
    const __m256 scale = _mm256_set1_ps(s->scale);
    const char *kb = k + (b * s->k_row + g * s->k_head + start * s->k_col) * kvsz;
    const char *vb = v + (b * s->v_row + g * s->v_head + start * s->v_col) * kvsz;
    float *rows = buf;                 /* [CHUNK][d] fp32 copies of keys or values */
    float *zero = buf + CHUNK * d;     /* [d] zeros: the missing keys of a last block */
    memset(zero, 0, sizeof(float) * d);
    /* scores = q . k * scale, 8 keys at a time */
    for (int64_t t0 = 0; t0 < n; t0 += KEYS) {
        const int m = (int)(n - t0 < KEYS ? n - t0 : KEYS);
        const float *kr[KEYS];
        for (int j = 0; j < KEYS; j++) {
            if (j >= m) {
                kr[j] = zero;
            } else if (kv_kind != KIND_F32) {
                const char *src = kb + (t0 + j) * s->k_col * kvsz;
                for (int c = 0; c < nv; c++) _mm256_storeu_ps(rows + j * d + 8 * c, load8(src + 16 * c, kv_kind));
                kr[j] = rows + j * d;
            } else {
                kr[j] = (const float *)(kb + (t0 + j) * s->k_col * kvsz);
            }
            if (j < m) { /* the key's value is read right after the scores: start fetching it now */
                const char *vj = vb + (t0 + j) * s->v_col * kvsz;
                for (int64_t byte = 0; byte < d * kvsz; byte += 64) _mm_prefetch(vj + byte, _MM_HINT_T0);
            }
        }
        for (int64_t r = 0; r < rep; r++) {
            const char *qr = q + (b * s->q_row + (g * rep + r) * s->q_head + i * s->q_tok) * qsz;
            __m256 qv[MAX_VEC];
            for (int c = 0; c < nv; c++) qv[c] = load8(qr + 8 * c * qsz, q_kind);
            __m256 acc[KEYS];
            for (int j = 0; j < KEYS; j++) {
                __m256 a = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kr[j]));
                for (int c = 1; c < nv; c++) a = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(kr[j] + 8 * c), a);
                acc[j] = a;
            }
            float dots[KEYS];
            _mm256_storeu_ps(dots, _mm256_mul_ps(sum8(acc), scale));
            memcpy(scores + r * n + t0, dots, sizeof(float) * (size_t)m);
        }
    }
    /* softmax numerators and sums */
    float sum[MAX_REP];
    for (int64_t r = 0; r < rep; r++) {
        float *sr = scores + r * n;
        float mx = sr[0];
        for (int64_t t = 1; t < n; t++) mx = sr[t] > mx ? sr[t] : mx;
        float total = 0.f;
        for (int64_t t = 0; t < n; t++) {
            sr[t] = expf(sr[t] - mx);
            total += sr[t];
        }
        sum[r] = total;
    }
    /* out = p . V / sum, values in chunks converted once for all query heads */
    __m256 acc[MAX_REP][MAX_VEC];
    for (int64_t r = 0; r < rep; r++)
        for (int c = 0; c < nv; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t t0 = 0; t0 < n; t0 += CHUNK) {
        const int64_t m = n - t0 < CHUNK ? n - t0 : CHUNK;
        const float *vr = rows;
        int64_t stride = d;
        if (kv_kind != KIND_F32) {
            for (int64_t j = 0; j < m; j++) {
                const char *src = vb + (t0 + j) * s->v_col * kvsz;
                for (int c = 0; c < nv; c++) _mm256_storeu_ps(rows + j * d + 8 * c, load8(src + 16 * c, kv_kind));
            }
        } else {
            vr = (const float *)(vb + t0 * s->v_col * kvsz);
            stride = s->v_col;
        }
        for (int64_t r = 0; r < rep; r++) {
            __m256 a[MAX_VEC];
            for (int c = 0; c < nv; c++) a[c] = acc[r][c];
            const float *p = scores + r * n + t0;
            for (int64_t j = 0; j < m; j++) {
                const __m256 pj = _mm256_set1_ps(p[j]);
                for (int c = 0; c < nv; c++) a[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + j * stride + 8 * c), a[c]);
            }
            for (int c = 0; c < nv; c++) acc[r][c] = a[c];
        }
    }
    for (int64_t r = 0; r < rep; r++) {
        const __m256 inv = _mm256_set1_ps(1.f / sum[r]);
        char *o = out + ((b * s->queries + i) * s->heads + g * rep + r) * d * qsz;
        for (int c = 0; c < nv; c++) store8(o + 8 * c * qsz, q_kind, _mm256_mul_ps(acc[r][c], inv));
    }
}

/* Specialised copies (the head dim fixed at compile time keeps the accumulators in registers). */
static int task_vector(const attn_shape *s, int q_kind, int kv_kind, const void *q, const void *k, const void *v,
                       int64_t start, void *out, int64_t b, int64_t g, int64_t i, float *scores, float *buf) {
#ifndef __F16C__
    if (kv_kind == KIND_F16) return 0; /* no fp16 conversion instructions: the plain C path */
#endif
    switch (s->dim) {
    case 64: task_avx2(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 8); return 1;
    case 128: task_avx2(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 16); return 1;
    case 32: task_avx2(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 4); return 1;
    case 80: task_avx2(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 10); return 1;
    case 96: task_avx2(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 12); return 1;
    case 256: task_avx2(s, q_kind, kv_kind, q, k, v, start, out, b, g, i, scores, buf, 32); return 1;
    default: return 0;
    }
}
/* Widens elements [*i, d) of a 16-bit row to fp32, 8 at a time (the rest is left to the caller). */
static inline void widen_vector(float *dst, const char *src, int kind, int64_t *i, int64_t d) {
#ifndef __F16C__
    if (kind == KIND_F16) return; /* no fp16 conversion instructions: the caller's plain C loop */
#endif
    for (; *i + 8 <= d; *i += 8) _mm256_storeu_ps(dst + *i, load8(src + *i * 2, kind));
}
#define VECTOR_BUF(d) ((size_t)(CHUNK + 1) * (size_t)(d))
#define VECTOR_PATH "avx2"
#else
static int task_vector(const attn_shape *s, int q_kind, int kv_kind, const void *q, const void *k, const void *v,
                       int64_t start, void *out, int64_t b, int64_t g, int64_t i, float *scores, float *buf) {
    (void)s; (void)q_kind; (void)kv_kind; (void)q; (void)k; (void)v; (void)start; (void)out; (void)b; (void)g; (void)i;
    (void)scores;
    (void)buf;
    return 0;
}
static inline void widen_vector(float *dst, const char *src, int kind, int64_t *i, int64_t d) {
    (void)dst; (void)src; (void)kind; (void)i; (void)d;
}
#define VECTOR_BUF(d) ((size_t)1)
#define VECTOR_PATH "plain C"
#endif

/* Which path this build takes for head dims of 32, 64, 80, 96, 128 and 256 (others: plain C). */
const char *djl_decode_attention_path(void) { return VECTOR_PATH; }

/* Query chunk of one task: a prefill's queries are split so that both threads get work. */
#define QUERY_CHUNK 16

/* One 16-bit key or value row (`kind`) as d fp32 values. */
static void widen_row(float *dst, const char *src, int kind, int64_t d) {
    int64_t i = 0;
    widen_vector(dst, src, kind, &i, d);
    for (; i < d; i++) dst[i] = load_elem(src, kind, i);
}

/* A 16-bit cache under fp32 queries, several queries per task (a prefill): the task's keys and values
 * (columns [start, end) of row b, kv head g) are widened once into `wide` ([2][width][dim] fp32, each
 * column at its own index), and `local` becomes the shape that reads them there as an fp32 cache.
 * The fp32 values are those the 16-bit paths compute with, so the results are the same bits; each
 * query no longer converts every key it reads (a prompt's query chunk reads the same keys 16 times). */
static void widen_task(const attn_shape *s, int kv_kind, const void *k, const void *v, int64_t b, int64_t g,
                       int64_t start, int64_t end, float *wide, attn_shape *local) {
    const int64_t d = s->dim;
    float *wk = wide, *wv = wide + s->width * d;
    for (int64_t c = start; c < end; c++) {
        widen_row(wk + c * d, (const char *)k + (b * s->k_row + g * s->k_head + c * s->k_col) * 2, kv_kind, d);
        widen_row(wv + c * d, (const char *)v + (b * s->v_row + g * s->v_head + c * s->v_col) * 2, kv_kind, d);
    }
    *local = *s;
    local->k_row = local->k_head = local->v_row = local->v_head = 0;
    local->k_col = local->v_col = d;
}

/* Returns 0, or -1 when the shape or the element kinds are outside the kernel's limits (the caller
 * falls back). q_kind is the query's and the output's element kind, kv_kind the keys' and values'
 * (0 = fp32, 1 = bf16, 2 = fp16): fp32/fp32, bf16/bf16, fp32/bf16 and fp32/fp16.
 * Query i of row b sits at column width - queries + i and attends to columns [starts[b], that
 * column] (causal); a query left of starts[b] (left padding) gets zeros. */
int djl_decode_attention(const attn_shape *s, int q_kind, int kv_kind, const void *q, const void *k,
                         const void *v, const int64_t *starts, void *out) {
    const int kinds_ok = q_kind == KIND_F32 ? kv_kind == KIND_F32 || kv_kind == KIND_BF16 || kv_kind == KIND_F16
                                            : q_kind == KIND_BF16 && kv_kind == KIND_BF16;
    if (!kinds_ok) return -1;
    if (s->dim > MAX_DIM || s->kv_heads <= 0 || s->heads % s->kv_heads || s->heads / s->kv_heads > MAX_REP)
        return -1;
    if (s->queries < 1 || s->queries > s->width) return -1;
    const int64_t rep = s->heads / s->kv_heads, chunks = (s->queries + QUERY_CHUNK - 1) / QUERY_CHUNK;
    const int64_t tasks = s->rows * s->kv_heads * chunks, esz = kind_size(q_kind);
    for (int64_t b = 0; b < s->rows; b++)
        if (starts[b] < 0 || starts[b] >= s->width) return -1;
    const int widen = q_kind == KIND_F32 && kv_kind != KIND_F32 && s->queries > 1;
    int failed = 0;
#pragma omp parallel num_threads(s->threads) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * (size_t)(rep * s->width));
        float *buf = malloc(sizeof(float) * VECTOR_BUF(s->dim));
        float *wide = widen ? malloc(sizeof(float) * 2 * (size_t)(s->width * s->dim)) : NULL;
        if (!scores || !buf || (widen && !wide)) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (failed) continue; /* every thread still takes part in the loop */
            const int64_t b = task / (s->kv_heads * chunks), g = (task / chunks) % s->kv_heads;
            const int64_t first = (task % chunks) * QUERY_CHUNK;
            const int64_t last = first + QUERY_CHUNK < s->queries ? first + QUERY_CHUNK : s->queries;
            const attn_shape *ts = s;
            const void *tk = k, *tv = v;
            int tkind = kv_kind;
            attn_shape local;
            const int64_t end = s->width - s->queries + last; /* one past the last column the task reads */
            if (widen && end - starts[b] > 0 && last - first > 1) {
                widen_task(s, kv_kind, k, v, b, g, starts[b], end, wide, &local);
                ts = &local;
                tk = wide;
                tv = wide + s->width * s->dim;
                tkind = KIND_F32;
            }
            for (int64_t i = first; i < last; i++) {
                if (s->width - s->queries + i < starts[b]) { /* a padding query: nothing to attend to */
                    char *o = (char *)out + ((b * s->queries + i) * s->heads + g * rep) * s->dim * esz;
                    memset(o, 0, (size_t)(rep * s->dim * esz));
                    continue;
                }
                if (!task_vector(ts, q_kind, tkind, q, tk, tv, starts[b], out, b, g, i, scores, buf))
                    task_c(ts, q_kind, tkind, q, tk, tv, starts[b], out, b, g, i, scores);
            }
        }
        free(scores);
        free(buf);
        free(wide);
    }
    return failed ? -2 : 0;
}
