// core: dtype conversions, Result, thread pool coverage.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace ds {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTripsAndHandlesSubnormals) {
  for (float x : {0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f, 5.960464477539063e-08f, 0.333251953125f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(x)), x) << x;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), f32_to_f16(1.0f));  // tie to even
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8})
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  EXPECT_FALSE(dtype_from_name("F8_E9").has_value());
}

TEST(Result, CarriesValueOrStatus) {
  Result<int> good = 3;
  Result<int> bad = invalid_argument("nope");
  EXPECT_TRUE(good.ok());
  EXPECT_EQ(good.value(), 3);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "nope");
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 3, 17, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, 2, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << n << " " << i;
  }
}

TEST(Tensor, ViewsAndRows) {
  std::vector<float> buf(24);
  Tensor t(buf.data(), DType::kF32, {4, 6});
  EXPECT_EQ(t.view({2, 3, 4}).numel(), 24);
  Tensor r = t.rows(1, 2);
  EXPECT_EQ(r.data, buf.data() + 6);
  EXPECT_EQ(r.shape_str(), "[2, 6]");
}

}  // namespace
}  // namespace ds
