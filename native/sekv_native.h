/* sekv_gguf native module: host-side hot paths (row gather/scatter, f16 <-> f32, surprisal).
 *
 * Every function checks the sizes and indices it is handed and returns a negative SEKV_N_* code instead of
 * touching memory out of bounds. Rows are packed: row i of a buffer starts at i*row_bytes (or i*row_len elements).
 * The declarations between the CDEF markers are read by native/build_native.py. */
#ifndef SEKV_NATIVE_H
#define SEKV_NATIVE_H

#include <stdint.h>

/* CDEF-BEGIN */
#define SEKV_N_OK          0
#define SEKV_N_ERR_NULL   -1   /* a required pointer is NULL */
#define SEKV_N_ERR_SIZE   -2   /* a count or row size is negative, zero where it must not be, or overflows */
#define SEKV_N_ERR_INDEX  -3   /* a row index is outside its buffer */

/* dst[i] = f32(src[i]) for i < n (IEEE half -> float, exact) */
int32_t sekv_f16_to_f32(const uint16_t * src, float * dst, int64_t n);
/* dst[i] = f16(src[i]) for i < n (round to nearest even; overflow -> inf; NaN kept) */
int32_t sekv_f32_to_f16(const float * src, uint16_t * dst, int64_t n);

/* dst row i = src row idx[i]; src has n_src rows, dst has n_dst rows, i < n <= n_dst */
int32_t sekv_gather_rows(const void * src, int64_t n_src, int64_t row_bytes,
                         const int32_t * idx, int64_t n, void * dst, int64_t n_dst);
/* dst row idx[i] = src row i; src has n_src rows (n <= n_src), dst has n_dst rows */
int32_t sekv_scatter_rows(const void * src, int64_t n_src, int64_t row_bytes,
                          const int32_t * idx, int64_t n, void * dst, int64_t n_dst);

/* gather f16 rows of row_len elements and widen them: dst (f32) row i = src (f16) row idx[i] */
int32_t sekv_gather_rows_f16_f32(const uint16_t * src, int64_t n_src, int64_t row_len,
                                 const int32_t * idx, int64_t n, float * dst, int64_t n_dst);
/* narrow f32 rows and scatter them: dst (f16) row idx[i] = f16(src (f32) row i) */
int32_t sekv_scatter_rows_f32_f16(const float * src, int64_t n_src, int64_t row_len,
                                  const int32_t * idx, int64_t n, uint16_t * dst, int64_t n_dst);

/* surprisal (nats) of realised tokens: out[i] = logsumexp(logits[i, :]) - logits[i, next[i]] for n rows of n_vocab */
int32_t sekv_surprisal(const float * logits, int64_t n, int64_t n_vocab, const int32_t * next, float * out);
/* Attention mass of each span for one layer's query, per query head (the training-free zoom score is its max):
 *   out[s, h] = logsumexp_t (q[h] . k[s, t, h / (n_head / n_head_kv)])      out: f32 [n_spans, n_head]
 * q: f32 [n_head, d] (already scaled so that q . k is the attention logit). Span s has len[s] rows; rank[s] == 0:
 * a[s] holds its raw f16 K rows [len, n_head_kv, d]; rank[s] = r > 0: a[s] holds f16 U.S [n_head_kv, len, r] and
 * b[s] f16 V^T [n_head_kv, r, d]. Sizes are checked (d <= SEKV_MAX_HEAD_DIM, n_head <= SEKV_MAX_HEADS,
 * len <= SEKV_MAX_SPAN, rank <= min(len, d), group * rank <= SEKV_MAX_QV); the buffers' extents are the caller's to vouch for. */
#define SEKV_MAX_HEAD_DIM 1024
#define SEKV_MAX_HEADS    128
#define SEKV_MAX_SPAN     65536
#define SEKV_MAX_QV       16384   /* (n_head / n_head_kv) * rank */
/* fills the f16 -> f32 table the mass scorer uses; sekv_gguf.native calls it once at import */
void sekv_init(void);
int32_t sekv_span_mass(const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, int64_t n_spans,
                       const int32_t * len, const int32_t * rank, const uint16_t * const * a,
                       const uint16_t * const * b, float * out);
/* Attention probabilities of one query over n cache rows, summed over the query heads and added to out[n]:
 *   out[i] += sum_h softmax_i(q[h] . k[i, h / (n_head / n_head_kv)])
 * q: f32 [n_head, d] (scaled so that q . k is the logit); k: f16 [n, n_head_kv, d]; scratch: f32 [n_scratch >= n].
 * (What the eviction baselines vote with: flash attention exposes no probabilities.) */
int32_t sekv_attn_mass(const float * q, int64_t n_head, int64_t n_head_kv, int64_t d, const uint16_t * k,
                       int64_t n, float * scratch, int64_t n_scratch, float * out);
/* CDEF-END */

#endif
