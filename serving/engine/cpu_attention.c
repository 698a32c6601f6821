/* Decode attention over the paged KV cache in place, float32, one query per sequence.
 *
 * The engine's Python side (serving/engine/cpu_attention.py) compiles this file once per machine
 * with the system's C compiler and calls it through ctypes; see there for why it exists.
 *
 * Layout, as serving/engine/attention.py keeps it:
 *   q       [B, H, D]                 one query row per sequence, H = Hkv * G heads
 *   k, v    [Hkv, NB, BS, D]          one layer's cache (K and V halves), NB blocks of BS tokens
 *   tables  [B, max_blocks] int64     each sequence's block ids, padded past its length
 *   lens    [B] int64                 each sequence's context length (its keys 0 .. len-1)
 *   out     [B, H, D]
 *   scratch [G * max_len] float       scores of one (sequence, kv head)
 *
 * Per (sequence, kv head): the G query heads of the group read each key and value once
 * (grouped-query heads folded, as the gather path does), scores -> softmax -> weighted values.
 * The softmax subtracts the row maximum and uses a vectorisable exp (Cody-Waite range
 * reduction, degree-6 polynomial: within 2 ulp of expf over the range it sees, x <= 0).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_GROUP 64
#define MAX_DIM 512
#define MAX_GROUP_DIM 8192 /* G * D: the accumulators of one group, 32 KiB */

static inline float exp_nonpositive(float x) {
    /* exp(x) for x <= 0; below -87 it is 0 in float32 (denormals flushed to 0 as well). */
    if (x < -87.0f) x = -87.0f;
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    float n = nearbyintf(x * log2e);
    float r = x - n * ln2_hi;
    r = r - n * ln2_lo;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { float f; int32_t i; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    return p * scale.f;
}

/* One (sequence, kv head): the G query heads of the group read each key and value once.
 * Inlined with D a constant where the head size is common (64, 128). */
static inline __attribute__((always_inline)) void attend_group(
    const float *qg, const float *kh, const float *vh, const int64_t *table, int64_t len,
    float *out, float *scratch, int64_t G, const int64_t D, int64_t BS, float scale) {
    /* scores[g * len + t] = scale * q_g . k_t */
    const float *kb = kh, *vb = vh;
    for (int64_t t = 0, j = BS, blk = -1; t < len; t++, j++) {
        if (j == BS) j = 0, kb = kh + table[++blk] * BS * D;
        const float *kt = kb + j * D;
        for (int64_t g = 0; g < G; g++) {
            const float *qv = qg + g * D;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; d++) dot += qv[d] * kt[d];
            scratch[g * len + t] = dot * scale;
        }
    }
    float inv_sum[MAX_GROUP];
    for (int64_t g = 0; g < G; g++) {
        float *s = scratch + g * len;
        float mx = s[0];
        for (int64_t t = 1; t < len; t++) mx = s[t] > mx ? s[t] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; t++) {
            s[t] = exp_nonpositive(s[t] - mx);
            sum += s[t];
        }
        inv_sum[g] = 1.0f / sum;
    }
    float acc[MAX_GROUP_DIM];
    for (int64_t i = 0; i < G * D; i++) acc[i] = 0.0f;
    for (int64_t t = 0, j = BS, blk = -1; t < len; t++, j++) {
        if (j == BS) j = 0, vb = vh + table[++blk] * BS * D;
        const float *vt = vb + j * D;
        for (int64_t g = 0; g < G; g++) {
            const float p = scratch[g * len + t];
            float *a = acc + g * D;
#pragma omp simd
            for (int64_t d = 0; d < D; d++) a[d] += p * vt[d];
        }
    }
    for (int64_t g = 0; g < G; g++) {
        float *o = out + g * D;
        const float w = inv_sum[g];
#pragma omp simd
        for (int64_t d = 0; d < D; d++) o[d] = acc[g * D + d] * w;
    }
}

int tideserve_paged_decode_f32(const float *q, const float *k, const float *v,
                               const int64_t *tables, const int64_t *lens, float *out,
                               float *scratch, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                               int64_t BS, int64_t NB, int64_t max_blocks, float scale) {
    if (Hkv <= 0 || H % Hkv != 0 || H / Hkv > MAX_GROUP || D > MAX_DIM) return 1;
    if ((H / Hkv) * D > MAX_GROUP_DIM) return 1;
    const int64_t G = H / Hkv;
    const int64_t head_stride = NB * BS * D;
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = lens[b];
        const int64_t *table = tables + b * max_blocks;
        if (len <= 0 || (len + BS - 1) / BS > max_blocks) return 2;
        for (int64_t i = 0; i < (len + BS - 1) / BS; i++)
            if (table[i] < 0 || table[i] >= NB) return 3;
        for (int64_t h = 0; h < Hkv; h++) {
            const float *kh = k + h * head_stride, *vh = v + h * head_stride;
            const float *qg = q + (b * H + h * G) * D;
            float *og = out + (b * H + h * G) * D;
            if (D == 64)
                attend_group(qg, kh, vh, table, len, og, scratch, G, 64, BS, scale);
            else if (D == 128)
                attend_group(qg, kh, vh, table, len, og, scratch, G, 128, BS, scale);
            else
                attend_group(qg, kh, vh, table, len, og, scratch, G, D, BS, scale);
        }
    }
    return 0;
}
