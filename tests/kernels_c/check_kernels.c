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

int main(void) {
    if (check_rms_norm() || check_silu_mul() || check_row_stats()) return 1;
    printf("ok\n");
    return 0;
}
