/* y = x W^T + b in float32 for the few-row matmuls of CPU decode, AVX2 + FMA.
 *
 * The engine's Python side (serving/engine/cpu_matmul.py) packs each weight once, compiles this
 * file once per machine with the system's C compiler and calls it through ctypes; see there for
 * why it exists.
 *
 * Layout:
 *   x       [M, K]            the rows (one per decoding sequence, or a prompt's tokens)
 *   packed  [P, K, NR]        W [N, K] cut into P = ceil(N / NR) panels of NR output columns,
 *                             each stored k-major, the last one zero-padded
 *   bias    [N] or NULL
 *   out     [M, N]
 *   xt      [ceil(M / 16), K, 16]  scratch: x transposed in chunks of 16 rows, zero-padded
 *
 * The inner tile keeps 16 rows x 6 columns in 12 ymm accumulators: per k it loads 16 values of
 * x^T (two vectors, from L1) and broadcasts the panel's 6 weights, so every weight is read from
 * memory exactly once, in address order, and each feeds 16 rows (2 FMAs). Chunks of at most 8
 * rows take two panels at a time instead (12 accumulators of 8 rows), so a small batch does not
 * pay for 16. Panels are split among threads in blocks of PANEL_BLOCK (the weights of a block
 * stay in L2 while every chunk of a long prompt passes over them).
 */
#include <stdint.h>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "cpu_matmul.c needs AVX2 and FMA (x86-64-v3)"
#endif
#include <immintrin.h>

#define NR 6
#define ROWS 16
#define PANEL_BLOCK 8 /* even: the 8-row tile takes panels in pairs */

static inline void store(float t[][ROWS], float *out, int64_t ldo, int64_t rows, int64_t cols,
                         const float *bias) {
    for (int64_t m = 0; m < rows; m++)
        for (int64_t j = 0; j < cols; j++) out[m * ldo + j] = t[j][m] + (bias ? bias[j] : 0.0f);
}

/* 16 rows x one panel of 6 columns. */
static void tile16(const float *xt, const float *w, int64_t K, float *out, int64_t ldo,
                   int64_t rows, int64_t cols, const float *bias) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0;
    __m256 d0 = a0, d1 = a0, e0 = a0, e1 = a0, f0 = a0, f1 = a0;
    for (int64_t k = 0; k < K; k++, w += NR) {
        const __m256 x0 = _mm256_loadu_ps(xt + k * ROWS), x1 = _mm256_loadu_ps(xt + k * ROWS + 8);
        __m256 s = _mm256_broadcast_ss(w + 0);
        a0 = _mm256_fmadd_ps(s, x0, a0), a1 = _mm256_fmadd_ps(s, x1, a1);
        s = _mm256_broadcast_ss(w + 1);
        b0 = _mm256_fmadd_ps(s, x0, b0), b1 = _mm256_fmadd_ps(s, x1, b1);
        s = _mm256_broadcast_ss(w + 2);
        c0 = _mm256_fmadd_ps(s, x0, c0), c1 = _mm256_fmadd_ps(s, x1, c1);
        s = _mm256_broadcast_ss(w + 3);
        d0 = _mm256_fmadd_ps(s, x0, d0), d1 = _mm256_fmadd_ps(s, x1, d1);
        s = _mm256_broadcast_ss(w + 4);
        e0 = _mm256_fmadd_ps(s, x0, e0), e1 = _mm256_fmadd_ps(s, x1, e1);
        s = _mm256_broadcast_ss(w + 5);
        f0 = _mm256_fmadd_ps(s, x0, f0), f1 = _mm256_fmadd_ps(s, x1, f1);
    }
    float t[NR][ROWS];
    _mm256_storeu_ps(t[0], a0), _mm256_storeu_ps(t[0] + 8, a1);
    _mm256_storeu_ps(t[1], b0), _mm256_storeu_ps(t[1] + 8, b1);
    _mm256_storeu_ps(t[2], c0), _mm256_storeu_ps(t[2] + 8, c1);
    _mm256_storeu_ps(t[3], d0), _mm256_storeu_ps(t[3] + 8, d1);
    _mm256_storeu_ps(t[4], e0), _mm256_storeu_ps(t[4] + 8, e1);
    _mm256_storeu_ps(t[5], f0), _mm256_storeu_ps(t[5] + 8, f1);
    store(t, out, ldo, rows, cols, bias);
}

/* At most 8 rows x two panels (12 columns); v is w again when there is no second panel (cols
 * <= 6 then, and its results are not stored). */
static void tile8(const float *xt, const float *w, const float *v, int64_t K, float *out,
                  int64_t ldo, int64_t rows, int64_t cols, const float *bias) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0;
    for (int64_t k = 0; k < K; k++, w += NR, v += NR) {
        const __m256 x = _mm256_loadu_ps(xt + k * ROWS);
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + 0), x, a0);
        a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + 1), x, a1);
        a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + 2), x, a2);
        a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + 3), x, a3);
        a4 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + 4), x, a4);
        a5 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + 5), x, a5);
        b0 = _mm256_fmadd_ps(_mm256_broadcast_ss(v + 0), x, b0);
        b1 = _mm256_fmadd_ps(_mm256_broadcast_ss(v + 1), x, b1);
        b2 = _mm256_fmadd_ps(_mm256_broadcast_ss(v + 2), x, b2);
        b3 = _mm256_fmadd_ps(_mm256_broadcast_ss(v + 3), x, b3);
        b4 = _mm256_fmadd_ps(_mm256_broadcast_ss(v + 4), x, b4);
        b5 = _mm256_fmadd_ps(_mm256_broadcast_ss(v + 5), x, b5);
    }
    float t[2 * NR][ROWS];
    _mm256_storeu_ps(t[0], a0), _mm256_storeu_ps(t[1], a1), _mm256_storeu_ps(t[2], a2);
    _mm256_storeu_ps(t[3], a3), _mm256_storeu_ps(t[4], a4), _mm256_storeu_ps(t[5], a5);
    _mm256_storeu_ps(t[6], b0), _mm256_storeu_ps(t[7], b1), _mm256_storeu_ps(t[8], b2);
    _mm256_storeu_ps(t[9], b3), _mm256_storeu_ps(t[10], b4), _mm256_storeu_ps(t[11], b5);
    store(t, out, ldo, rows, cols, bias);
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

int tideserve_linear_f32(const float *x, const float *packed, const float *bias, float *out,
                         float *xt, int64_t M, int64_t N, int64_t K, int64_t num_threads) {
    if (M < 1 || N < 1 || K < 1) return 1;
    const int64_t chunks = (M + ROWS - 1) / ROWS, panels = (N + NR - 1) / NR;
    for (int64_t c = 0; c < chunks; c++) {
        float *xc = xt + c * K * ROWS;
        const int64_t rows = min64(M - c * ROWS, ROWS);
        for (int64_t k = 0; k < K; k++) {
            for (int64_t m = 0; m < rows; m++) xc[k * ROWS + m] = x[(c * ROWS + m) * K + k];
            for (int64_t m = rows; m < ROWS; m++) xc[k * ROWS + m] = 0.0f;
        }
    }
    const int64_t blocks = (panels + PANEL_BLOCK - 1) / PANEL_BLOCK;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t p0 = b * PANEL_BLOCK, p1 = min64(p0 + PANEL_BLOCK, panels);
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t rows = min64(M - c * ROWS, ROWS);
            const float *xc = xt + c * K * ROWS;
            float *oc = out + c * ROWS * N;
            for (int64_t p = p0; p < p1; p += rows > 8 ? 1 : 2) {
                const float *w = packed + p * K * NR, *bp = bias ? bias + p * NR : 0;
                if (rows > 8) {
                    tile16(xc, w, K, oc + p * NR, N, rows, min64(N - p * NR, NR), bp);
                } else {
                    const float *v = p + 1 < p1 ? w + K * NR : w;
                    const int64_t cols = min64(N - p * NR, (p + 1 < p1 ? 2 : 1) * NR);
                    tile8(xc, w, v, K, oc + p * NR, N, rows, cols, bp);
                }
            }
        }
    }
    return 0;
}
