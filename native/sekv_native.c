/* sekv_gguf native module: see sekv_native.h */
#include "sekv_native.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

static inline float sekv_half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000u) << 16;
    const uint32_t exp  = (h >> 10) & 0x1fu;
    const uint32_t man  = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;                                     /* +-0 */
        } else {                                             /* subnormal: normalise */
            uint32_t e = 113, m = man;                       /* 127 - 15 + 1 */
            while ((m & 0x400u) == 0) { m <<= 1; e--; }
            bits = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);             /* inf / NaN */
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);    /* 127 - 15 = 112 */
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static inline uint16_t sekv_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    const uint16_t sign = (uint16_t) ((x >> 16) & 0x8000u);
    const uint32_t ax   = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {                                  /* inf or NaN */
        return (uint16_t) (sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
    }
    if (ax >= 0x477ff000u) {                                  /* rounds to >= 65536: overflow */
        return (uint16_t) (sign | 0x7c00u);
    }
    if (ax < 0x38800000u) {                                   /* below the smallest normal half (2^-14) */
        if (ax < 0x33000000u) {                               /* below half the smallest subnormal: +-0 */
            return sign;
        }
        const uint32_t e     = ax >> 23;
        const uint32_t m     = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e;                      /* 14..24 */
        uint32_t       r     = m >> shift;
        const uint32_t rem   = m & ((1u << shift) - 1u);
        const uint32_t half  = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) {
            r++;
        }
        return (uint16_t) (sign | r);
    }
    /* normal: rebias the exponent, round the mantissa to nearest even (a carry into the exponent is correct) */
    uint32_t       r   = ax - 0x38000000u;                    /* (127 - 15) << 23 */
    const uint32_t rem = r & 0x1fffu;
    r >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) {
        r++;
    }
    return (uint16_t) (sign | r);
}

/* n rows of row_bytes must fit in ptrdiff_t */
static int32_t sekv_check_rows(int64_t rows, int64_t row_bytes) {
    if (rows < 0 || row_bytes <= 0) {
        return SEKV_N_ERR_SIZE;
    }
    if (rows > 0 && row_bytes > (int64_t) (PTRDIFF_MAX / rows)) {
        return SEKV_N_ERR_SIZE;
    }
    return SEKV_N_OK;
}

/* shared checks of gather/scatter: idx indexes a buffer of n_idx_space rows; n rows move between both sides */
static int32_t sekv_check_move(const void * src, const void * dst, const int32_t * idx, int64_t n,
                               int64_t n_src, int64_t n_dst, int64_t row_bytes, int64_t n_linear, int64_t n_indexed) {
    int32_t rc;
    if ((rc = sekv_check_rows(n_src, row_bytes)) != SEKV_N_OK) return rc;
    if ((rc = sekv_check_rows(n_dst, row_bytes)) != SEKV_N_OK) return rc;
    if (n < 0) return SEKV_N_ERR_SIZE;
    if (n == 0) return SEKV_N_OK;
    if (src == NULL || dst == NULL || idx == NULL) return SEKV_N_ERR_NULL;
    if (n > n_linear) return SEKV_N_ERR_SIZE;
    for (int64_t i = 0; i < n; ++i) {
        if (idx[i] < 0 || (int64_t) idx[i] >= n_indexed) return SEKV_N_ERR_INDEX;
    }
    return SEKV_N_OK;
}

int32_t sekv_f16_to_f32(const uint16_t * src, float * dst, int64_t n) {
    if (n < 0) return SEKV_N_ERR_SIZE;
    if (n > 0 && (src == NULL || dst == NULL)) return SEKV_N_ERR_NULL;
    for (int64_t i = 0; i < n; ++i) {
        dst[i] = sekv_half_to_float(src[i]);
    }
    return SEKV_N_OK;
}

int32_t sekv_f32_to_f16(const float * src, uint16_t * dst, int64_t n) {
    if (n < 0) return SEKV_N_ERR_SIZE;
    if (n > 0 && (src == NULL || dst == NULL)) return SEKV_N_ERR_NULL;
    for (int64_t i = 0; i < n; ++i) {
        dst[i] = sekv_float_to_half(src[i]);
    }
    return SEKV_N_OK;
}

int32_t sekv_gather_rows(const void * src, int64_t n_src, int64_t row_bytes,
                         const int32_t * idx, int64_t n, void * dst, int64_t n_dst) {
    const int32_t rc = sekv_check_move(src, dst, idx, n, n_src, n_dst, row_bytes, n_dst, n_src);
    if (rc != SEKV_N_OK || n == 0) return rc;
    const unsigned char * s = (const unsigned char *) src;
    unsigned char       * d = (unsigned char *) dst;
    for (int64_t i = 0; i < n; ++i) {
        memcpy(d + i*row_bytes, s + (int64_t) idx[i]*row_bytes, (size_t) row_bytes);
    }
    return SEKV_N_OK;
}

int32_t sekv_scatter_rows(const void * src, int64_t n_src, int64_t row_bytes,
                          const int32_t * idx, int64_t n, void * dst, int64_t n_dst) {
    const int32_t rc = sekv_check_move(src, dst, idx, n, n_src, n_dst, row_bytes, n_src, n_dst);
    if (rc != SEKV_N_OK || n == 0) return rc;
    const unsigned char * s = (const unsigned char *) src;
    unsigned char       * d = (unsigned char *) dst;
    for (int64_t i = 0; i < n; ++i) {
        memcpy(d + (int64_t) idx[i]*row_bytes, s + i*row_bytes, (size_t) row_bytes);
    }
    return SEKV_N_OK;
}

int32_t sekv_gather_rows_f16_f32(const uint16_t * src, int64_t n_src, int64_t row_len,
                                 const int32_t * idx, int64_t n, float * dst, int64_t n_dst) {
    if (row_len <= 0 || row_len > INT64_MAX / 4) return SEKV_N_ERR_SIZE;
    /* checked in the wider (f32) unit so that both sides fit */
    const int32_t rc = sekv_check_move(src, dst, idx, n, n_src, n_dst, row_len*4, n_dst, n_src);
    if (rc != SEKV_N_OK || n == 0) return rc;
    for (int64_t i = 0; i < n; ++i) {
        const uint16_t * s = src + (int64_t) idx[i]*row_len;
        float          * d = dst + i*row_len;
        for (int64_t j = 0; j < row_len; ++j) {
            d[j] = sekv_half_to_float(s[j]);
        }
    }
    return SEKV_N_OK;
}

int32_t sekv_scatter_rows_f32_f16(const float * src, int64_t n_src, int64_t row_len,
                                  const int32_t * idx, int64_t n, uint16_t * dst, int64_t n_dst) {
    if (row_len <= 0 || row_len > INT64_MAX / 4) return SEKV_N_ERR_SIZE;
    const int32_t rc = sekv_check_move(src, dst, idx, n, n_src, n_dst, row_len*4, n_src, n_dst);
    if (rc != SEKV_N_OK || n == 0) return rc;
    for (int64_t i = 0; i < n; ++i) {
        const float * s = src + i*row_len;
        uint16_t    * d = dst + (int64_t) idx[i]*row_len;
        for (int64_t j = 0; j < row_len; ++j) {
            d[j] = sekv_float_to_half(s[j]);
        }
    }
    return SEKV_N_OK;
}

int32_t sekv_surprisal(const float * logits, int64_t n, int64_t n_vocab, const int32_t * next, float * out) {
    if (n < 0 || n_vocab <= 0) return SEKV_N_ERR_SIZE;
    if (n == 0) return SEKV_N_OK;
    if (logits == NULL || next == NULL || out == NULL) return SEKV_N_ERR_NULL;
    if (n > (int64_t) (PTRDIFF_MAX / (int64_t) sizeof(float)) / n_vocab) return SEKV_N_ERR_SIZE;
    for (int64_t i = 0; i < n; ++i) {
        if (next[i] < 0 || (int64_t) next[i] >= n_vocab) return SEKV_N_ERR_INDEX;
    }
    for (int64_t i = 0; i < n; ++i) {
        const float * row = logits + i*n_vocab;
        float mx = row[0];
        for (int64_t j = 1; j < n_vocab; ++j) {
            mx = row[j] > mx ? row[j] : mx;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n_vocab; ++j) {
            sum += exp((double) (row[j] - mx));
        }
        out[i] = (float) ((double) mx + log(sum) - (double) row[next[i]]);
    }
    return SEKV_N_OK;
}
