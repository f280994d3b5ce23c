/* Keyed init values on the CPU: the operations of torchtitan_lite/init/counter.py, element by element, in the
 * same order, so the bits are those of its torch ops (tests/test_init_golden.py compares them). Built by
 * torchtitan_lite/init/native.py with -O3 -ffp-contract=off (no FMA contraction, no fast math): every float
 * operation is an IEEE-rounded float32 (or float64 for float64 laws) + - *; Philox's 32 x 32 -> 64-bit products
 * are uint64 products of zero-extended words (one vpmuludq per 4 lanes on AVX2). */
#include <stdint.h>
#include <string.h>

static const float LN_POLY[10] = {1.0f, -0.49999988079071045f, 0.33333325386047363f, -0.25001585483551025f,
                                  0.2000207155942917f, -0.16609126329421997f, 0.14180079102516174f,
                                  -0.13240842521190643f, 0.129141703248024f, -0.07638592272996902f};
static const float SIN_POLY[5] = {1.0f, -0.1666666716337204f, 0.008333333767950535f, -0.00019841270113829523f,
                                  2.7557318844628753e-06f};
static const float COS_POLY[6] = {1.0f, -0.5f, 0.0416666679084301f, -0.0013888889225199819f,
                                  2.4801587642286904e-05f, -2.755731998149713e-07f};
#define SQRT2_F32 1.4142135381698608f
#define LN2_F32 0.6931471824645996f
#define HALF_PI_F32 1.5707963705062866f

static inline float from_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t to_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

static inline float horner(float x, const float *c, int n) {
    float out = x * c[n - 1] + c[n - 2];
    for (int k = n - 3; k >= 0; k--) out = out * x + c[k];
    return out;
}

static inline float log_uniform(uint32_t w) {
    int32_t ws = (int32_t)w;
    float scaled = ((float)ws + 0.5f) * 0x1p-32f;
    float u = ws < 0 ? scaled + 1.0f : scaled;
    uint32_t bits = to_bits(u);
    float m = from_bits((bits & 0x007FFFFFu) | 0x3F800000u);
    int32_t e = (int32_t)(bits >> 23) - 127;
    int high = m > SQRT2_F32;
    float f = (high ? m * 0.5f : m) - 1.0f;
    e = high ? e + 1 : e;
    return (float)e * LN2_F32 + f * horner(f, LN_POLY, 10);
}

static inline float sqrt32(float x) {
    float x_safe = x < 0x1p-60f ? 0x1p-60f : x;
    float y = from_bits(0x5F3759DFu - (to_bits(x_safe) >> 1));
    float half = x_safe * 0.5f;
    for (int k = 0; k < 3; k++) y = y * (1.5f - half * y * y);
    return x * y;
}

static inline void box_muller(uint32_t uw, uint32_t tw, float *z_cos, float *z_sin) {
    float r = sqrt32(log_uniform(uw) * -2.0f);
    uint32_t quadrant = tw >> 30;
    float f = ((float)(int32_t)((tw >> 7) & 0x7FFFFFu) + 0.5f) * 0x1p-23f;
    int mirror = f > 0.5f;
    float x = (mirror ? 1.0f - f : f) * HALF_PI_F32;
    float x2 = x * x;
    float sin_x = x * horner(x2, SIN_POLY, 5), cos_x = horner(x2, COS_POLY, 6);
    float sin_f = mirror ? cos_x : sin_x, cos_f = mirror ? sin_x : cos_x;
    uint32_t odd = quadrant & 1, flip = quadrant >> 1;  /* rotate by pi / 2 if odd, by pi if flip: sign bits */
    float sin_t = from_bits(to_bits(odd ? cos_f : sin_f) ^ (flip << 31));
    float cos_t = from_bits(to_bits(odd ? sin_f : cos_f) ^ ((odd ^ flip) << 31));
    *z_cos = r * cos_t;
    *z_sin = r * sin_t;
}

#define TILE 64

/* Philox blocks in tiles of TILE (struct of arrays: each stage a loop the compiler vectorizes). */
static inline void tile_words(const int64_t *block, int m, uint32_t attempt, uint32_t k0, uint32_t k1, uint32_t salt,
                              uint32_t c[4][TILE]) {
    for (int i = 0; i < m; i++) {
        uint64_t b = (uint64_t)block[i];
        c[0][i] = (uint32_t)b; c[1][i] = (uint32_t)(b >> 32); c[2][i] = attempt; c[3][i] = salt;
    }
    for (int r = 0; r < 10; r++) {
        for (int i = 0; i < m; i++) {
            uint64_t p0 = (uint64_t)c[0][i] * 0xD2511F53u, p1 = (uint64_t)c[2][i] * 0xCD9E8D57u;
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1][i] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3][i] ^ k1;
            c[0][i] = n0; c[1][i] = (uint32_t)p1; c[2][i] = n2; c[3][i] = (uint32_t)p0;
        }
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
}

static const double LOG_TERMS[8] = {1.0, 1.0 / 3, 1.0 / 5, 1.0 / 7, 1.0 / 9, 1.0 / 11, 1.0 / 13, 1.0 / 15};

/* float64 ln((w + 0.5) 2^-32) as counter.log_word_uniform computes it. */
static inline double log_word_uniform(uint32_t w) {
    double x = (double)(2 * (uint64_t)w + 1);
    uint64_t bits;
    memcpy(&bits, &x, 8);
    int64_t e = (int64_t)(bits >> 52) - 1023;
    uint64_t mb = (bits & ((1ull << 52) - 1)) | (1023ull << 52);
    double m;
    memcpy(&m, &mb, 8);
    int high = m > 1.4142135623730951;
    m = high ? m * 0.5 : m;
    e = high ? e + 1 : e;
    double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double out = s2 * LOG_TERMS[7] + LOG_TERMS[6];
    for (int k = 5; k >= 0; k--) out = out * s2 + LOG_TERMS[k];
    return (double)(e - 33) * 0.6931471805599453 + (s + s) * out;
}

/* The values of each block (out[4 i + j]: element 4 blocks[i] + j) and of each element (out[i]), scaled to
 * z std + mean in float32 or float64; the positions of out outside [lo, hi] go to bad (in order), their count is
 * returned. */
#define KERNELS(T, SUFFIX)                                                                                          \
    static int64_t check_##SUFFIX(const T *out, int64_t n, T lo, T hi, int64_t *bad) {                              \
        int64_t n_bad = 0;                                                                                          \
        for (int64_t i = 0; i < n; i++)                                                                             \
            if (out[i] < lo || out[i] > hi) bad[n_bad++] = i;                                                       \
        return n_bad;                                                                                               \
    }                                                                                                               \
    int64_t blocks_##SUFFIX(const int64_t *blocks, int64_t n, uint32_t attempt, uint32_t k0, uint32_t k1,           \
                            uint32_t salt, T mean, T std, T lo, T hi, T *out, int64_t *bad) {                       \
        for (int64_t base = 0; base < n; base += TILE) {                                                            \
            int m = n - base < TILE ? (int)(n - base) : TILE;                                                       \
            uint32_t c[4][TILE];                                                                                    \
            float z[4][TILE];                                                                                       \
            tile_words(blocks + base, m, attempt, k0, k1, salt, c);                                                 \
            for (int i = 0; i < m; i++) box_muller(c[0][i], c[1][i], &z[0][i], &z[1][i]);                          \
            for (int i = 0; i < m; i++) box_muller(c[2][i], c[3][i], &z[2][i], &z[3][i]);                          \
            for (int i = 0; i < m; i++)                                                                             \
                for (int j = 0; j < 4; j++) out[4 * (base + i) + j] = (T)z[j][i] * std + mean;                      \
        }                                                                                                           \
        return check_##SUFFIX(out, 4 * n, lo, hi, bad);                                                             \
    }                                                                                                               \
    int64_t elements_##SUFFIX(const int64_t *index, int64_t n, uint32_t attempt, uint32_t k0, uint32_t k1,          \
                              uint32_t salt, T mean, T std, T lo, T hi, T *out, int64_t *bad) {                     \
        for (int64_t base = 0; base < n; base += TILE) {                                                            \
            int m = n - base < TILE ? (int)(n - base) : TILE;                                                       \
            int64_t block[TILE];                                                                                    \
            uint32_t c[4][TILE], u[TILE], t[TILE];                                                                  \
            float z_cos[TILE], z_sin[TILE];                                                                         \
            for (int i = 0; i < m; i++) block[i] = index[base + i] >> 2;                                            \
            tile_words(block, m, attempt, k0, k1, salt, c);                                                         \
            for (int i = 0; i < m; i++) {                                                                           \
                int second = (index[base + i] & 2) != 0;                                                            \
                u[i] = second ? c[2][i] : c[0][i];                                                                  \
                t[i] = second ? c[3][i] : c[1][i];                                                                  \
            }                                                                                                       \
            for (int i = 0; i < m; i++) box_muller(u[i], t[i], &z_cos[i], &z_sin[i]);                              \
            for (int i = 0; i < m; i++)                                                                             \
                out[base + i] = (T)((index[base + i] & 1) ? z_sin[i] : z_cos[i]) * std + mean;                      \
        }                                                                                                           \
        return check_##SUFFIX(out, n, lo, hi, bad);                                                                 \
    }

/* Candidate values of the proposal (counter.py's element_words, draw.py's _proposal_elements): exponential with
 * rate (exponential != 0) or uniform on [alpha, beta] with the density's peak; mirrored when flip; scaled, clamped
 * into [lo, hi]; rejected positions go to bad. */
#define PROPOSAL(T, SUFFIX)                                                                                         \
    int64_t proposal_##SUFFIX(const int64_t *index, int64_t n, uint32_t attempt, uint32_t k0, uint32_t k1,          \
                              uint32_t salt, T mean, T std, T lo, T hi, double alpha, double beta, double rate,     \
                              double peak, int exponential, int flip, T *out, int64_t *bad) {                       \
        int64_t n_bad = 0;                                                                                          \
        for (int64_t base = 0; base < n; base += TILE) {                                                            \
            int m = n - base < TILE ? (int)(n - base) : TILE;                                                       \
            uint32_t c[4][TILE];                                                                                    \
            double z[TILE];                                                                                         \
            int reject[TILE];                                                                                       \
            tile_words(index + base, m, attempt, k0, k1, salt, c);                                                  \
            if (exponential)                                                                                        \
                for (int i = 0; i < m; i++) {                                                                       \
                    double log_u = log_word_uniform(c[1][i]);                                                       \
                    z[i] = alpha - log_word_uniform(c[0][i]) / rate;                                                \
                    reject[i] = (z[i] > beta) | (log_u > (z[i] - rate) * (z[i] - rate) * -0.5);                    \
                }                                                                                                   \
            else                                                                                                    \
                for (int i = 0; i < m; i++) {                                                                       \
                    double log_u = log_word_uniform(c[1][i]);                                                       \
                    z[i] = alpha + (beta - alpha) * (((double)c[0][i] + 0.5) * 0x1p-32);                            \
                    reject[i] = log_u > (peak * peak - z[i] * z[i]) * 0.5;                                          \
                }                                                                                                   \
            for (int i = 0; i < m; i++) {                                                                           \
                T v = (T)(flip ? -z[i] : z[i]) * std + mean;                                                        \
                out[base + i] = v < lo ? lo : (v > hi ? hi : v);                                                    \
            }                                                                                                       \
            for (int i = 0; i < m; i++)                                                                             \
                if (reject[i]) bad[n_bad++] = base + i;                                                             \
        }                                                                                                           \
        return n_bad;                                                                                               \
    }

KERNELS(float, f32)
KERNELS(double, f64)
PROPOSAL(float, f32)
PROPOSAL(double, f64)
