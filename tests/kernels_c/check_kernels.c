/* Checks the package's C kernels against plain double-precision references on fixed pseudo-random
 * inputs, with no Python and no torch: the test suite builds it for the machine at hand and, with
 * Debian's aarch64 cross compiler and qemu-user, for arm64 (tests/unit/test_kernels_portable.py).
 * Prints one line per check and "ok" at the end; exits 1 at the first failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int djl_rms_norm(const void *x, const void *weight, void *out, int64_t rows, int64_t hidden, float eps,
                 int is_bf16, int lanes, int threads);
int djl_silu_mul(const void *in, void *out, int is_bf16, int64_t rows, int64_t inter, int64_t stride,
                 int threads);
int djl_row_stats(const void *logits, int is_bf16, int64_t rows, int64_t vocab, int64_t stride,
                  int64_t *argmax, float *log_z, int threads);
int64_t djl_int8_packed_bytes(int64_t n, int64_t k);
int djl_int8_pack(const int8_t *q, int64_t n, int64_t k, int8_t *packed, int32_t *colsum);
int djl_int8_gemm(const float *x, int64_t rows, int64_t ldx, int64_t k, const int8_t *packed, const int32_t *colsum,
                  const float *wscale, const float *bias, float *out, int64_t n, int threads);

static uint32_t state = 12345u;
static float uniform(void) { /* [-1, 1), a fixed sequence on every machine */
    state = state * 1664525u + 1013904223u;
    return (float)((state >> 8) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static int fail(const char *what, double got, double want) {
    printf("FAIL %s: got %.9g want %.9g\n", what, got, want);
    return 1;
}

static int check_rms_norm(void) {
    enum { ROWS = 5, HIDDEN = 576 };
    static float x[ROWS * HIDDEN], w[HIDDEN], out[ROWS * HIDDEN];
    for (int i = 0; i < ROWS * HIDDEN; i++) x[i] = 3.0f * uniform();
    for (int i = 0; i < HIDDEN; i++) w[i] = 1.0f + 0.5f * uniform();
    int lanes[] = {1, 4, 8, 16};
    for (int l = 0; l < 4; l++) {
        if (djl_rms_norm(x, w, out, ROWS, HIDDEN, 1e-5f, 0, lanes[l], 2) != 0) return fail("rms_norm status", 1, 0);
        for (int r = 0; r < ROWS; r++) {
            double sum = 0;
            for (int i = 0; i < HIDDEN; i++) sum += (double)x[r * HIDDEN + i] * x[r * HIDDEN + i];
            double inv = 1.0 / sqrt(sum / HIDDEN + 1e-5);
            for (int i = 0; i < HIDDEN; i++) {
                double want = w[i] * (x[r * HIDDEN + i] * inv);
                if (fabs(out[r * HIDDEN + i] - want) > 1e-5 * (1 + fabs(want))) return fail("rms_norm", out[r * HIDDEN + i], want);
            }
        }
    }
    printf("rms_norm fp32, lanes 1/4/8/16: ok\n");
    return 0;
}

static int check_silu_mul(void) {
    enum { ROWS = 3, INTER = 1536 };
    static float in[ROWS * 2 * INTER], out[ROWS * INTER];
    for (int i = 0; i < ROWS * 2 * INTER; i++) in[i] = 6.0f * uniform();
    if (djl_silu_mul(in, out, 0, ROWS, INTER, 2 * INTER, 2) != 0) return fail("silu_mul status", 1, 0);
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < INTER; i++) {
            double g = in[r * 2 * INTER + i], u = in[r * 2 * INTER + INTER + i];
            double want = g / (1.0 + exp(-g)) * u;
            if (fabs(out[r * INTER + i] - want) > 1e-5 * (1 + fabs(want))) return fail("silu_mul", out[r * INTER + i], want);
        }
    printf("silu_mul fp32: ok\n");
    return 0;
}

static int check_row_stats(void) {
    enum { ROWS = 4, VOCAB = 49152 };
    static float logits[ROWS * VOCAB];
    int64_t argmax[ROWS];
    float log_z[ROWS];
    for (int i = 0; i < ROWS * VOCAB; i++) logits[i] = 8.0f * uniform();
    if (djl_row_stats(logits, 0, ROWS, VOCAB, VOCAB, argmax, log_z, 2) != 0) return fail("row_stats status", 1, 0);
    for (int r = 0; r < ROWS; r++) {
        const float *row = logits + (int64_t)r * VOCAB;
        int64_t best = 0;
        for (int64_t i = 1; i < VOCAB; i++) if (row[i] > row[best]) best = i;
        double sum = 0;
        for (int64_t i = 0; i < VOCAB; i++) sum += exp((double)row[i] - row[best]);
        double want = row[best] + log(sum);
        if (argmax[r] != best) return fail("row_stats argmax", (double)argmax[r], (double)best);
        if (fabs(log_z[r] - want) > 1e-4 * (1 + fabs(want))) return fail("row_stats log_z", log_z[r], want);
    }
    printf("row_stats fp32: ok\n");
    return 0;
}

/* The int8 GEMM's bits: exact integer sums, then ((float)sum * wscale) * xscale + bias, in IEEE
 * arithmetic (this driver is built without fast-math); each row alone gives the same bits. */
static int check_int8_gemm(void) {
    enum { ROWS = 6, N = 37, K = 83 };
    static int8_t q[N * K];
    static float x[ROWS * K], ws[N], bias[N], out[ROWS * N], alone[N];
    for (int i = 0; i < N * K; i++) q[i] = (int8_t)(i % 11 == 0 ? (i % 2 ? 127 : -127) : (int)(127 * uniform()));
    for (int j = 0; j < N; j++) { ws[j] = 0.01f * (1.5f + uniform()); bias[j] = uniform(); }
    for (int i = 0; i < ROWS * K; i++) x[i] = uniform() * (i / K == 2 ? 50.0f : 1.0f);
    for (int i = 0; i < K; i++) x[4 * K + i] = 0.0f; /* a zero row */
    int8_t *packed = malloc((size_t)djl_int8_packed_bytes(N, K));
    int32_t colsum[(N + 15) / 16 * 16];
    if (!packed || djl_int8_pack(q, N, K, packed, colsum) != 0) return fail("int8 pack", 1, 0);
    if (djl_int8_gemm(x, ROWS, K, K, packed, colsum, ws, bias, out, N, 2) != 0) return fail("int8 status", 1, 0);
    for (int r = 0; r < ROWS; r++) {
        const float *row = x + r * K;
        float peak = 0.0f;
        for (int i = 0; i < K; i++) peak = fabsf(row[i]) > peak ? fabsf(row[i]) : peak;
        float inv = peak > 0.0f ? 127.0f / peak : 0.0f, xscale = peak / 127.0f;
        if (djl_int8_gemm(row, 1, K, K, packed, colsum, ws, bias, alone, N, 2) != 0) return fail("int8 status", 1, 0);
        for (int j = 0; j < N; j++) {
            int64_t sum = 0;
            for (int i = 0; i < K; i++) sum += (int64_t)nearbyintf(row[i] * inv) * q[j * K + i];
            float want = (float)sum * ws[j];
            want = want * xscale;
            want = want + bias[j];
            if (out[r * N + j] != want) return fail("int8_gemm", out[r * N + j], want);
            if (alone[j] != want) return fail("int8_gemm one row", alone[j], want);
        }
    }
    free(packed);
    printf("int8_gemm: ok\n");
    return 0;
}

int main(void) {
    if (check_rms_norm() || check_silu_mul() || check_row_stats() || check_int8_gemm()) return 1;
    printf("ok\n");
    return 0;
}
