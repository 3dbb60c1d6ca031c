// The two reference forms of the gated delta rule agree (output and final state) on awkward
// shapes: T = 1, 63, 64, 65, 500; dk != dv; non-power-of-two widths; a non-zero start state.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/gdn_ref.h"

namespace ds {
namespace {

struct Case {
  int T, dk, dv;
};

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * double(a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

class GdnForms : public ::testing::TestWithParam<Case> {};

TEST_P(GdnForms, ChunkedEqualsRecurrent) {
  const Case c = GetParam();
  std::mt19937 rng(c.T * 131 + c.dk);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  std::vector<float> q(c.T * c.dk), k(c.T * c.dk), v(c.T * c.dv), g(c.T), beta(c.T);
  for (auto& x : q) x = nd(rng);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (int t = 0; t < c.T; ++t) {
    l2_normalize(&q[t * c.dk], c.dk, 1.0f / std::sqrt(float(c.dk)));
    l2_normalize(&k[t * c.dk], c.dk, 1.0f);
    g[t] = -ud(rng) * 0.5f;  // log-decay in (-0.5, 0]
    beta[t] = ud(rng);
  }
  std::vector<float> s0(c.dk * c.dv);
  for (auto& x : s0) x = nd(rng) * 0.3f;
  GdnHeadInputs in{q.data(), k.data(), v.data(), g.data(), beta.data(), c.dk, c.dv, 1, c.T, c.dk, c.dv};
  std::vector<float> s_rec = s0, s_chunk = s0, o_rec(c.T * c.dv, NAN), o_chunk(c.T * c.dv, NAN);
  gdn_head_recurrent(in, s_rec.data(), o_rec.data(), c.dv);
  gdn_head_chunked(in, s_chunk.data(), o_chunk.data(), c.dv);
  for (float x : o_chunk) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LE(rel_rms(o_chunk, o_rec), 1e-5);
  EXPECT_LE(rel_rms(s_chunk, s_rec), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GdnForms,
                         ::testing::Values(Case{1, 16, 16}, Case{63, 20, 24}, Case{64, 16, 24}, Case{65, 24, 16},
                                           Case{500, 12, 20}, Case{130, 128, 128}));

TEST(GdnForms, SplitRunEqualsOneRun) {
  // Running 40 tokens then 60 from the carried state equals 100 at once (both forms).
  const int T = 100, dk = 16, dv = 12;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(T * dk), k(T * dk), v(T * dv), g(T), beta(T);
  for (auto& x : v) x = nd(rng);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < dk; ++i) q[t * dk + i] = nd(rng), k[t * dk + i] = nd(rng);
    l2_normalize(&q[t * dk], dk, 0.25f);
    l2_normalize(&k[t * dk], dk, 1.0f);
    g[t] = -0.1f * (t % 7);
    beta[t] = 0.5f + 0.004f * t;
  }
  auto run = [&](int t0, int n, std::vector<float>& S, std::vector<float>& o, bool chunked) {
    GdnHeadInputs in{&q[t0 * dk], &k[t0 * dk], &v[t0 * dv], &g[t0], &beta[t0], dk, dv, 1, n, dk, dv};
    if (chunked) gdn_head_chunked(in, S.data(), &o[t0 * dv], dv);
    else gdn_head_recurrent(in, S.data(), &o[t0 * dv], dv);
  };
  for (bool chunked : {false, true}) {
    std::vector<float> S1(dk * dv, 0.f), S2(dk * dv, 0.f), o1(T * dv), o2(T * dv);
    run(0, T, S1, o1, chunked);
    run(0, 40, S2, o2, chunked);
    run(40, 60, S2, o2, chunked);
    EXPECT_LE(rel_rms(o2, o1), 1e-5);
    EXPECT_LE(rel_rms(S2, S1), 1e-5);
  }
}

}  // namespace
}  // namespace ds
