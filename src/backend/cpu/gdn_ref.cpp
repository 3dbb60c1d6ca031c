// The gated delta rule, recurrent and chunked (architecture reference §3.3-3.4), per v-head.
#include "backend/cpu/gdn_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ds {

void l2_normalize(float* x, int n, float scale) {
  float ss = 0.f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  float inv = 1.0f / std::sqrt(ss + 1e-6f) * scale;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

void gdn_head_recurrent(const GdnHeadInputs& in, float* S, float* out, int64_t out_stride) {
  const int dk = in.dk, dv = in.dv;
  std::vector<float> delta(dv);
  for (int t = 0; t < in.n_tokens; ++t) {
    const float* q = in.q + t * in.qk_stride;
    const float* k = in.k + t * in.qk_stride;
    const float* v = in.v + t * in.v_stride;
    const float alpha = std::exp(in.g[t * in.gb_stride]);
    const float beta = in.beta[t * in.gb_stride];
    for (int i = 0; i < dk * dv; ++i) S[i] *= alpha;  // decay first
    for (int j = 0; j < dv; ++j) {                      // read with the decayed state
      float m = 0.f;
      for (int i = 0; i < dk; ++i) m += S[i * dv + j] * k[i];
      delta[j] = beta * (v[j] - m);
    }
    for (int i = 0; i < dk; ++i)
      for (int j = 0; j < dv; ++j) S[i * dv + j] += k[i] * delta[j];
    float* o = out + t * out_stride;  // output read after the update
    for (int j = 0; j < dv; ++j) {
      float acc = 0.f;
      for (int i = 0; i < dk; ++i) acc += S[i * dv + j] * q[i];
      o[j] = acc;
    }
  }
}

// Per chunk of L <= C tokens with in-chunk cumulative log-decay gamma:
//   A[r][s] = beta_r (k_r . k_s) exp(gamma_r - gamma_s), s < r
//   (I + A) U = beta * V,  (I + A) W = beta * exp(gamma) * K      (forward substitution)
//   V' = U - W S,  O = exp(gamma) Q S + ((Q K^T) o Gamma) V',  S <- exp(gamma_L) S + (exp(gamma_L - gamma) K)^T V'
void gdn_head_chunked(const GdnHeadInputs& in, float* S, float* out, int64_t out_stride, int C) {
  const int dk = in.dk, dv = in.dv;
  std::vector<float> gamma(C), A(C * C), U(C * dv), W(C * dk), Vp(C * dv);
  for (int c0 = 0; c0 < in.n_tokens; c0 += C) {
    const int L = std::min(C, in.n_tokens - c0);
    auto q = [&](int r) { return in.q + (c0 + r) * in.qk_stride; };
    auto k = [&](int r) { return in.k + (c0 + r) * in.qk_stride; };
    auto v = [&](int r) { return in.v + (c0 + r) * in.v_stride; };
    auto beta = [&](int r) { return in.beta[(c0 + r) * in.gb_stride]; };
    float acc = 0.f;
    for (int r = 0; r < L; ++r) gamma[r] = acc += in.g[(c0 + r) * in.gb_stride];

    for (int r = 0; r < L; ++r)
      for (int s = 0; s < r; ++s) {
        float kk = 0.f;
        for (int i = 0; i < dk; ++i) kk += k(r)[i] * k(s)[i];
        A[r * C + s] = beta(r) * kk * std::exp(gamma[r] - gamma[s]);
      }
    for (int r = 0; r < L; ++r) {
      for (int j = 0; j < dv; ++j) {
        float u = beta(r) * v(r)[j];
        for (int s = 0; s < r; ++s) u -= A[r * C + s] * U[s * dv + j];
        U[r * dv + j] = u;
      }
      const float eg = std::exp(gamma[r]);
      for (int i = 0; i < dk; ++i) {
        float w = beta(r) * eg * k(r)[i];
        for (int s = 0; s < r; ++s) w -= A[r * C + s] * W[s * dk + i];
        W[r * dk + i] = w;
      }
    }
    for (int r = 0; r < L; ++r)
      for (int j = 0; j < dv; ++j) {
        float x = U[r * dv + j];
        for (int i = 0; i < dk; ++i) x -= W[r * dk + i] * S[i * dv + j];
        Vp[r * dv + j] = x;
      }
    for (int r = 0; r < L; ++r) {
      float* o = out + (c0 + r) * out_stride;
      const float eg = std::exp(gamma[r]);
      for (int j = 0; j < dv; ++j) {
        float x = 0.f;
        for (int i = 0; i < dk; ++i) x += q(r)[i] * S[i * dv + j];
        o[j] = eg * x;
      }
      for (int s = 0; s <= r; ++s) {
        float qk = 0.f;
        for (int i = 0; i < dk; ++i) qk += q(r)[i] * k(s)[i];
        const float w = qk * std::exp(gamma[r] - gamma[s]);
        for (int j = 0; j < dv; ++j) o[j] += w * Vp[s * dv + j];
      }
    }
    const float g_last = gamma[L - 1];
    const float decay_all = std::exp(g_last);
    for (int i = 0; i < dk * dv; ++i) S[i] *= decay_all;
    for (int s = 0; s < L; ++s) {
      const float w = std::exp(g_last - gamma[s]);
      for (int i = 0; i < dk; ++i) {
        const float ki = w * k(s)[i];
        for (int j = 0; j < dv; ++j) S[i * dv + j] += ki * Vp[s * dv + j];
      }
    }
  }
}

}  // namespace ds
