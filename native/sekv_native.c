/* sekv_gguf native module: see sekv_native.h */
#include "sekv_native.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* GCC on x86-64, outside AddressSanitizer's test build (which covers the portable paths): AVX2 clones and F16C
 * conversions picked at load time */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define SEKV_X86_DISPATCH 1
#endif

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

int32_t sekv_f32_to_f16(const float * src, uint16_t * dst, int64_t n) {
    if (n < 0) return SEKV_N_ERR_SIZE;
    if (n > 0 && (src == NULL || dst == NULL)) return SEKV_N_ERR_NULL;
    for (int64_t i = 0; i < n; ++i) {
        dst[i] = sekv_float_to_half(src[i]);
    }
    return SEKV_N_OK;
}

/* logits x[0..n) folded into a running logsumexp (m, s) with s = sum exp(x - m); s == 0 marks an empty fold: a max
 * pass, then a sum of expf that the compiler vectorises (glibc's libmvec under -ffast-math; an AVX2 clone is picked
 * at load time where the CPU has it) */
#ifdef SEKV_X86_DISPATCH
__attribute__((target_clones("avx2", "default")))
#endif
static void sekv_lse_fold(const float * x, int64_t n, float * m, float * s) {
    float mx = x[0];
    for (int64_t j = 1; j < n; ++j) {
        mx = x[j] > mx ? x[j] : mx;
    }
    if (*s != 0.0f && *m > mx) mx = *m;
    float sum = 0.0f;
#pragma omp simd reduction(+:sum)
    for (int64_t j = 0; j < n; ++j) {
        sum += x[j] == mx ? 1.0f : expf(x[j] - mx);  /* the max counts 1 even when infinite */
    }
    *s = (*s != 0.0f ? (*m == mx ? *s : *s * expf(*m - mx)) : 0.0f) + sum;
    *m = mx;
}

/* logsumexp of one row (the surprisal's, over a vocabulary): sekv_lse_fold from an empty fold without its test for
 * an infinite max, which costs a vocabulary-wide sum ~15% (logits are finite) */
#ifdef SEKV_X86_DISPATCH
__attribute__((target_clones("avx2", "default")))
#endif
static float sekv_logsumexp(const float * row, int64_t n) {
    float mx = row[0];
    for (int64_t j = 1; j < n; ++j) {
        mx = row[j] > mx ? row[j] : mx;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+:sum)
    for (int64_t j = 0; j < n; ++j) {
        sum += expf(row[j] - mx);
    }
    return mx + logf(sum);
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
        out[i] = sekv_logsumexp(row, n_vocab) - row[next[i]];
    }
    return SEKV_N_OK;
}

/* f16 <-> f32 of whole rows: by F16C instructions where the CPU has them (x86-64 with AVX2 and F16C, picked at
 * sekv_init; not under AddressSanitizer, whose test build covers the portable path), else by a table (f16 -> f32)
 * and sekv_float_to_half (f32 -> f16); both round to nearest even */
static float sekv_h2f_table[65536];
static int   sekv_h2f_ready = 0;

#ifdef SEKV_X86_DISPATCH
#include <immintrin.h>
static int sekv_f16c = 0;
static int sekv_avx2_fma = 0;  /* AVX2, FMA and F16C: the routing kernels' second build (SEKV_KERNEL_BUILDS) */

__attribute__((target("avx2,f16c")))
static void sekv_widen_f16c(const uint16_t * src, float * dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (src + i))));
    }
    for (; i < n; ++i) {
        dst[i] = sekv_h2f_table[src[i]];
    }
}

__attribute__((target("avx2,f16c")))
static void sekv_narrow_f16c(const float * src, uint16_t * dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128((__m128i *) (dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; ++i) {
        dst[i] = sekv_float_to_half(src[i]);
    }
}
#endif

static void sekv_h2f_init(void) {
    if (!sekv_h2f_ready) {
        for (uint32_t i = 0; i < 65536u; ++i) {
            sekv_h2f_table[i] = sekv_half_to_float((uint16_t) i);
        }
#ifdef SEKV_X86_DISPATCH
        __builtin_cpu_init();
        sekv_f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
        sekv_avx2_fma = sekv_f16c && __builtin_cpu_supports("fma");
#endif
        sekv_h2f_ready = 1;
    }
}

void sekv_init(void) {
    sekv_h2f_init();
}

static inline void sekv_widen(const uint16_t * src, float * dst, int64_t n) {
#ifdef SEKV_X86_DISPATCH
    if (sekv_f16c) {
        sekv_widen_f16c(src, dst, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; ++i) {
        dst[i] = sekv_h2f_table[src[i]];
    }
}

static inline void sekv_narrow(const float * src, uint16_t * dst, int64_t n) {
#ifdef SEKV_X86_DISPATCH
    if (sekv_f16c) {
        sekv_narrow_f16c(src, dst, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; ++i) {
        dst[i] = sekv_float_to_half(src[i]);
    }
}

/* a routing kernel's compute, BODY (an always_inline function of PARAMS, called with ARGS), built twice where
 * SEKV_X86_DISPATCH holds: plain and for AVX2 + FMA (picked at sekv_init: sekv_avx2_fma); SEKV_KERNEL_CALL runs
 * the one the CPU takes */
#ifdef SEKV_X86_DISPATCH
#define SEKV_KERNEL_BUILDS(body, params, args)                                   \
    static void body##_plain params { body args; }                               \
    __attribute__((target("avx2,fma,f16c"))) static void body##_avx2 params { body args; }
#define SEKV_KERNEL_CALL(body, args) (sekv_avx2_fma ? body##_avx2 args : body##_plain args)
#else
#define SEKV_KERNEL_BUILDS(body, params, args) static void body##_plain params { body args; }
#define SEKV_KERNEL_CALL(body, args) body##_plain args
#endif

/* eight floats as one value (GCC / Clang vector extension): an AVX register in the AVX2 build, two SSE ones in the
 * plain build */
typedef float sekv_v8 __attribute__((vector_size(32)));
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"  /* sekv_v8 passes only between static inline functions of this file */
#endif

static inline sekv_v8 sekv_load8(const float * p) {
    sekv_v8 v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline float sekv_hsum8(const sekv_v8 * v) {
    return (((*v)[0] + (*v)[4]) + ((*v)[1] + (*v)[5])) + (((*v)[2] + (*v)[6]) + ((*v)[3] + (*v)[7]));
}

/* a · b over n floats, in four independent partial sums of eight lanes: the multiply-adds of a head-sized dot
 * overlap instead of each waiting on the one before (the single-accumulator loop was bound by that latency) */
static inline float sekv_dot(const float * a, const float * b, int64_t n) {
    sekv_v8 s0 = {0.0f}, s1 = {0.0f}, s2 = {0.0f}, s3 = {0.0f};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 += sekv_load8(a + i) * sekv_load8(b + i);
        s1 += sekv_load8(a + i + 8) * sekv_load8(b + i + 8);
        s2 += sekv_load8(a + i + 16) * sekv_load8(b + i + 16);
        s3 += sekv_load8(a + i + 24) * sekv_load8(b + i + 24);
    }
    for (; i + 8 <= n; i += 8) {
        s0 += sekv_load8(a + i) * sekv_load8(b + i);
    }
    const sekv_v8 s = (s0 + s1) + (s2 + s3);
    float out = sekv_hsum8(&s);
    for (; i < n; ++i) {
        out += a[i]*b[i];
    }
    return out;
}

/* out[g * stride] = q[g * ld ..] · row over n floats for g < group: four query heads per pass over the row (loaded
 * once for the four) */
static inline void sekv_dots(const float * q, int64_t ld, int64_t group, const float * row, int64_t n, float * out,
                             int64_t stride) {
    int64_t g = 0;
    for (; g + 4 <= group; g += 4) {
        const float * q0 = q + g*ld, * q1 = q0 + ld, * q2 = q1 + ld, * q3 = q2 + ld;
        /* two partial sums per head (odd and even runs of eight): eight chains hide the multiply-add latency */
        sekv_v8 a0 = {0.0f}, a1 = {0.0f}, a2 = {0.0f}, a3 = {0.0f};
        sekv_v8 b0 = {0.0f}, b1 = {0.0f}, b2 = {0.0f}, b3 = {0.0f};
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            const sekv_v8 r = sekv_load8(row + i), u = sekv_load8(row + i + 8);
            a0 += sekv_load8(q0 + i) * r;
            a1 += sekv_load8(q1 + i) * r;
            a2 += sekv_load8(q2 + i) * r;
            a3 += sekv_load8(q3 + i) * r;
            b0 += sekv_load8(q0 + i + 8) * u;
            b1 += sekv_load8(q1 + i + 8) * u;
            b2 += sekv_load8(q2 + i + 8) * u;
            b3 += sekv_load8(q3 + i + 8) * u;
        }
        for (; i + 8 <= n; i += 8) {
            const sekv_v8 r = sekv_load8(row + i);
            a0 += sekv_load8(q0 + i) * r;
            a1 += sekv_load8(q1 + i) * r;
            a2 += sekv_load8(q2 + i) * r;
            a3 += sekv_load8(q3 + i) * r;
        }
        a0 += b0;
        a1 += b1;
        a2 += b2;
        a3 += b3;
        float o0 = sekv_hsum8(&a0), o1 = sekv_hsum8(&a1), o2 = sekv_hsum8(&a2), o3 = sekv_hsum8(&a3);
        for (; i < n; ++i) {
            o0 += q0[i]*row[i];
            o1 += q1[i]*row[i];
            o2 += q2[i]*row[i];
            o3 += q3[i]*row[i];
        }
        out[g*stride] = o0;
        out[(g + 1)*stride] = o1;
        out[(g + 2)*stride] = o2;
        out[(g + 3)*stride] = o3;
    }
    for (; g < group; ++g) {
        out[g*stride] = sekv_dot(q + g*ld, row, n);
    }
}

/* online logsumexp: fold x into (m, s) with s = sum exp(x - m); s == 0 marks an empty fold (no infinities: this
 * file is built with -ffast-math) */
static inline void sekv_lse_push(float * m, float * s, float x) {
    if (*s == 0.0f) {
        *m = x;
        *s = 1.0f;
    } else if (x > *m) {
        *s = *s * expf(*m - x) + 1.0f;
        *m = x;
    } else {
        *s += expf(x - *m);
    }
}

/* floats of the block of logits span_mass folds at once: [group, block] */
#define SEKV_MASS_BLOCK 8192

/* the compute of sekv_span_mass (arguments checked), inlined into a plain build and an AVX2+FMA one (below) */
static inline __attribute__((always_inline)) void sekv_span_mass_body(
        const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, int64_t n_spans, const int32_t * len,
        const int32_t * rank, const void * const * a, const void * const * b, float * out) {
    const int64_t group = n_head / n_head_kv;
    const int64_t block = SEKV_MASS_BLOCK / group > 0 ? SEKV_MASS_BLOCK / group : 1;  /* n_head <= SEKV_MASS_BLOCK */
    float row[SEKV_MAX_HEAD_DIM];           /* one widened K row, or one widened Vᵀ / U·S row */
    float sc[SEKV_MAX_HEAD_DIM], zr[SEKV_MAX_HEAD_DIM];  /* a KV head's per-channel scale and zero, widened once */
    float qv[SEKV_MAX_QV];                  /* q . Vᵀ[j] for the query heads of one KV head: [group, r]; or the
                                               4-bit path's folded query [group, d] */
    float qz[SEKV_MAX_HEADS];               /* the 4-bit path's q · zero per query head of one KV head */
    float x[SEKV_MASS_BLOCK];               /* logits of one block of rows: [group, block] */
    float m[SEKV_MAX_HEADS], sum[SEKV_MAX_HEADS];
    for (int64_t s = 0; s < n_spans; ++s) {
        const int64_t L = len[s], r = rank[s];
        for (int64_t h = 0; h < n_head; ++h) { m[h] = 0.0f; sum[h] = 0.0f; }
        for (int64_t kh = 0; kh < n_head_kv; ++kh) {
            const float * qh = q + kh*group*d;  /* the query heads of this KV head: [group, d] */
            const int64_t qd = r > 0 ? r : d;   /* length of the dot per row: rank for factors, else head_dim */
            const float * qk = qh;              /* what each row is dotted with: [group, qd] */
            /* 4-bit rows folded into the query: q·k = q·zero + (q ∘ scale)·code, with the channels taken low
             * nibbles first, then high ones (the order a row's codes widen in without interleaving) */
            const int fold = r == SEKV_RANK_Q4 && group*d <= SEKV_MAX_QV;
            if (r == SEKV_RANK_Q4) {
                const uint16_t * params = (const uint16_t *) b[s];  /* [2, Hkv, d]: scale, then zero */
                sekv_widen(params + kh*d, sc, d);
                sekv_widen(params + (n_head_kv + kh)*d, zr, d);
                if (fold) {
                    for (int64_t g = 0; g < group; ++g) {
                        const float * qg = qh + g*d;
                        float * qs = qv + g*d;  /* [group, d]: q ∘ scale, permuted */
                        for (int64_t i = 0; i < d/2; ++i) {
                            qs[i] = qg[2*i]*sc[2*i];
                            qs[d/2 + i] = qg[2*i + 1]*sc[2*i + 1];
                        }
                        qz[g] = sekv_dot(qg, zr, d);
                    }
                    qk = qv;
                }
            } else if (r > 0) {
                /* factors: U·S [Hkv, L, r] and Vᵀ [Hkv, r, d]; q·k_t = sum_j (U·S)[t, j] (q · Vᵀ[j]) */
                const uint16_t * vt = (const uint16_t *) b[s];
                for (int64_t j = 0; j < r; ++j) {
                    sekv_widen(vt + (kh*r + j)*d, row, d);
                    sekv_dots(qh, d, group, row, d, qv + j, r);
                }
                qk = qv;
            }
            for (int64_t t0 = 0; t0 < L; t0 += block) {
                const int64_t nb = L - t0 < block ? L - t0 : block;
                for (int64_t tb = 0; tb < nb; ++tb) {
                    const int64_t t = t0 + tb;
                    if (r == SEKV_RANK_Q8) {
                        /* int8 codes [L, Hkv, d] with per-channel scales f32 [Hkv, d] */
                        const int8_t * c = (const int8_t *) a[s] + (t*n_head_kv + kh)*d;
                        const float * scale = (const float *) b[s] + kh*d;
                        for (int64_t i = 0; i < d; ++i) row[i] = (float) c[i] * scale[i];
                    } else if (r == SEKV_RANK_Q4 && fold) {
                        /* 4-bit codes [L, Hkv, d/2] as floats, low nibbles then high ones (qk is folded) */
                        const uint8_t * c = (const uint8_t *) a[s] + (t*n_head_kv + kh)*(d/2);
                        for (int64_t i = 0; i < d/2; ++i) {
                            row[i]       = (float) (c[i] & 0x0f);
                            row[d/2 + i] = (float) (c[i] >> 4);
                        }
                    } else if (r == SEKV_RANK_Q4) {
                        /* 4-bit codes [L, Hkv, d/2]: k = zero + code * scale */
                        const uint8_t * c = (const uint8_t *) a[s] + (t*n_head_kv + kh)*(d/2);
                        for (int64_t i = 0; i < d/2; ++i) {
                            row[2*i]     = zr[2*i]     + (float) (c[i] & 0x0f) * sc[2*i];
                            row[2*i + 1] = zr[2*i + 1] + (float) (c[i] >> 4)   * sc[2*i + 1];
                        }
                    } else if (r == 0) {
                        /* raw rows [L, Hkv, d] */
                        sekv_widen((const uint16_t *) a[s] + (t*n_head_kv + kh)*d, row, d);
                    } else {
                        sekv_widen((const uint16_t *) a[s] + (kh*L + t)*r, row, r);
                    }
                    sekv_dots(qk, qd, group, row, qd, x + tb, block);
                    if (fold) {
                        for (int64_t g = 0; g < group; ++g) x[g*block + tb] += qz[g];
                    }
                }
                for (int64_t g = 0; g < group; ++g) {
                    sekv_lse_fold(x + g*block, nb, &m[kh*group + g], &sum[kh*group + g]);
                }
            }
        }
        for (int64_t h = 0; h < n_head; ++h) out[s*n_head + h] = m[h] + logf(sum[h]);
    }
}


SEKV_KERNEL_BUILDS(sekv_span_mass_body,
                   (const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, int64_t n_spans,
                    const int32_t * len, const int32_t * rank, const void * const * a, const void * const * b,
                    float * out),
                   (q, n_head, n_head_kv, d, n_spans, len, rank, a, b, out))

int32_t sekv_span_mass(const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, int64_t n_spans,
                       const int32_t * len, const int32_t * rank, const void * const * a,
                       const void * const * b, float * out) {
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0 || d <= 0 || d > SEKV_MAX_HEAD_DIM ||
        n_head > SEKV_MAX_HEADS || n_spans < 0) {
        return SEKV_N_ERR_SIZE;
    }
    if (n_spans == 0) return SEKV_N_OK;
    if (q == NULL || len == NULL || rank == NULL || a == NULL || b == NULL || out == NULL) return SEKV_N_ERR_NULL;
    for (int64_t s = 0; s < n_spans; ++s) {
        if (len[s] <= 0 || len[s] > SEKV_MAX_SPAN || rank[s] < SEKV_RANK_Q4 || rank[s] > len[s] || rank[s] > d) {
            return SEKV_N_ERR_SIZE;
        }
        if (rank[s] == SEKV_RANK_Q4 && (d & 1)) return SEKV_N_ERR_SIZE;
        if (a[s] == NULL || (rank[s] != 0 && b[s] == NULL)) return SEKV_N_ERR_NULL;
        if (rank[s] > 0 && (n_head / n_head_kv) * rank[s] > SEKV_MAX_QV) return SEKV_N_ERR_SIZE;
    }
    sekv_h2f_init();
    SEKV_KERNEL_CALL(sekv_span_mass_body, (q, n_head, n_head_kv, d, n_spans, len, rank, a, b, out));
    return SEKV_N_OK;
}

int32_t sekv_attn_mass(const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, const uint16_t * k,
                       int64_t n, float * scratch, int64_t n_scratch, float * out) {
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0 || d <= 0 || d > SEKV_MAX_HEAD_DIM || n < 0 ||
        n_scratch < 0) {
        return SEKV_N_ERR_SIZE;
    }
    if (n == 0) return SEKV_N_OK;
    if (q == NULL || k == NULL || out == NULL || scratch == NULL) return SEKV_N_ERR_NULL;
    if (n > INT64_MAX / n_head_kv / d || n_scratch < n) return SEKV_N_ERR_SIZE;
    sekv_h2f_init();
    const int64_t group = n_head / n_head_kv;
    float row[SEKV_MAX_HEAD_DIM];
    for (int64_t h = 0; h < n_head; ++h) {
        const int64_t kh = h / group;
        float mx = 0.0f;
        for (int64_t i = 0; i < n; ++i) {
            sekv_widen(k + (i*n_head_kv + kh)*d, row, d);
            scratch[i] = sekv_dot(q + h*d, row, d);
            mx = (i == 0 || scratch[i] > mx) ? scratch[i] : mx;
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < n; ++i) {
            scratch[i] = expf(scratch[i] - mx);
            sum += scratch[i];
        }
        const float inv = 1.0f / sum;
        for (int64_t i = 0; i < n; ++i) {
            out[i] += scratch[i] * inv;
        }
    }
    return SEKV_N_OK;
}

int32_t sekv_q8_to_f16(const int8_t * codes, const float * scales, int64_t n, int64_t n_head_kv, int64_t d,
                       int32_t per_token, uint16_t * out) {
    if (n < 0 || n_head_kv <= 0 || d <= 0 || n > INT64_MAX / n_head_kv / d) return SEKV_N_ERR_SIZE;
    if (n == 0) return SEKV_N_OK;
    if (codes == NULL || scales == NULL || out == NULL) return SEKV_N_ERR_NULL;
    sekv_h2f_init();
    float row[SEKV_MAX_HEAD_DIM];
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t h = 0; h < n_head_kv; ++h) {
            const int64_t o = (t*n_head_kv + h)*d;
            for (int64_t c0 = 0; c0 < d; c0 += SEKV_MAX_HEAD_DIM) {
                const int64_t nc = d - c0 < SEKV_MAX_HEAD_DIM ? d - c0 : SEKV_MAX_HEAD_DIM;
                for (int64_t c = 0; c < nc; ++c) {
                    const float scale = per_token ? scales[t*n_head_kv + h] : scales[h*d + c0 + c];
                    row[c] = (float) codes[o + c0 + c] * scale;
                }
                sekv_narrow(row, out + o + c0, nc);
            }
        }
    }
    return SEKV_N_OK;
}

int32_t sekv_q4_to_f16(const uint8_t * codes, const uint16_t * params, int64_t n, int64_t n_head_kv, int64_t d,
                       int64_t group, uint16_t * out) {
    if (n < 0 || n_head_kv <= 0 || d <= 0 || (d & 1) || group < 0 || (group > 0 && d % group != 0) ||
        n > INT64_MAX / n_head_kv / d) {
        return SEKV_N_ERR_SIZE;
    }
    if (n == 0) return SEKV_N_OK;
    if (codes == NULL || params == NULL || out == NULL) return SEKV_N_ERR_NULL;
    sekv_h2f_init();
    /* (scale, zero) of element (t, h, c): per channel [2, Hkv, d] or per token and group [2, n, Hkv, d/group] */
    const int64_t n_params = group ? n*n_head_kv*(d/group) : n_head_kv*d;
    const uint16_t * scale = params, * zero = params + n_params;
    /* one (scale, zero) pair per run of ``run`` channels: a group, or a single channel (per-channel keys) */
    const int64_t run = group ? group : 1;
    float row[SEKV_MAX_HEAD_DIM];
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t h = 0; h < n_head_kv; ++h) {
            const uint8_t * c = codes + (t*n_head_kv + h)*(d/2);
            uint16_t * o = out + (t*n_head_kv + h)*d;
            const int64_t p0 = group ? (t*n_head_kv + h)*(d/group) : h*d;
            int64_t p = p0, left = 0;  /* the (scale, zero) pair in use and the channels it has left */
            float sc = 0.0f, zr = 0.0f;
            for (int64_t i0 = 0; i0 < d; i0 += SEKV_MAX_HEAD_DIM) {  /* d is not bounded here: rows in pieces */
                const int64_t ni = d - i0 < SEKV_MAX_HEAD_DIM ? d - i0 : SEKV_MAX_HEAD_DIM;
                for (int64_t i = i0; i < i0 + ni; ++i) {
                    if (left == 0) {
                        sc = sekv_h2f_table[scale[p]];
                        zr = sekv_h2f_table[zero[p]];
                        ++p;
                        left = run;
                    }
                    --left;
                    const float code = (float) ((i & 1) ? (c[i/2] >> 4) : (c[i/2] & 0x0f));
                    row[i - i0] = zr + code * sc;
                }
                sekv_narrow(row, o + i0, ni);
            }
        }
    }
    return SEKV_N_OK;
}

/* whether f is -inf, read from its bits (-ffast-math lets the compiler assume no infinity in comparisons) */
static inline int sekv_is_neg_inf(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    return x == 0xff800000u;
}

/* sekv_lse_fold for ``group`` folds at once, their logits interleaved: x [n, group] (finite, overwritten) folded into
 * (m[g], s[g]); the exponentials of all n * group logits in one vectorised pass (a fold of a few logits per head
 * would take them one at a time); mx: scratch [group] */
static inline __attribute__((always_inline)) void sekv_lse_fold_heads(float * x, int64_t n, int64_t group, float * mx,
                                                                       float * m, float * s) {
    for (int64_t g = 0; g < group; ++g) mx[g] = s[g] != 0.0f && m[g] > x[g] ? m[g] : x[g];
    for (int64_t j = 1; j < n; ++j) {
        for (int64_t g = 0; g < group; ++g) mx[g] = x[j*group + g] > mx[g] ? x[j*group + g] : mx[g];
    }
    for (int64_t j = 0; j < n; ++j) {
        for (int64_t g = 0; g < group; ++g) x[j*group + g] -= mx[g];
    }
    const int64_t nx = n*group;
#pragma omp simd
    for (int64_t i = 0; i < nx; ++i) x[i] = expf(x[i]);
    for (int64_t g = 0; g < group; ++g) {
        s[g] = s[g] != 0.0f ? s[g]*expf(m[g] - mx[g]) : 0.0f;
        m[g] = mx[g];
    }
    for (int64_t j = 0; j < n; ++j) {
        for (int64_t g = 0; g < group; ++g) s[g] += x[j*group + g];
    }
}

/* the compute of sekv_index_score (arguments checked, every span's first block real): per span and KV head the
 * logits of its real blocks for the group's query heads, [<= SEKV_INDEX_BLOCKS, group] at a time, folded per head
 * (sekv_lse_fold_heads) */
#define SEKV_INDEX_BLOCKS 64
static inline __attribute__((always_inline)) void sekv_index_score_body(
        const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, int64_t n_spans, int64_t n_blocks,
        const int8_t * codes, const uint16_t * scale, const float * logn, float * out) {
    const int64_t group = n_head / n_head_kv;
    float top[SEKV_MAX_HEADS];  /* per head of the group: running max and sum of exp(x - max); sum 0: empty */
    float sum[SEKV_MAX_HEADS];
    float mx[SEKV_MAX_HEADS];
    float row_f[SEKV_MAX_HEAD_DIM];
    float x[SEKV_MAX_HEADS * SEKV_INDEX_BLOCKS];  /* [nb, group] logits */
    for (int64_t s = 0; s < n_spans; ++s) {
        float best = 0.0f;
        for (int64_t kv = 0; kv < n_head_kv; ++kv) {
            const float * qk = q + kv*group*d;
            for (int64_t g = 0; g < group; ++g) sum[g] = 0.0f;               /* empty folds */
            for (int64_t b0 = 0; b0 < n_blocks; b0 += SEKV_INDEX_BLOCKS) {
                const int64_t b1 = n_blocks - b0 < SEKV_INDEX_BLOCKS ? n_blocks : b0 + SEKV_INDEX_BLOCKS;
                int64_t nb = 0;                                                /* real blocks of [b0, b1) */
                for (int64_t b = b0; b < b1; ++b) {
                    const float ln = logn[s*n_blocks + b];
                    if (sekv_is_neg_inf(ln)) continue;                         /* padding */
                    const int64_t row = (kv*n_spans + s)*n_blocks + b;
                    const int8_t * c = codes + row*d;
                    const float sc = sekv_h2f_table[scale[row]];
                    float * xb = x + nb*group;
                    for (int64_t i = 0; i < d; ++i) row_f[i] = (float) c[i];  /* widened once for the group */
                    sekv_dots(qk, d, group, row_f, d, xb, 1);
                    for (int64_t g = 0; g < group; ++g) xb[g] = sc*xb[g] + ln;
                    ++nb;
                }
                if (nb > 0) sekv_lse_fold_heads(x, nb, group, mx, top, sum);
            }
            for (int64_t g = 0; g < group; ++g) {
                const float lse = top[g] + logf(sum[g]);
                if ((kv == 0 && g == 0) || lse > best) best = lse;
            }
        }
        out[s] = best;
    }
}

SEKV_KERNEL_BUILDS(sekv_index_score_body,
                   (const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, int64_t n_spans,
                    int64_t n_blocks, const int8_t * codes, const uint16_t * scale, const float * logn,
                    float * out),
                   (q, n_head, n_head_kv, d, n_spans, n_blocks, codes, scale, logn, out))

int32_t sekv_index_score(const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, int64_t n_spans,
                         int64_t n_blocks, const int8_t * codes, const uint16_t * scale, const float * logn,
                         float * out) {
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0 || n_head > SEKV_MAX_HEADS || d <= 0 ||
        d > SEKV_MAX_HEAD_DIM || n_spans < 0 || n_blocks <= 0 ||
        (n_spans > 0 && n_spans > INT64_MAX / n_head_kv / n_blocks / d)) {
        return SEKV_N_ERR_SIZE;
    }
    if (n_spans == 0) return SEKV_N_OK;
    if (q == NULL || codes == NULL || scale == NULL || logn == NULL || out == NULL) return SEKV_N_ERR_NULL;
    for (int64_t s = 0; s < n_spans; ++s) {
        if (sekv_is_neg_inf(logn[s*n_blocks])) return SEKV_N_ERR_SIZE;    /* a span without a real first block */
    }
    sekv_h2f_init();
    SEKV_KERNEL_CALL(sekv_index_score_body, (q, n_head, n_head_kv, d, n_spans, n_blocks, codes, scale, logn, out));
    return SEKV_N_OK;
}
