/* Drives every native entry point with exact-size heap buffers, valid and invalid arguments, under
 * AddressSanitizer + UndefinedBehaviorSanitizer (built and run by tests/test_native.py). Exit 0 = all checks hold. */
#include "sekv_native.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int failures = 0;

#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static void * xmalloc(size_t n) {
    void * p = malloc(n ? n : 1);
    if (!p) { perror("malloc"); exit(2); }
    return p;
}

/* IEEE half -> float, written independently of the module: (1024 + man) * 2^(exp - 25), subnormals man * 2^-24 */
static float ref_half(uint16_t h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const float v = e == 0  ? ldexpf((float) m, -24)
                  : e == 31 ? (m ? NAN : INFINITY)
                  :           ldexpf((float) (m | 0x400), e - 25);
    return (h & 0x8000u) ? -v : v;
}

int main(void) {
    /* every half value: its exact float narrows back to the same half (NaNs stay NaN) */
    float    * f = xmalloc(65536 * sizeof(float));
    uint16_t * h2 = xmalloc(65536 * sizeof(uint16_t));
    for (int i = 0; i < 65536; ++i) f[i] = ref_half((uint16_t) i);
    EXPECT(sekv_f32_to_f16(f, h2, 65536) == SEKV_N_OK);
    for (int i = 0; i < 65536; ++i) {
        if (isnan(f[i])) { EXPECT((h2[i] & 0x7c00u) == 0x7c00u && (h2[i] & 0x3ffu) != 0); }
        else             { EXPECT(h2[i] == (uint16_t) i); }
    }
    float big[3] = { 65520.0f, 1e30f, -1e30f };
    uint16_t hb[3];
    EXPECT(sekv_f32_to_f16(big, hb, 3) == SEKV_N_OK);
    EXPECT(hb[0] == 0x7c00u && hb[1] == 0x7c00u && hb[2] == 0xfc00u);
    EXPECT(sekv_f32_to_f16(NULL, hb, 1) == SEKV_N_ERR_NULL);
    EXPECT(sekv_f32_to_f16(big, hb, -1) == SEKV_N_ERR_SIZE);
    EXPECT(sekv_f32_to_f16(NULL, NULL, 0) == SEKV_N_OK);

    /* the mass scorers' f16 -> f32 table, every half: 65536 raw one-row spans with d = 1, one head, q = 1, so
     * out[s] = logsumexp of one logit = the widened value of half s */
    sekv_init();
    uint16_t * hv = xmalloc(65536 * sizeof(uint16_t));
    for (int i = 0; i < 65536; ++i) hv[i] = (uint16_t) i;
    const void ** hp = xmalloc(65536 * sizeof(*hp));
    int32_t * one = xmalloc(65536 * sizeof(int32_t));
    int32_t * zero = xmalloc(65536 * sizeof(int32_t));
    float * wide = xmalloc(65536 * sizeof(float));
    for (int i = 0; i < 65536; ++i) { hp[i] = hv + i; one[i] = 1; zero[i] = 0; }
    const float q1 = 1.0f;
    EXPECT(sekv_span_mass(&q1, 1, 1, 1, 65536, one, zero, hp, hp, wide) == SEKV_N_OK);
    for (int i = 0; i < 65536; ++i) {
        if (isnan(f[i])) { EXPECT(isnan(wide[i])); }
        else             { EXPECT(wide[i] == f[i]); }   /* == : the q . k sum 0 + k turns -0 into +0 */
    }
    free(hv); free(hp); free(one); free(zero); free(wide);

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
    uint16_t * raw = xmalloc(3 * 4 * sizeof(uint16_t));
    for (int i = 0; i < 12; ++i) raw[i] = 0x3c00u;          /* 1.0 */
    uint16_t * us = xmalloc(2 * sizeof(uint16_t));
    uint16_t * vt = xmalloc(4 * sizeof(uint16_t));
    us[0] = 0x3c00u; us[1] = 0x4000u;                       /* 1, 2 */
    for (int i = 0; i < 4; ++i) vt[i] = 0x3800u;            /* 0.5 */
    float qm[8] = { 1, 0, 0, 0,   0, 0, 0, 2 };
    int32_t ln[2] = { 3, 2 }, rk[2] = { 0, 1 }, rk_bad[2] = { 0, 3 };
    const void * pa[2] = { raw, us };
    const void * pb[2] = { raw, vt };
    const void * pnull[2] = { raw, NULL };
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
    /* int8 span [2, 1, 4]: codes 1 and 2 at scale 0.5 per channel -> keys 0.5 and 1.0 everywhere */
    int8_t * q8 = xmalloc(8);
    for (int i = 0; i < 8; ++i) q8[i] = (int8_t) (i < 4 ? 1 : 2);
    float * q8s = xmalloc(4 * sizeof(float));
    for (int i = 0; i < 4; ++i) q8s[i] = 0.5f;
    const void * qa[1] = { q8 };
    const void * qb[1] = { q8s };
    const void * qnull[1] = { NULL };
    int32_t ln8[1] = { 2 }, rk8[1] = { SEKV_RANK_Q8 }, rk8_bad[1] = { SEKV_RANK_Q4 - 1 };
    EXPECT(sekv_span_mass(qm, 2, 1, 4, 1, ln8, rk8, qa, qb, ms) == SEKV_N_OK);
    EXPECT(fabsf(ms[0] - logf(expf(0.5f) + expf(1.0f))) < 1e-5f);     /* head 0: q = e0 */
    EXPECT(fabsf(ms[1] - logf(expf(1.0f) + expf(2.0f))) < 1e-5f);     /* head 1: q = 2 e3 */
    EXPECT(sekv_span_mass(qm, 2, 1, 4, 1, ln8, rk8_bad, qa, qb, ms) == SEKV_N_ERR_SIZE);
    EXPECT(sekv_span_mass(qm, 2, 1, 4, 1, ln8, rk8, qa, qnull, ms) == SEKV_N_ERR_NULL);
    uint16_t h8[8];
    EXPECT(sekv_q8_to_f16(q8, q8s, 2, 1, 4, 0, h8) == SEKV_N_OK);
    EXPECT(h8[0] == 0x3800u && h8[7] == 0x3c00u);              /* 0.5, 1.0 */
    float tok[2] = { 1.0f, 0.25f };                             /* per token */
    EXPECT(sekv_q8_to_f16(q8, tok, 2, 1, 4, 1, h8) == SEKV_N_OK);
    EXPECT(h8[0] == 0x3c00u && h8[7] == 0x3800u);              /* 1*1, 2*0.25 */
    EXPECT(sekv_q8_to_f16(q8, tok, -1, 1, 4, 1, h8) == SEKV_N_ERR_SIZE);
    EXPECT(sekv_q8_to_f16(NULL, tok, 2, 1, 4, 1, h8) == SEKV_N_ERR_NULL);
    free(q8); free(q8s);
    /* 4-bit span [2, 1, 4]: token 0 codes 0,1,2,3 and token 1 codes 15 everywhere (low nibble first), per channel
     * scale 0.5 and zero -1 -> token 0: -1, -0.5, 0, 0.5; token 1: 6.5 everywhere */
    uint8_t * q4 = xmalloc(4);
    q4[0] = 0x10; q4[1] = 0x32; q4[2] = 0xff; q4[3] = 0xff;
    uint16_t * q4p = xmalloc(8 * sizeof(uint16_t));
    for (int i = 0; i < 4; ++i) { q4p[i] = 0x3800u; q4p[4 + i] = 0xbc00u; }   /* scale 0.5, zero -1 */
    const void * q4a[1] = { q4 };
    const void * q4b[1] = { q4p };
    int32_t rk4[1] = { SEKV_RANK_Q4 };
    EXPECT(sekv_span_mass(qm, 2, 1, 4, 1, ln8, rk4, q4a, q4b, ms) == SEKV_N_OK);
    EXPECT(fabsf(ms[0] - logf(expf(-1.0f) + expf(6.5f))) < 1e-5f);    /* head 0: q = e0 */
    EXPECT(fabsf(ms[1] - logf(expf(1.0f) + expf(13.0f))) < 1e-4f);    /* head 1: q = 2 e3 */
    EXPECT(sekv_span_mass(qm, 2, 1, 3, 1, ln8, rk4, q4a, q4b, ms) == SEKV_N_ERR_SIZE);   /* odd head size */
    EXPECT(sekv_span_mass(qm, 2, 1, 4, 1, ln8, rk4, q4a, qnull, ms) == SEKV_N_ERR_NULL);
    uint16_t h4[8];
    EXPECT(sekv_q4_to_f16(q4, q4p, 2, 1, 4, 0, h4) == SEKV_N_OK);
    EXPECT(h4[0] == 0xbc00u && h4[1] == 0xb800u && h4[2] == 0x0000u && h4[3] == 0x3800u && h4[7] == 0x4680u);
    /* per token and group of 2 channels: params [2, 2 tokens, 1, 2 groups] */
    uint16_t * q4g = xmalloc(8 * sizeof(uint16_t));
    for (int i = 0; i < 4; ++i) { q4g[i] = 0x3c00u; q4g[4 + i] = 0x0000u; }   /* scale 1, zero 0 */
    q4g[1] = 0x4000u;                                                          /* token 0, group 1: scale 2 */
    EXPECT(sekv_q4_to_f16(q4, q4g, 2, 1, 4, 2, h4) == SEKV_N_OK);
    EXPECT(h4[0] == 0x0000u && h4[1] == 0x3c00u && h4[2] == 0x4400u && h4[3] == 0x4600u && h4[4] == 0x4b80u);
    EXPECT(sekv_q4_to_f16(q4, q4g, 2, 1, 4, 3, h4) == SEKV_N_ERR_SIZE);      /* group does not divide d */
    EXPECT(sekv_q4_to_f16(q4, q4g, 2, 1, 3, 0, h4) == SEKV_N_ERR_SIZE);      /* odd head size */
    EXPECT(sekv_q4_to_f16(q4, NULL, 2, 1, 4, 0, h4) == SEKV_N_ERR_NULL);
    EXPECT(sekv_q4_to_f16(q4, q4g, -1, 1, 4, 0, h4) == SEKV_N_ERR_SIZE);
    free(q4); free(q4p); free(q4g);
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

    /* index score: 2 spans x 2 blocks, 1 KV head, 2 query heads, d = 4, exact-size buffers; span 1's second block
     * is padding. Codes all 1, scale 1 (0x3c00), log sizes 0: each real block's logit is sum(q[h]). */
    {
        int8_t   * ic = xmalloc(2 * 2 * 4);
        uint16_t * is = xmalloc(2 * 2 * sizeof(uint16_t));
        float    * il = xmalloc(2 * 2 * sizeof(float));
        float    * iq = xmalloc(2 * 4 * sizeof(float));
        float    * io = xmalloc(2 * sizeof(float));
        for (int i = 0; i < 16; ++i) ic[i] = 1;
        for (int i = 0; i < 4; ++i) { is[i] = 0x3c00u; il[i] = 0.0f; }
        il[3] = -INFINITY;
        for (int i = 0; i < 8; ++i) iq[i] = i < 4 ? 0.25f : 0.5f;           /* head sums 1 and 2 */
        EXPECT(sekv_index_score(iq, 2, 1, 4, 2, 2, ic, is, il, io) == SEKV_N_OK);
        EXPECT(fabsf(io[0] - (2.0f + logf(2.0f))) < 1e-5f && fabsf(io[1] - 2.0f) < 1e-5f);
        EXPECT(sekv_index_score(iq, 3, 2, 4, 2, 2, ic, is, il, io) == SEKV_N_ERR_SIZE);  /* heads not grouped */
        EXPECT(sekv_index_score(iq, 2, 1, 4, 2, 0, ic, is, il, io) == SEKV_N_ERR_SIZE);  /* no blocks */
        EXPECT(sekv_index_score(iq, 2, 1, 4, 2, 2, ic, NULL, il, io) == SEKV_N_ERR_NULL);
        il[0] = -INFINITY;                                                     /* span 0 without a real block */
        EXPECT(sekv_index_score(iq, 2, 1, 4, 2, 2, ic, is, il, io) == SEKV_N_ERR_SIZE);
        free(ic); free(is); free(il); free(iq); free(io);
    }

    /* the vector paths of the routing kernels (runs of 8 and 16 floats, four query heads per pass, 4-bit rows folded
     * into the query) on exact-size buffers: 6 query heads of 1 KV head, head size 40, against sums in double */
    {
        enum { H = 6, D = 40, L = 3, B = 3 };
        float * vq = xmalloc(H * D * sizeof(float));
        for (int i = 0; i < H * D; ++i) vq[i] = (float) ((i * 7) % 11 - 5) / 8.0f;
        uint16_t * vr = xmalloc(L * D * sizeof(uint16_t));                   /* raw rows [L, 1, D]: 0.5 or -0.25 */
        for (int i = 0; i < L * D; ++i) vr[i] = (i % 3) ? 0x3800u : 0xb400u;
        uint8_t  * v4 = xmalloc(L * D / 2);                                  /* 4-bit rows [L, 1, D/2] */
        for (int i = 0; i < L * D / 2; ++i) v4[i] = (uint8_t) ((i * 5) % 256);
        uint16_t * v4p = xmalloc(2 * D * sizeof(uint16_t));                  /* scale 0.5, zero -1 */
        for (int i = 0; i < D; ++i) { v4p[i] = 0x3800u; v4p[D + i] = 0xbc00u; }
        const void * va[2] = { vr, v4 };
        const void * vb[2] = { vr, v4p };
        int32_t vl[2] = { L, L }, vk[2] = { 0, SEKV_RANK_Q4 };
        float * vm = xmalloc(2 * H * sizeof(float));
        EXPECT(sekv_span_mass(vq, H, 1, D, 2, vl, vk, va, vb, vm) == SEKV_N_OK);
        for (int h = 0; h < H; ++h) {
            double raw_sum = 0.0, q4_sum = 0.0;
            for (int t = 0; t < L; ++t) {
                double a = 0.0, b = 0.0;
                for (int i = 0; i < D; ++i) {
                    const uint8_t c = v4[(t * D + i) / 2];
                    const int code = (i & 1) ? c >> 4 : c & 0x0f;
                    a += vq[h * D + i] * ref_half(vr[t * D + i]);
                    b += vq[h * D + i] * (-1.0 + 0.5 * code);
                }
                raw_sum += exp(a);
                q4_sum += exp(b);
            }
            EXPECT(fabs(vm[h] - log(raw_sum)) < 1e-4);
            EXPECT(fabs(vm[H + h] - log(q4_sum)) < 1e-4);
        }
        int8_t   * vc = xmalloc(B * D);                                       /* index [1, 1 span, B, D] */
        for (int i = 0; i < B * D; ++i) vc[i] = (int8_t) ((i * 3) % 17 - 8);
        uint16_t * vs = xmalloc(B * sizeof(uint16_t));
        float    * vn = xmalloc(B * sizeof(float));
        for (int b = 0; b < B; ++b) { vs[b] = 0x3400u; vn[b] = logf(16.0f); }  /* scale 0.25 */
        vn[B - 1] = -INFINITY;                                                /* the last block is padding */
        float vo[1];
        EXPECT(sekv_index_score(vq, H, 1, D, 1, B, vc, vs, vn, vo) == SEKV_N_OK);
        double best = -1e30;
        for (int h = 0; h < H; ++h) {
            double sum = 0.0;
            for (int b = 0; b < B - 1; ++b) {
                double dot = 0.0;
                for (int i = 0; i < D; ++i) dot += vq[h * D + i] * vc[b * D + i];
                sum += exp(0.25 * dot + log(16.0));
            }
            best = log(sum) > best ? log(sum) : best;
        }
        EXPECT(fabs(vo[0] - best) < 1e-4);
        free(vq); free(vr); free(v4); free(v4p); free(vm); free(vc); free(vs); free(vn);
    }

    free(f); free(h2);
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("native harness: all checks passed\n");
    return 0;
}
