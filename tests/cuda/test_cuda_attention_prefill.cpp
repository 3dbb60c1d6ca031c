// The tensor-core flash prefill attention (attention_prefill.cu) against the CPU reference,
// through CudaOps::attention's dispatch: chunks of 1..4096 tokens, cached context from earlier
// steps, several sequences per step on shuffled block tables, steps mixing decodes and prefill
// chunks (both kernels), head dims 256 and 128; decode and verify chunks through the split-KV
// kernel, through this one with the GQA heads packed (DS_ATTN_DECODE=tc, DS_ATTN_DECODE_WARPS=0)
// and through attention_decode_kernel (the default), which appends the step's keys and values
// itself or finds them appended (DS_ATTN_DECODE_APPENDS=0); the steps after read the caches it
// wrote. Then its speed against the split-KV kernel at the 27B shape. Skipped where there is no
// GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_ops.h"
#include "cuda/cuda_test_util.h"
#include "backend/cuda/device.h"
#include "backend/cuda/launchers.h"

namespace ds {
namespace {

using cuda_test::rel_rms;
using cuda_test::random_bf16;

// A step of sequences with the given new-token counts and n_past; sequence s owns entries
// [s * max_blocks, (s + 1) * max_blocks) of `blocks` (a shuffled pool), so its cache rows are
// scattered over the pool.
StepPlan make_plan(const std::vector<int>& lens, const std::vector<int>& past, const std::vector<int>& blocks,
                   int max_blocks) {
  StepPlan p;
  p.cu_seqlens = {0};
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int i = 0; i < lens[s]; ++i) {
      p.token_ids.push_back(i % 50);
      p.positions.push_back(past[s] + i);
    }
    if (lens[s] > 0) p.logit_rows.push_back(p.cu_seqlens.back() + lens[s] - 1);
    p.cu_seqlens.push_back(p.cu_seqlens.back() + lens[s]);
    p.n_past.push_back(past[s]);
    p.state_slots.push_back(static_cast<int>(s));
    for (int b = 0; b < max_blocks; ++b) p.block_tables.push_back(blocks[s * max_blocks + b]);
  }
  p.max_blocks = max_blocks;
  return p;
}

// Which kernel takes decode and verify chunks (launchers.h), put back when a test ends.
struct DecodeKernelRestored {
  bool tc = cuda::attention_decode_tc(), warps = cuda::attention_decode_warps(),
       appends = cuda::attention_decode_appends();
  ~DecodeKernelRestored() {
    cuda::set_attention_decode_tc(tc);
    cuda::set_attention_decode_warps(warps);
    cuda::set_attention_decode_appends(appends);
  }
};
// The decode kernels: the split-KV CUDA-core kernel, the flash kernel with the GQA heads packed,
// and attention_decode_kernel (every warp on each key tile; up to 32 packed rows a sequence),
// which appends the step's keys and values itself (kWarps) or after kv_append (kWarpsAppended).
enum class DecodeKernel { kSimt, kFlash, kWarps, kWarpsAppended };
constexpr DecodeKernel kDecodeKernels[] = {DecodeKernel::kSimt, DecodeKernel::kFlash, DecodeKernel::kWarps,
                                           DecodeKernel::kWarpsAppended};
void use_decode_kernel(DecodeKernel k) {
  cuda::set_attention_decode_tc(k != DecodeKernel::kSimt);
  cuda::set_attention_decode_warps(k == DecodeKernel::kWarps || k == DecodeKernel::kWarpsAppended);
  cuda::set_attention_decode_appends(k == DecodeKernel::kWarps);
}

class AttentionPrefillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
    gpu = std::make_unique<CudaOps>();
  }

  // Caches of one KV layer for n_seqs sequences of up to max_blocks blocks of 16, pool shuffled.
  void init(int nKV, int hd, int n_seqs, int max_blocks_) {
    max_blocks = max_blocks_;
    CacheGeometry g;
    g.n_kv_layers = 1, g.n_blocks = n_seqs * max_blocks, g.block_size = 16, g.n_kv_heads = nKV, g.head_dim = hd;
    g.n_state_layers = 1, g.n_slots = n_seqs, g.conv_rows = 1, g.conv_dim = 1, g.n_v_heads = 1, g.k_head_dim = 1,
    g.v_head_dim = 1;
    cpu.alloc_caches(g);
    gpu->alloc_caches(g);
    blocks.resize(g.n_blocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    past.assign(n_seqs, 0);
  }

  // One step of new tokens per sequence on both backends; returns the relative RMS error.
  double step(const std::vector<int>& lens, int nH, int nKV, int hd, float q_std) {
    cpu.reset_scratch();
    gpu->reset_scratch();
    const StepPlan plan = make_plan(lens, past, blocks, max_blocks);
    cpu.begin_step(plan);
    gpu->begin_step(plan);
    const int T = plan.n_tokens();
    const std::vector<float> hq = random_bf16(size_t(T) * nH * hd, rng, q_std);
    const std::vector<float> hk = random_bf16(size_t(T) * nKV * hd, rng, 1.f);
    const std::vector<float> hv = random_bf16(size_t(T) * nKV * hd, rng, 1.f);
    const float scale = 1.f / std::sqrt(float(hd));
    Tensor out_c = cpu.scratch(DType::kF32, {T, nH * hd}), out_g = gpu->scratch(DType::kBF16, {T, nH * hd});
    cpu.attention(cpu.upload(hq.data(), DType::kF32, {T, nH, hd}, DType::kF32),
                  cpu.upload(hk.data(), DType::kF32, {T, nKV, hd}, DType::kF32),
                  cpu.upload(hv.data(), DType::kF32, {T, nKV, hd}, DType::kF32), 0, scale, out_c);
    gpu->attention(gpu->upload(hq.data(), DType::kF32, {T, nH, hd}, DType::kBF16),
                   gpu->upload(hk.data(), DType::kF32, {T, nKV, hd}, DType::kBF16),
                   gpu->upload(hv.data(), DType::kF32, {T, nKV, hd}, DType::kBF16), 0, scale, out_g);
    std::vector<float> c(out_c.numel()), g(out_g.numel());
    cpu.download_f32(out_c, c.data());
    gpu->download_f32(out_g, g.data());
    for (size_t s = 0; s < lens.size(); ++s) past[s] += lens[s];
    return rel_rms(g, c);
  }

  void expect_step(const std::vector<int>& lens, int nH, int nKV, int hd, float q_std) {
    std::string what = "hd" + std::to_string(hd) + " nH" + std::to_string(nH) + " nKV" + std::to_string(nKV) + " q_std" +
                       std::to_string(q_std) + " lens";
    for (size_t s = 0; s < lens.size(); ++s) what += " " + std::to_string(lens[s]) + "@" + std::to_string(past[s]);
    if (cuda::attention_decode_tc())
      what += !cuda::attention_decode_warps()       ? " (decode: flash)"
              : cuda::attention_decode_appends() ? " (decode: warps, appending)"
                                                 : " (decode: warps, appended)";
    const double err = step(lens, nH, nKV, hd, q_std);
    std::printf("[figure] attention_prefill rel_rms %s: %.2e\n", what.c_str(), err);
    EXPECT_LE(err, kTol) << what;
  }

  // bf16 output rounding alone costs ~2e-3; bf16 P in the P.V product adds about as much.
  static constexpr double kTol = 1e-2;
  CpuOps cpu;
  std::unique_ptr<CudaOps> gpu;
  std::mt19937 rng{7};
  int max_blocks = 0;
  std::vector<int> blocks;  // shuffled pool ids, max_blocks per sequence
  std::vector<int> past;    // tokens in each sequence's cache so far
};

// One sequence per step, 27B head layout: fresh chunks of awkward lengths, then chunks on top
// of ~1000 cached tokens written by earlier steps.
TEST_F(AttentionPrefillTest, SingleSequenceGqa256) {
  const DecodeKernelRestored restore;
  const int nH = 24, nKV = 4, hd = 256;
  for (DecodeKernel kernel : kDecodeKernels) {
    use_decode_kernel(kernel);
    for (int T : {1, 17, 63, 500}) {
      init(nKV, hd, 1, 128);
      expect_step({T}, nH, nKV, hd, 1.f);
    }
    init(nKV, hd, 1, 128);
    expect_step({1000}, nH, nKV, hd, 1.f);  // cached context: random keys and values
    expect_step({17}, nH, nKV, hd, 3.f);    // peaked softmax
    expect_step({129}, nH, nKV, hd, 1.f);
    expect_step({1}, nH, nKV, hd, 1.f);
    expect_step({8}, nH, nKV, hd, 2.f);  // a verify block
    expect_step({300}, nH, nKV, hd, 1.f);
  }
}

// 4096 new tokens; one KV group keeps the CPU reference quick (the full 24-head shape is
// checked against the split-KV kernel in Speed27B).
TEST_F(AttentionPrefillTest, Chunk4096) {
  const int nH = 6, nKV = 1, hd = 256;
  init(nKV, hd, 1, 4096 / 16 + 70);
  expect_step({4096}, nH, nKV, hd, 1.f);
  expect_step({1000}, nH, nKV, hd, 1.f);
}

// Several sequences per step on shuffled block tables; steps that mix decodes (split-KV
// kernel) and prefill chunks (flash kernel), decodes first as the scheduler orders them and
// also interleaved.
TEST_F(AttentionPrefillTest, VarlenMixedSteps) {
  const DecodeKernelRestored restore;
  for (DecodeKernel kernel : kDecodeKernels) {
    use_decode_kernel(kernel);
    for (int hd : {256, 128}) {
      const int nH = hd == 256 ? 24 : 8, nKV = hd == 256 ? 4 : 2;
      init(nKV, hd, 3, 64);
      expect_step({300, 17, 129}, nH, nKV, hd, 1.f);
      expect_step({1, 1, 200}, nH, nKV, hd, 1.f);
      expect_step({40, 3, 1}, nH, nKV, hd, 2.f);
      expect_step({16, 17, 63}, nH, nKV, hd, 1.f);
      expect_step({5, 0, 1}, nH, nKV, hd, 1.f);
    }
  }
}

// Decode and verify steps only (every chunk <= 16 tokens) on cached contexts of up to 1.7k, five
// sequences, through each decode kernel (keys split in stretches of at least 128, 256 for verify
// blocks in the flash kernel, 32 in attention_decode_kernel). Blocks of 8 and 16 tokens are 48 and
// 96 packed rows, past attention_decode_kernel's 32: the flash kernel takes those steps.
TEST_F(AttentionPrefillTest, DecodeAndVerifySteps) {
  const DecodeKernelRestored restore;
  const int nH = 24, nKV = 4, hd = 256;
  for (DecodeKernel kernel : kDecodeKernels) {
    use_decode_kernel(kernel);
    init(nKV, hd, 5, 200);
    expect_step({300, 1100, 1700, 64, 1}, nH, nKV, hd, 1.f);  // context (prefill kernel)
    expect_step({1, 1, 1, 1, 1}, nH, nKV, hd, 1.f);
    expect_step({8, 8, 8, 8, 8}, nH, nKV, hd, 2.f);
    expect_step({4, 2, 4, 1, 3}, nH, nKV, hd, 2.f);  // 24 packed rows: attention_decode_kernel's 2 m-tiles
    expect_step({16, 3, 1, 16, 7}, nH, nKV, hd, 1.f);
  }
}

// attention_decode_kernel at head dims 64 and 128 against the flash kernel's packed form and the
// CPU: GQA groups of 8 (4 new tokens fill the kernel's 32 rows; 8 go to the flash kernel) and 3,
// contexts that end inside a key tile and on its last key, sequences of different lengths in one
// step.
TEST_F(AttentionPrefillTest, DecodeSmallHeadDims) {
  const DecodeKernelRestored restore;
  for (DecodeKernel kernel : {DecodeKernel::kFlash, DecodeKernel::kWarps, DecodeKernel::kWarpsAppended}) {
    use_decode_kernel(kernel);
    for (int hd : {64, 128}) {
      const int nH = hd == 64 ? 8 : 6, nKV = hd == 64 ? 1 : 2;
      init(nKV, hd, 3, 80);
      expect_step({1, 63, 500}, nH, nKV, hd, 1.f);  // contexts (prefill kernel)
      expect_step({1, 1, 1}, nH, nKV, hd, 1.f);     // 2, 64 and 501 keys
      expect_step({4, 3, 1}, nH, nKV, hd, 2.f);
      expect_step({1, 2, 4}, nH, nKV, hd, 3.f);
      expect_step({8, 3, 1}, nH, nKV, hd, 1.f);
      expect_step({5, 0, 2}, nH, nKV, hd, 1.f);
    }
  }
}

// Small head dim: fresh and continued chunks.
TEST_F(AttentionPrefillTest, HeadDim128) {
  const int nH = 8, nKV = 2, hd = 128;
  for (int T : {17, 63, 500}) {
    init(nKV, hd, 1, 128);
    expect_step({T}, nH, nKV, hd, 1.f);
  }
  init(nKV, hd, 1, 128);
  expect_step({1000}, nH, nKV, hd, 1.f);
  expect_step({500}, nH, nKV, hd, 1.f);
}

// 27B shape (nH 24, nKV 4, hd 256): a 4096-token chunk without context (the flash kernel's
// output against the split-KV kernel's, and both timed), then 4096- and 256-token chunks on
// 45056 cached tokens (flash kernel only; the 256-token chunk splits its keys).
TEST_F(AttentionPrefillTest, Speed27B) {
  const int nH = 24, nKV = 4, hd = 256, bs = 16;
  const int T = 4096, long_past = 45056;
  const int max_blocks = (long_past + T) / bs;
  const float scale = 1.f / std::sqrt(float(hd));
  Tensor q = gpu->alloc(DType::kBF16, {T, nH, hd});
  Tensor out = gpu->alloc(DType::kBF16, {T, nH * hd});
  Tensor out_old = gpu->alloc(DType::kBF16, {T, nH * hd});
  Tensor kc = gpu->alloc(DType::kBF16, {max_blocks, bs, nKV, hd});
  Tensor vc = gpu->alloc(DType::kBF16, {max_blocks, bs, nKV, hd});
  gpu->fill_random(q, 0.f, 1.7f, 1);  // uniform, std ~1
  gpu->fill_random(kc, 0.f, 1.7f, 2);
  gpu->fill_random(vc, 0.f, 1.7f, 3);
  std::vector<int32_t> table(max_blocks), seq_of_token(T, 0), cu = {0, T};
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  Tensor d_table = gpu->upload(table.data(), DType::kI32, {max_blocks}, DType::kI32);
  Tensor d_cu = gpu->upload(cu.data(), DType::kI32, {2}, DType::kI32);
  Tensor d_sot = gpu->upload(seq_of_token.data(), DType::kI32, {T}, DType::kI32);
  gpu->synchronize();
  auto* bq = static_cast<const cuda::bf16*>(q.data);
  auto* bk = static_cast<cuda::bf16*>(kc.data);
  auto* bv = static_cast<cuda::bf16*>(vc.data);
  auto* cu_p = static_cast<const int32_t*>(d_cu.data);
  auto* tab_p = static_cast<const int32_t*>(d_table.data);

  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto time_ms = [&](auto&& launch, int reps) {
    launch();  // warm-up
    cudaEventRecord(e0);
    for (int i = 0; i < reps; ++i) launch();
    cudaEventRecord(e1);
    EXPECT_EQ(cudaEventSynchronize(e1), cudaSuccess);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms / reps;
  };
  const size_t partial_budget = size_t(64) << 20;
  Tensor partial = gpu->alloc(DType::kF32, {int64_t(partial_budget / 4)});
  for (auto [n_new, n_past] : std::vector<std::pair<int, int>>{{T, 0}, {T, long_past}, {256, long_past}}) {
    const std::vector<int32_t> past = {n_past}, cu_new = {0, n_new};
    Tensor d_past = gpu->upload(past.data(), DType::kI32, {1}, DType::kI32);
    Tensor d_cu_new = gpu->upload(cu_new.data(), DType::kI32, {2}, DType::kI32);
    auto* past_p = static_cast<const int32_t*>(d_past.data);
    const int n_splits = cuda::attention_prefill_splits(1, n_new, nH, hd, n_past + n_new, 1, 512, 2, partial_budget);
    auto flash = [&] {
      cuda::launch_attention_prefill(bq, bk, bv, nullptr, nullptr, static_cast<cuda::bf16*>(out.data),
                                     static_cast<float*>(partial.data), n_splits,
                                     static_cast<const int32_t*>(d_sot.data),
                                     static_cast<const int32_t*>(d_cu_new.data), past_p, tab_p, max_blocks, n_new, 1,
                                     16, INT_MAX, 1, nH, nKV, hd, bs, scale, nullptr);
    };
    const double ms = time_ms(flash, 5);
    const double flops = 4.0 * n_new * (n_past + n_new / 2.0) * hd * nH;  // causal: half of the new-token square
    if (n_past > 0) {
      std::printf("[figure] attention_prefill T=%d n_past=%d nH=%d nKV=%d hd=%d splits=%d: %.3f ms, %.1f TFLOP/s\n",
                  n_new, n_past, nH, nKV, hd, n_splits, ms, flops / ms * 1e-9);
      continue;
    }
    auto old = [&] {
      cuda::launch_attention(bq, bk, bv, static_cast<cuda::bf16*>(out_old.data), nullptr, 1,
                             cuda::attention_row_groups(T, nH, nKV), T, static_cast<const int32_t*>(d_sot.data), cu_p,
                             past_p, tab_p, max_blocks, 0, T, 1, T, nH, nKV, hd, bs, scale, nullptr);
    };
    const double ms_old = time_ms(old, 1);
    std::printf("[figure] attention_prefill T=%d nH=%d nKV=%d hd=%d: %.3f ms, %.1f TFLOP/s (old kernel %.3f ms)\n", T,
                nH, nKV, hd, ms, flops / ms * 1e-9, ms_old);
    std::vector<float> a(out.numel()), b(out.numel());
    gpu->download_f32(out, a.data());
    gpu->download_f32(out_old, b.data());
    const double err = rel_rms(a, b);
    std::printf("[figure] attention_prefill T=%d 27B shape: rel_rms vs split-KV kernel %.2e\n", T, err);
    EXPECT_LE(err, kTol);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace ds
