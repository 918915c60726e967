/* Drives every native entry point with exact-size heap buffers, valid and invalid arguments, under
 * AddressSanitizer + UndefinedBehaviorSanitizer (built and run by tests/test_native.py). Exit 0 = all checks hold. */
#include "sekv_native.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static void * xmalloc(size_t n) {
    void * p = malloc(n ? n : 1);
    if (!p) { perror("malloc"); exit(2); }
    return p;
}

int main(void) {
    /* every half value: f16 -> f32 -> f16 is the identity (NaNs stay NaN) */
    uint16_t * h = xmalloc(65536 * sizeof(uint16_t));
    float    * f = xmalloc(65536 * sizeof(float));
    uint16_t * h2 = xmalloc(65536 * sizeof(uint16_t));
    for (int i = 0; i < 65536; ++i) h[i] = (uint16_t) i;
    EXPECT(sekv_f16_to_f32(h, f, 65536) == SEKV_N_OK);
    EXPECT(sekv_f32_to_f16(f, h2, 65536) == SEKV_N_OK);
    for (int i = 0; i < 65536; ++i) {
        if (isnan(f[i])) { EXPECT((h2[i] & 0x7c00u) == 0x7c00u && (h2[i] & 0x3ffu) != 0); }
        else             { EXPECT(h2[i] == h[i]); }
    }
    EXPECT(f[0x3c00] == 1.0f && f[0xc000] == -2.0f && f[0x0001] == ldexpf(1.0f, -24));
    float big[3] = { 65520.0f, 1e30f, -1e30f };
    uint16_t hb[3];
    EXPECT(sekv_f32_to_f16(big, hb, 3) == SEKV_N_OK);
    EXPECT(hb[0] == 0x7c00u && hb[1] == 0x7c00u && hb[2] == 0xfc00u);
    EXPECT(sekv_f16_to_f32(NULL, f, 1) == SEKV_N_ERR_NULL);
    EXPECT(sekv_f16_to_f32(h, f, -1) == SEKV_N_ERR_SIZE);
    EXPECT(sekv_f16_to_f32(NULL, NULL, 0) == SEKV_N_OK);

    /* gather / scatter on exact-size buffers: 5 source rows of 12 bytes */
    const int64_t rb = 12, n_src = 5;
    unsigned char * src = xmalloc((size_t) (n_src * rb));
    for (int i = 0; i < n_src * rb; ++i) src[i] = (unsigned char) i;
    int32_t idx_ok[3]  = { 4, 0, 2 };
    int32_t idx_hi[3]  = { 4, 5, 2 };
    int32_t idx_neg[2] = { 1, -1 };
    unsigned char * dst = xmalloc((size_t) (3 * rb));
    EXPECT(sekv_gather_rows(src, n_src, rb, idx_ok, 3, dst, 3) == SEKV_N_OK);
    EXPECT(memcmp(dst, src + 4 * rb, (size_t) rb) == 0 && memcmp(dst + 2 * rb, src + 2 * rb, (size_t) rb) == 0);
    EXPECT(sekv_gather_rows(src, n_src, rb, idx_hi, 3, dst, 3) == SEKV_N_ERR_INDEX);
    EXPECT(sekv_gather_rows(src, n_src, rb, idx_neg, 2, dst, 3) == SEKV_N_ERR_INDEX);
    EXPECT(sekv_gather_rows(src, n_src, rb, idx_ok, 3, dst, 2) == SEKV_N_ERR_SIZE);   /* dst too small */
    EXPECT(sekv_gather_rows(src, n_src, 0, idx_ok, 3, dst, 3) == SEKV_N_ERR_SIZE);    /* row size 0 */
    EXPECT(sekv_gather_rows(src, n_src, rb, NULL, 3, dst, 3) == SEKV_N_ERR_NULL);
    EXPECT(sekv_gather_rows(src, -1, rb, idx_ok, 3, dst, 3) == SEKV_N_ERR_SIZE);
    EXPECT(sekv_gather_rows(src, INT64_MAX / 2, rb, idx_ok, 3, dst, 3) == SEKV_N_ERR_SIZE); /* overflow */
    unsigned char * back = xmalloc((size_t) (n_src * rb));
    memset(back, 0, (size_t) (n_src * rb));
    EXPECT(sekv_scatter_rows(dst, 3, rb, idx_ok, 3, back, n_src) == SEKV_N_OK);
    EXPECT(memcmp(back + 4 * rb, src + 4 * rb, (size_t) rb) == 0 && back[rb] == 0);
    EXPECT(sekv_scatter_rows(dst, 3, rb, idx_hi, 3, back, n_src) == SEKV_N_ERR_INDEX);
    EXPECT(sekv_scatter_rows(dst, 2, rb, idx_ok, 3, back, n_src) == SEKV_N_ERR_SIZE);  /* src too small */

    /* fused f16 <-> f32 rows: 4 rows of 6 halves */
    const int64_t rl = 6;
    uint16_t * hs = xmalloc(4 * 6 * sizeof(uint16_t));
    for (int i = 0; i < 24; ++i) hs[i] = (uint16_t) (0x3c00u + i);
    float * fr = xmalloc(2 * 6 * sizeof(float));
    int32_t pick[2] = { 3, 1 };
    EXPECT(sekv_gather_rows_f16_f32(hs, 4, rl, pick, 2, fr, 2) == SEKV_N_OK);
    EXPECT(fr[0] == f[0x3c00 + 18] && fr[6] == f[0x3c00 + 6]);
    EXPECT(sekv_gather_rows_f16_f32(hs, 4, rl, pick, 2, fr, 1) == SEKV_N_ERR_SIZE);
    EXPECT(sekv_gather_rows_f16_f32(hs, 3, rl, pick, 2, fr, 2) == SEKV_N_ERR_INDEX);
    EXPECT(sekv_gather_rows_f16_f32(hs, 4, -6, pick, 2, fr, 2) == SEKV_N_ERR_SIZE);
    uint16_t * hd = xmalloc(4 * 6 * sizeof(uint16_t));
    memset(hd, 0, 4 * 6 * sizeof(uint16_t));
    EXPECT(sekv_scatter_rows_f32_f16(fr, 2, rl, pick, 2, hd, 4) == SEKV_N_OK);
    EXPECT(memcmp(hd + 18, hs + 18, 6 * sizeof(uint16_t)) == 0 && hd[0] == 0);
    EXPECT(sekv_scatter_rows_f32_f16(fr, 2, rl, pick, 2, hd, 3) == SEKV_N_ERR_INDEX);
    EXPECT(sekv_scatter_rows_f32_f16(fr, 1, rl, pick, 2, hd, 4) == SEKV_N_ERR_SIZE);
    EXPECT(sekv_scatter_rows_f32_f16(NULL, 2, rl, pick, 2, hd, 4) == SEKV_N_ERR_NULL);

    /* surprisal: 2 rows of 5 logits, exact-size buffers */
    float lg[10] = { 0, 0, 0, 0, 0,   1, 2, 3, 4, 5 };
    int32_t nx[2] = { 2, 4 }, nx_bad[2] = { 2, 5 };
    float sp[2];
    EXPECT(sekv_surprisal(lg, 2, 5, nx, sp) == SEKV_N_OK);
    EXPECT(fabsf(sp[0] - logf(5.0f)) < 1e-5f);
    EXPECT(sekv_surprisal(lg, 2, 5, nx_bad, sp) == SEKV_N_ERR_INDEX);
    EXPECT(sekv_surprisal(lg, 2, 0, nx, sp) == SEKV_N_ERR_SIZE);
    EXPECT(sekv_surprisal(NULL, 2, 5, nx, sp) == SEKV_N_ERR_NULL);

    /* span mass: one raw span [3, 1, 4] and one rank-1 span (U.S [1, 2, 1], Vt [1, 1, 4]); 2 query heads, 1 KV head */
    sekv_init();
    uint16_t * raw = xmalloc(3 * 4 * sizeof(uint16_t));
    for (int i = 0; i < 12; ++i) raw[i] = 0x3c00u;          /* 1.0 */
    uint16_t * us = xmalloc(2 * sizeof(uint16_t));
    uint16_t * vt = xmalloc(4 * sizeof(uint16_t));
    us[0] = 0x3c00u; us[1] = 0x4000u;                       /* 1, 2 */
    for (int i = 0; i < 4; ++i) vt[i] = 0x3800u;            /* 0.5 */
    float qm[8] = { 1, 0, 0, 0,   0, 0, 0, 2 };
    int32_t ln[2] = { 3, 2 }, rk[2] = { 0, 1 }, rk_bad[2] = { 0, 3 };
    const uint16_t * pa[2] = { raw, us };
    const uint16_t * pb[2] = { raw, vt };
    const uint16_t * pnull[2] = { raw, NULL };
    float ms[4];                                            /* [span, head] */
    EXPECT(sekv_span_mass(qm, 2, 1, 4, 2, ln, rk, pa, pb, ms) == SEKV_N_OK);
    EXPECT(fabsf(ms[0] - (1.0f + logf(3.0f))) < 1e-5f);      /* head 0: logits 1, 1, 1 */
    EXPECT(fabsf(ms[1] - (2.0f + logf(3.0f))) < 1e-5f);      /* head 1: logits 2, 2, 2 */
    EXPECT(fabsf(ms[2] - logf(expf(0.5f) + expf(1.0f))) < 1e-5f);  /* head 0: 0.5*1, 0.5*2 */
    EXPECT(fabsf(ms[3] - logf(expf(1.0f) + expf(2.0f))) < 1e-5f);  /* head 1: 2*0.5*1, 2*0.5*2 */
    EXPECT(sekv_span_mass(qm, 2, 1, 4, 2, ln, rk_bad, pa, pb, ms) == SEKV_N_ERR_SIZE);   /* rank > len */
    EXPECT(sekv_span_mass(qm, 3, 2, 4, 2, ln, rk, pa, pb, ms) == SEKV_N_ERR_SIZE);      /* heads not grouped */
    EXPECT(sekv_span_mass(qm, 2, 1, 4, 2, ln, rk, pa, pnull, ms) == SEKV_N_ERR_NULL);
    EXPECT(sekv_span_mass(qm, 2, 1, 0, 2, ln, rk, pa, pb, ms) == SEKV_N_ERR_SIZE);
    EXPECT(sekv_span_mass(qm, 2, 1, 4, 0, ln, rk, pa, pb, ms) == SEKV_N_OK);
    /* attention mass: the 3 raw rows (all 1.0) get 1/3 each from each of the 2 heads */
    float * scr = xmalloc(3 * sizeof(float));
    float am[3] = { 0, 0, 0 };
    EXPECT(sekv_attn_mass(qm, 2, 1, 4, raw, 3, scr, 3, am) == SEKV_N_OK);
    EXPECT(fabsf(am[0] - 2.0f / 3.0f) < 1e-6f && fabsf(am[2] - 2.0f / 3.0f) < 1e-6f);
    EXPECT(sekv_attn_mass(qm, 2, 1, 4, raw, 3, scr, 2, am) == SEKV_N_ERR_SIZE);  /* scratch too small */
    EXPECT(sekv_attn_mass(qm, 2, 1, 4, NULL, 3, scr, 3, am) == SEKV_N_ERR_NULL);
    EXPECT(sekv_attn_mass(qm, 2, 1, 4, raw, -1, scr, 3, am) == SEKV_N_ERR_SIZE);
    free(scr);
    free(raw); free(us); free(vt);

    free(h); free(f); free(h2); free(src); free(dst); free(back); free(hs); free(fr); free(hd);
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("native harness: all checks passed\n");
    return 0;
}
