// Ops::linear_parts (the default every backend inherits) on the CPU backend: one weight holding
// the rows of several linears gives each part exactly what its own linear gives.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace ds {
namespace {

// Part widths that are not multiples of any tile size, K not a multiple of 16.
constexpr int64_t kK = 24;
const std::vector<int64_t> kWidths = {5, 16, 3};

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

std::vector<float> download(CpuOps& ops, Tensor t) {
  std::vector<float> v(t.numel());
  ops.download_f32(t, v.data());
  return v;
}

class LinearParts : public ::testing::TestWithParam<int64_t> {};

TEST_P(LinearParts, DenseEqualsSeparateLinears) {
  const int64_t T = GetParam();
  CpuOps ops;
  int64_t N = 0;
  for (int64_t n : kWidths) N += n;
  const std::vector<float> wv = random_values(N * kK, 1), xv = random_values(T * kK, 2);
  LinearWeight fused;
  fused.dense = ops.upload(wv.data(), DType::kF32, {N, kK}, DType::kF32);  // f32 [N, K]
  Tensor x = ops.upload(xv.data(), DType::kF32, {T, kK}, DType::kF32);      // f32 [T, K]

  std::vector<Tensor> outs;
  for (int64_t n : kWidths) outs.push_back(ops.scratch(DType::kF32, {T, n}));
  ops.linear_parts(x, fused, outs);

  int64_t r = 0;
  for (size_t i = 0; i < kWidths.size(); ++i) {
    const int64_t n = kWidths[i];
    // The part as a weight of its own: a separate upload, not a view of the fused one.
    Tensor w = ops.upload(wv.data() + r * kK, DType::kF32, {n, kK}, DType::kF32);
    Tensor want = ops.scratch(DType::kF32, {T, n});
    ops.linear(x, w, want);
    EXPECT_EQ(download(ops, outs[i]), download(ops, want)) << "part " << i << ", T " << T;
    r += n;
  }
}

TEST_P(LinearParts, OnePartIsTheLinear) {
  const int64_t T = GetParam(), N = 7;
  CpuOps ops;
  const std::vector<float> wv = random_values(N * kK, 3), xv = random_values(T * kK, 4);
  LinearWeight w;
  w.dense = ops.upload(wv.data(), DType::kF32, {N, kK}, DType::kF32);
  Tensor x = ops.upload(xv.data(), DType::kF32, {T, kK}, DType::kF32);
  Tensor out = ops.scratch(DType::kF32, {T, N}), want = ops.scratch(DType::kF32, {T, N});
  const Tensor outs[] = {out};
  ops.linear_parts(x, w, outs);
  ops.linear(x, w.dense, want);
  EXPECT_EQ(download(ops, out), download(ops, want));
}

// A deferred norm's scale (RowScale): each part's row t multiplied by 1 / sqrt(sum_p ss[p, t] / K
// + eps), which on the CPU equals the linear of the normed input x / rms(x).
TEST_P(LinearParts, ScaledPartsAreTheLinearOfTheNormedInput) {
  const int64_t T = GetParam(), P = 3;
  CpuOps ops;
  int64_t N = 0;
  for (int64_t n : kWidths) N += n;
  const std::vector<float> wv = random_values(N * kK, 5), xv = random_values(T * kK, 6);
  LinearWeight fused;
  fused.dense = ops.upload(wv.data(), DType::kF32, {N, kK}, DType::kF32);
  Tensor x = ops.upload(xv.data(), DType::kF32, {T, kK}, DType::kF32);
  // The sums of squares of each row in P parts of its columns, and the normed rows.
  std::vector<float> ss(P * T, 0.f), normed(xv);
  constexpr float kEps = 1e-6f;
  for (int64_t t = 0; t < T; ++t) {
    double total = 0;
    for (int64_t k = 0; k < kK; ++k) {
      const float v = xv[t * kK + k];
      ss[(k * P / kK) * T + t] += v * v;
      total += double(v) * v;
    }
    for (int64_t k = 0; k < kK; ++k) normed[t * kK + k] = float(xv[t * kK + k] / std::sqrt(total / kK + kEps));
  }
  const RowScale scale{ops.upload(ss.data(), DType::kF32, {P, T}, DType::kF32), kEps, {}, {}};
  std::vector<Tensor> outs;
  for (int64_t n : kWidths) outs.push_back(ops.scratch(DType::kF32, {T, n}));
  ops.linear_parts(x, fused, outs, false, scale);

  Tensor xn = ops.upload(normed.data(), DType::kF32, {T, kK}, DType::kF32);
  int64_t r = 0;
  for (size_t i = 0; i < kWidths.size(); ++i) {
    Tensor want = ops.scratch(DType::kF32, {T, kWidths[i]});
    ops.linear(xn, fused.dense.rows(r, kWidths[i]), want);
    const std::vector<float> got = download(ops, outs[i]), ref = download(ops, want);
    for (size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], ref[j], 1e-4f * (1.f + std::fabs(ref[j]))) << "part " << i;
    r += kWidths[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Tokens, LinearParts, ::testing::Values(1, 7));

}  // namespace
}  // namespace ds
