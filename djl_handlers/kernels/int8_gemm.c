/* Int8 GEMM with per-row dynamic activations (djl_handlers.kernels.int8_gemm).
 *
 *     out[r][j] = ((float)sum_k(qx[r][k] * qw[j][k]) * wscale[j]) * xscale[r]  (+ bias[j])
 *
 * qw: int8 weights in [-127, 127] with one fp32 scale per output channel, stored once in the
 * blocked layout of djl_int8_pack: 16 output channels by 4 inputs per 64 bytes, the 64-byte
 * chunks of one block of 16 channels consecutive along the inputs (what one 512-bit or two 256-bit
 * registers multiply at once). qx: each row of x quantized on the fly, symmetric, by its own peak:
 * qx = round(x * 127 / max|x|), xscale = max|x| / 127.
 *
 * Exactness: the integer sums are exact (|qx|, |qw| <= 127), so their order, the register
 * blocking, the row tiling and the thread split change nothing; each output is then two fp32
 * multiplies (and an add) in a fixed order. Built without fast-math and without FMA contraction,
 * so a row's bits depend on that row alone, whatever the number of rows in the call, and are the
 * same on every instruction path below.
 *
 * Paths, chosen at compile time (-march): AVX-512 VNNI (vpdpbusd, unsigned x signed bytes: the
 * activations carry +128 and 128 * sum_k(qw[j][k]) is subtracted), AVX-VNNI (the same on 256-bit
 * registers), AVX2 (vpmaddubsw on |qx| and qw carrying qx's sign: each product pair is at most
 * 2 * 127 * 127 = 32,258, so the 16-bit pair sums never saturate, then vpmaddwd to 32 bits), and
 * portable C (arm64, older x86).
 *
 * Threads: one OpenMP region; rows are quantized first, then the blocks of 16 channels are split
 * between the threads, each running every row tile over its blocks (a block's weights stay in
 * cache across the tiles). Tiles: 6 rows over two neighbouring blocks on AVX-512 VNNI (each
 * broadcast chunk of a row feeds two multiplies), 4 rows over one block on the 256-bit paths.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define PATH 3
#define UNSIGNED_X 1
#elif defined(__AVXVNNI__) && defined(__AVX2__)
#define PATH 2
#define UNSIGNED_X 1
#elif defined(__AVX2__)
#define PATH 1
#define UNSIGNED_X 0
#else
#define PATH 0
#define UNSIGNED_X 0
#endif

#define BLOCK 16 /* output channels per block */
#if PATH == 3
#define TILE 6 /* rows per tile: 12 of the 32 vector registers accumulate */
#else
#define TILE 4 /* rows per tile: 8 of the 16 vector registers accumulate */
#endif
#define CHUNK (BLOCK * 4)
#define PARALLEL_MIN (1 << 16) /* multiply-adds below which one thread runs the call */

/* 3: AVX-512 VNNI, 2: AVX-VNNI, 1: AVX2, 0: portable C. */
int djl_int8_path(void) { return PATH; }

static int64_t groups(int64_t k) { return (k + 3) / 4; }

/* Bytes of the packed weight of an [n, k] int8 matrix. */
int64_t djl_int8_packed_bytes(int64_t n, int64_t k) { return (n + BLOCK - 1) / BLOCK * groups(k) * CHUNK; }

/* q [n, k] int8, row-major, into `packed` (djl_int8_packed_bytes) and colsum [n rounded up to 16]:
 * each channel's sum of weights (what the unsigned-activation paths subtract 128 times). */
int djl_int8_pack(const int8_t *q, int64_t n, int64_t k, int8_t *packed, int32_t *colsum) {
    int64_t g = groups(k), blocks = (n + BLOCK - 1) / BLOCK;
    for (int64_t b = 0; b < blocks; b++) {
        for (int64_t c = 0; c < BLOCK; c++) {
            int64_t j = b * BLOCK + c;
            int32_t sum = 0;
            for (int64_t kk = 0; kk < g * 4; kk++) {
                int8_t v = (j < n && kk < k) ? q[j * k + kk] : 0;
                packed[((b * g + kk / 4) * BLOCK + c) * 4 + kk % 4] = v;
                sum += v;
            }
            colsum[j] = sum;
        }
    }
    return 0;
}

/* One row of x into `dst` (g * 4 bytes, zero-padded); returns its scale max|x| / 127. */
static float quantize_row(const float *x, int64_t k, int64_t g, uint8_t *dst) {
    float peak = 0.0f;
    int nan = 0;
#pragma omp simd reduction(max : peak) reduction(| : nan)
    for (int64_t i = 0; i < k; i++) {
        float a = fabsf(x[i]);
        peak = a > peak ? a : peak;
        nan |= a != a;
    }
    const uint8_t offset = UNSIGNED_X ? 128 : 0;
    if (nan || isinf(peak) || peak == 0.0f) { /* a zero row gives zeros; NaN or inf gives NaN outputs */
        memset(dst, offset, (size_t)(g * 4));
        return peak == 0.0f && !nan ? 0.0f : NAN;
    }
    const float inv = 127.0f / peak;
#pragma omp simd
    for (int64_t i = 0; i < k; i++) {
        float v = nearbyintf(x[i] * inv);
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        dst[i] = (uint8_t)((int32_t)v + offset);
    }
    memset(dst + k, offset, (size_t)(g * 4 - k));
    return peak / 127.0f;
}

#if PATH == 3
static inline __attribute__((always_inline)) void tile(const uint8_t *x, int64_t ldq, int rows, const int8_t *w,
                                                       int64_t g, int32_t *acc) {
    __m512i s[TILE], t[TILE];
    for (int r = 0; r < rows; r++) s[r] = t[r] = _mm512_setzero_si512();
    int64_t i = 0;
    for (; i + 1 < g; i += 2) {
        __m512i w0 = _mm512_loadu_si512(w + i * CHUNK), w1 = _mm512_loadu_si512(w + (i + 1) * CHUNK);
        for (int r = 0; r < rows; r++) {
            int32_t a, b;
            memcpy(&a, x + r * ldq + i * 4, 4);
            memcpy(&b, x + r * ldq + i * 4 + 4, 4);
            s[r] = _mm512_dpbusd_epi32(s[r], _mm512_set1_epi32(a), w0);
            t[r] = _mm512_dpbusd_epi32(t[r], _mm512_set1_epi32(b), w1);
        }
    }
    if (i < g) {
        __m512i w0 = _mm512_loadu_si512(w + i * CHUNK);
        for (int r = 0; r < rows; r++) {
            int32_t a;
            memcpy(&a, x + r * ldq + i * 4, 4);
            s[r] = _mm512_dpbusd_epi32(s[r], _mm512_set1_epi32(a), w0);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_si512(acc + r * BLOCK, _mm512_add_epi32(s[r], t[r]));
}

/* Two neighbouring blocks at once (`w` and `w + stride`): each broadcast row chunk feeds two
 * multiplies, so a tile of several rows loads less per multiply (prompts). acc: [rows][2][16]. */
#define WIDE 2
static inline __attribute__((always_inline)) void tile2(const uint8_t *x, int64_t ldq, int rows, const int8_t *w,
                                                        int64_t stride, int64_t g, int32_t *acc) {
    __m512i s[TILE], t[TILE];
    for (int r = 0; r < rows; r++) s[r] = t[r] = _mm512_setzero_si512();
    for (int64_t i = 0; i < g; i++) {
        __m512i w0 = _mm512_loadu_si512(w + i * CHUNK), w1 = _mm512_loadu_si512(w + stride + i * CHUNK);
        for (int r = 0; r < rows; r++) {
            int32_t a;
            memcpy(&a, x + r * ldq + i * 4, 4);
            __m512i xa = _mm512_set1_epi32(a);
            s[r] = _mm512_dpbusd_epi32(s[r], xa, w0);
            t[r] = _mm512_dpbusd_epi32(t[r], xa, w1);
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_si512(acc + r * 2 * BLOCK, s[r]);
        _mm512_storeu_si512(acc + r * 2 * BLOCK + BLOCK, t[r]);
    }
}
#elif PATH == 2 || PATH == 1
static inline __attribute__((always_inline)) __m256i dot4(__m256i acc, __m256i x4, __m256i w) {
#if PATH == 2
    return _mm256_dpbusd_avx_epi32(acc, x4, w);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(x4), _mm256_sign_epi8(w, x4));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
#endif
}

static inline __attribute__((always_inline)) void tile(const uint8_t *x, int64_t ldq, int rows, const int8_t *w,
                                                       int64_t g, int32_t *acc) {
    __m256i lo[TILE], hi[TILE];
    for (int r = 0; r < rows; r++) lo[r] = hi[r] = _mm256_setzero_si256();
    for (int64_t i = 0; i < g; i++) {
        __m256i wl = _mm256_loadu_si256((const __m256i *)(w + i * CHUNK));
        __m256i wh = _mm256_loadu_si256((const __m256i *)(w + i * CHUNK + 32));
        for (int r = 0; r < rows; r++) {
            int32_t a;
            memcpy(&a, x + r * ldq + i * 4, 4);
            __m256i x4 = _mm256_set1_epi32(a);
            lo[r] = dot4(lo[r], x4, wl);
            hi[r] = dot4(hi[r], x4, wh);
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i *)(acc + r * BLOCK), lo[r]);
        _mm256_storeu_si256((__m256i *)(acc + r * BLOCK + 8), hi[r]);
    }
}
#else
static void tile(const uint8_t *x, int64_t ldq, int rows, const int8_t *w, int64_t g, int32_t *acc) {
    for (int r = 0; r < rows; r++) {
        const int8_t *xr = (const int8_t *)(x + r * ldq);
        int32_t *ar = acc + r * BLOCK;
        for (int c = 0; c < BLOCK; c++) ar[c] = 0;
        for (int64_t i = 0; i < g; i++) {
            const int8_t *wi = w + i * CHUNK;
            for (int c = 0; c < BLOCK; c++) {
                int32_t sum = 0;
                for (int t = 0; t < 4; t++) sum += (int32_t)xr[i * 4 + t] * (int32_t)wi[c * 4 + t];
                ar[c] += sum;
            }
        }
    }
}
#endif

#ifdef WIDE
static void run_tile2(const uint8_t *x, int64_t ldq, int rows, const int8_t *w, int64_t stride, int64_t g,
                      int32_t *acc) {
    switch (rows) {
    case 6: tile2(x, ldq, 6, w, stride, g, acc); break;
    case 5: tile2(x, ldq, 5, w, stride, g, acc); break;
    case 4: tile2(x, ldq, 4, w, stride, g, acc); break;
    case 3: tile2(x, ldq, 3, w, stride, g, acc); break;
    case 2: tile2(x, ldq, 2, w, stride, g, acc); break;
    default: tile2(x, ldq, 1, w, stride, g, acc); break;
    }
}
#else
#define WIDE 1
#endif

static void run_tile(const uint8_t *x, int64_t ldq, int rows, const int8_t *w, int64_t g, int32_t *acc) {
    switch (rows) { /* constant row counts: the accumulators stay in registers */
#if TILE == 6
    case 6: tile(x, ldq, 6, w, g, acc); break;
    case 5: tile(x, ldq, 5, w, g, acc); break;
#endif
    case 4: tile(x, ldq, 4, w, g, acc); break;
    case 3: tile(x, ldq, 3, w, g, acc); break;
    case 2: tile(x, ldq, 2, w, g, acc); break;
    default: tile(x, ldq, 1, w, g, acc); break;
    }
}

/* The same two multiplies (and add) for every output, whatever tile or path produced its sum. */
static void epilogue(const int32_t *acc, const int32_t *colsum, const float *wscale, const float *bias, float xscale,
                     float *out, int64_t count) {
    for (int64_t c = 0; c < count; c++) {
        int32_t sum = acc[c] - (UNSIGNED_X ? 128 * colsum[c] : 0);
        float v = (float)sum * wscale[c];
        v = v * xscale;
        if (bias) v = v + bias[c];
        out[c] = v;
    }
}

/* x [rows, k] fp32 (rows `ldx` floats apart, unit column stride) times the packed weight of an
 * [n, k] matrix into out [rows, n] (contiguous). bias may be NULL. Returns 0, or 1 when the
 * scratch buffer cannot be allocated. */
int djl_int8_gemm(const float *x, int64_t rows, int64_t ldx, int64_t k, const int8_t *packed, const int32_t *colsum,
                  const float *wscale, const float *bias, float *out, int64_t n, int threads) {
    int64_t g = groups(k), ldq = g * 4, blocks = (n + BLOCK - 1) / BLOCK;
    uint8_t *qx = malloc((size_t)(rows * ldq) + 64);
    float *xscale = malloc(sizeof(float) * (size_t)(rows > 0 ? rows : 1));
    if (!qx || !xscale) {
        free(qx);
        free(xscale);
        return 1;
    }
    int use = (threads > 1 && blocks > 1 && rows * k * n >= PARALLEL_MIN) ? threads : 1;
#pragma omp parallel num_threads(use) if (use > 1)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) xscale[r] = quantize_row(x + r * ldx, k, g, qx + r * ldq);
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < (blocks + WIDE - 1) / WIDE; pair++) {
            int32_t acc[TILE * WIDE * BLOCK];
            int64_t b = pair * WIDE, width = blocks - b < WIDE ? blocks - b : WIDE; /* blocks in this step */
            const int8_t *w = packed + b * g * CHUNK;
            for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
                int tile_rows = (int)(rows - r0 < TILE ? rows - r0 : TILE);
#if WIDE == 2
                if (width == 2 && rows > 1) /* one row reads the weights once either way: the narrow tile's */
                    run_tile2(qx + r0 * ldq, ldq, tile_rows, w, g * CHUNK, g, acc); /* two sums per row */
                else
#endif
                    for (int64_t k = 0; k < width; k++) { /* one block at a time, kept as [rows][WIDE][16] */
                        int32_t one[TILE * BLOCK];
                        run_tile(qx + r0 * ldq, ldq, tile_rows, w + k * g * CHUNK, g, one);
                        for (int r = 0; r < tile_rows; r++)
                            memcpy(acc + (r * WIDE + k) * BLOCK, one + r * BLOCK, sizeof(int32_t) * BLOCK);
                    }
                for (int64_t k = 0; k < width; k++) {
                    int64_t j0 = (b + k) * BLOCK, count = n - j0 < BLOCK ? n - j0 : BLOCK;
                    for (int r = 0; r < tile_rows; r++)
                        epilogue(acc + (r * WIDE + k) * BLOCK, colsum + j0, wscale + j0, bias ? bias + j0 : NULL,
                                 xscale[r0 + r], out + (r0 + r) * n + j0, count);
                }
            }
        }
    }
    free(qx);
    free(xscale);
    return 0;
}
