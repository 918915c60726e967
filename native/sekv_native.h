/* sekv_gguf native module: host-side hot paths (f32 -> f16, surprisal, span and attention mass).
 *
 * Every function checks the sizes and indices it is handed and returns a negative SEKV_N_* code instead of
 * touching memory out of bounds. Arrays are packed row-major (C order).
 * The declarations between the CDEF markers are read by native/build_native.py. */
#ifndef SEKV_NATIVE_H
#define SEKV_NATIVE_H

#include <stdint.h>

/* CDEF-BEGIN */
#define SEKV_N_OK          0
#define SEKV_N_ERR_NULL   -1   /* a required pointer is NULL */
#define SEKV_N_ERR_SIZE   -2   /* a count or row size is negative, zero where it must not be, or overflows */
#define SEKV_N_ERR_INDEX  -3   /* an index is outside its range (a token id not below n_vocab) */

/* dst[i] = f16(src[i]) for i < n (round to nearest even; overflow -> inf; NaN kept) */
int32_t sekv_f32_to_f16(const float * src, uint16_t * dst, int64_t n);

/* surprisal (nats) of realised tokens: out[i] = logsumexp(logits[i, :]) - logits[i, next[i]] for n rows of n_vocab */
int32_t sekv_surprisal(const float * logits, int64_t n, int64_t n_vocab, const int32_t * next, float * out);
/* Attention mass of each span for one layer's query, per query head (the training-free zoom score is its max):
 *   out[s, h] = logsumexp_t (q[h] . k[s, t, h / (n_head / n_head_kv)])      out: f32 [n_spans, n_head]
 * q: f32 [n_head, d] (already scaled so that q . k is the attention logit). Span s has len[s] rows; rank[s] == 0:
 * a[s] holds its raw f16 K rows [len, n_head_kv, d]; rank[s] = r > 0: a[s] holds f16 U.S [n_head_kv, len, r] and
 * b[s] f16 V^T [n_head_kv, r, d]; rank[s] == SEKV_RANK_Q8: a[s] holds int8 codes [len, n_head_kv, d] and b[s] f32
 * per-channel scales [n_head_kv, d] (k = code * scale); rank[s] == SEKV_RANK_Q4: a[s] holds 4-bit codes packed two
 * per byte [len, n_head_kv, d / 2] (channel 2i in the low nibble, 2i + 1 in the high one; d even) and b[s] f16
 * [2, n_head_kv, d]: per-channel scale, then zero (k = zero + code * scale). Sizes are checked (d <= SEKV_MAX_HEAD_DIM,
 * n_head <= SEKV_MAX_HEADS, len <= SEKV_MAX_SPAN, rank <= min(len, d), group * rank <= SEKV_MAX_QV); the
 * buffers' extents are the caller's to vouch for. */
#define SEKV_MAX_HEAD_DIM 1024
#define SEKV_MAX_HEADS    2048
#define SEKV_MAX_SPAN     65536
#define SEKV_MAX_QV       16384   /* (n_head / n_head_kv) * rank */
#define SEKV_RANK_Q8      -1      /* rank of a span stored as int8 codes with per-channel scales */
#define SEKV_RANK_Q4      -2      /* rank of a span stored as packed 4-bit codes with per-channel scale and zero */
/* fills the f16 -> f32 table the mass scorer uses; sekv_gguf.native calls it once at import */
void sekv_init(void);
int32_t sekv_span_mass(const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, int64_t n_spans,
                       const int32_t * len, const int32_t * rank, const void * const * a,
                       const void * const * b, float * out);
/* int8 host rows back to f16 device rows: out[t, h, c] = f16(codes[t, h, c] * scale), scale = scales[h, c]
 * (per_token == 0: one per channel, as keys are stored) or scales[t, h] (per_token != 0: one per token and head,
 * as values are stored). codes: int8 [n, n_head_kv, d]; out: f16 [n, n_head_kv, d]. */
int32_t sekv_q8_to_f16(const int8_t * codes, const float * scales, int64_t n, int64_t n_head_kv, int64_t d,
                       int32_t per_token, uint16_t * out);
/* 4-bit host rows back to f16 device rows: out[t, h, c] = f16(zero + code * scale) with code the 4-bit code of
 * (t, h, c) in codes uint8 [n, n_head_kv, d / 2] (packed as in sekv_span_mass; d even) and (scale, zero) from params
 * f16: group == 0: [2, n_head_kv, d], one pair per channel (as keys are stored); group > 0 (a divisor of d):
 * [2, n, n_head_kv, d / group], one pair per token, head and run of ``group`` channels (as values are stored). */
int32_t sekv_q4_to_f16(const uint8_t * codes, const uint16_t * params, int64_t n, int64_t n_head_kv, int64_t d,
                       int64_t group, uint16_t * out);
/* Attention probabilities of one query over n cache rows, summed over the query heads and added to out[n]:
 *   out[i] += sum_h softmax_i(q[h] . k[i, h / (n_head / n_head_kv)])
 * q: f32 [n_head, d] (scaled so that q . k is the logit); k: f16 [n, n_head_kv, d]; scratch: f32 [n_scratch >= n].
 * (What the eviction baselines vote with: flash attention exposes no probabilities.) */
int32_t sekv_attn_mass(const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, const uint16_t * k,
                       int64_t n, float * scratch, int64_t n_scratch, float * out);
/* The index router's stage-1 proposal from its q8 block index, without widening the index first:
 *   out[s] = max_h logsumexp_b (scale[kv, s, b] * (q[h] . codes[kv, s, b, :]) + logn[s, b]),  kv = h / (n_head / n_head_kv)
 * q: f32 [n_head, d]; codes: int8 [n_head_kv, n_spans, n_blocks, d]; scale: f16 [n_head_kv, n_spans, n_blocks];
 * logn: f32 [n_spans, n_blocks] (log tokens per block; -inf: a padding block, skipped); out: f32 [n_spans]. Every
 * span's first block must be real (finite logn). Sizes are checked as in sekv_span_mass. */
int32_t sekv_index_score(const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, int64_t n_spans,
                         int64_t n_blocks, const int8_t * codes, const uint16_t * scale, const float * logn,
                         float * out);
/* CDEF-END */

#endif
