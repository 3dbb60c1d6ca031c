// Quantized CUDA linears against their CPU twins: the W4A16 GEMV (T <= 256, with and without
// programmatic dependent launch) and the dequantise + cuBLAS path (whole and in blocks of rows)
// on weights repacked by prepare_weight (signed scales, N not a multiple of 16, groups 64 to 512,
// K ending on a short unit, and group 32, which is stored dequantised); gated linears (the input
// gated inside the GEMV) against the separate kernels; the MLP's gate_up with its SiLU gate in the
// GEMV's epilogue (linear_swiglu); the int8 group-128 lm_head (GEMV for T <= 64, blocks of rows +
// cuBLAS above) and dequant-on-gather embedding against CpuOps' int8 twin, and other linears
// published as int8 rows (fused parts, linear_swiglu); Ops::linear_add_rms_norm's deferred norm
// (the GEMV epilogues) against the separate kernels and the CPU; W4A8 (int8 inputs) against the
// CPU's rounding of its inputs. Figures: the streaming ceilings of the GEMVs' ways of reading
// weights, and timings at the Qwen3.8-27B shapes.
// Skipped where there is no GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_ops.h"
#include "cuda/cuda_test_util.h"
#include "backend/cuda/device.h"
#include "backend/cuda/launchers.h"
#include "backend/cuda/cuda_check.h"
#include "ops/int8_rows.h"

namespace ds {
namespace {

using cuda_test::rel_rms;
using cuda_test::random_bf16;
using cuda_test::set_bytes;
using cuda_test::sixteenth_misses;
using cuda_test::nan_half_copy;

constexpr double kCopyGbps = 4260;  // H200 device copy bandwidth measured here (DESIGN.md §6)

// The GEMV settings a test switches (launchers.h), put back as they were when it ends.
struct GemvSettingsRestored {
  bool pdl = cuda::pdl_enabled();
  int tokens = cuda::w4a16_gemv_tokens();
  bool tma = cuda::w4a16_gemv_tma();
  bool x_smem = cuda::w4a16_gemv_x_smem();
  bool wide = cuda::w4a16_gemv_wide();
  bool wgmma = cuda::w4a16_gemv_wgmma();
  bool f16 = cuda::w4a16_gemv_f16();
  bool l2_weights = cuda::w4a16_l2_weights();
  bool int8_wide = cuda::int8_gemv_wide();
  bool kslice = cuda::w4a16_gemv_kslice();
  bool kslice_split = cuda::w4a16_gemv_kslice_split();
  ~GemvSettingsRestored() {
    cuda::set_w4a16_gemv_kslice_split(kslice_split);
    cuda::set_w4a16_gemv_kslice(kslice);
    cuda::set_int8_gemv_wide(int8_wide);
    cuda::set_w4a16_l2_weights(l2_weights);
    cuda::set_w4a16_gemv_f16(f16);
    cuda::set_w4a16_gemv_wide(wide);
    cuda::set_w4a16_gemv_wgmma(wgmma);
    cuda::set_w4a16_gemv_x_smem(x_smem);
    cuda::set_pdl_enabled(pdl);
    cuda::set_w4a16_gemv_tokens(tokens);
    cuda::set_w4a16_gemv_tma(tma);
  }
};

// One sequence of the given token ids (embedding reads only the ids).
StepPlan plan_of(const std::vector<int32_t>& ids) {
  StepPlan p;
  p.token_ids = ids;
  for (size_t i = 0; i < ids.size(); ++i) p.positions.push_back(static_cast<int32_t>(i));
  p.cu_seqlens = {0, static_cast<int32_t>(ids.size())};
  p.n_past = {0};
  p.state_slots = {0};
  p.block_tables = {0};
  p.max_blocks = 1;
  p.logit_rows = {static_cast<int32_t>(ids.size()) - 1};
  return p;
}

class CudaLinearQuantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
    gpu = std::make_unique<CudaOps>();
    cpu.set_int8_vocab(true);
  }
  std::vector<float> download(Tensor t) {
    std::vector<float> h(t.numel());
    gpu->download_f32(t, h.data());
    return h;
  }
  // Mean microseconds of fn over reps calls queued back to back (host clock around a
  // synchronised batch: the stream's own time, launch gaps included).
  template <class Fn>
  double time_us(int reps, Fn fn) {
    fn(0);
    gpu->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn(i);
    gpu->synchronize();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  }

  CpuOps cpu;
  std::unique_ptr<CudaOps> gpu;
  std::mt19937 rng{7};
};

// Random W4A16 weight in the published layout on the GPU (prepared), and its dense fp32 twin.
struct W4Case {
  LinearWeight gpu_w;
  std::vector<float> dense;  // f32 [N, K]
};

W4Case make_w4(CudaOps& gpu, std::mt19937& rng, int N, int K, int group, WeightRole role = WeightRole::kLinear) {
  std::vector<int32_t> packed(size_t(N) * K / 8);
  for (auto& w : packed) w = static_cast<int32_t>(rng());
  std::vector<float> scales = random_bf16(size_t(N) * K / group, rng, 0.02f);  // about half negative
  W4Case c;
  c.dense.resize(size_t(N) * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const uint32_t word = static_cast<uint32_t>(packed[n * (K / 8) + k / 8]);
      c.dense[n * K + k] = float(int((word >> (4 * (k % 8))) & 15u) - 8) * scales[n * (K / group) + k / group];
    }
  c.gpu_w.packed = gpu.upload(packed.data(), DType::kI32, {N, K / 8}, DType::kI32);
  c.gpu_w.scales = gpu.upload(scales.data(), DType::kF32, {N, K / group}, DType::kF32);
  c.gpu_w.group_size = group;
  gpu.prepare_weight(c.gpu_w, role);
  return c;
}

// The int8 twin of x f32 [T, K] (bf16 values) as cuda::GemvInt8In lays it out: per token and
// 64-column chunk q = rint(x * 127 / max |x|), each 4 columns stored in the order 0, 2, 1, 3, and
// the scale max / (127 * 16).
struct HostTwin {
  std::vector<int8_t> q;     // [T, K]
  std::vector<float> scale;  // [T, K / 64]
};
HostTwin host_twin(const std::vector<float>& x, int T, int K) {
  HostTwin h;
  h.q.resize(size_t(T) * K);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < K; c += 64) {
      const float* v = x.data() + size_t(t) * K + c;
      float amax = 0.f;
      for (int k = 0; k < 64; ++k) amax = std::max(amax, std::fabs(v[k]));
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      constexpr int kOrder[4] = {0, 2, 1, 3};
      for (int k = 0; k < 64; ++k)
        h.q[size_t(t) * K + c + (k & ~3) + kOrder[k & 3]] = static_cast<int8_t>(std::nearbyint(v[k] * inv));
      h.scale.push_back(amax / (127.f * 16.f));
    }
  return h;
}
Int8Twin upload_twin(CudaOps& gpu, const HostTwin& h, int T, int K) {
  std::vector<int32_t> words(size_t(T) * K / 4);
  std::memcpy(words.data(), h.q.data(), h.q.size());
  Int8Twin twin;
  twin.q = Tensor(gpu.upload(words.data(), DType::kI32, {int64_t(words.size())}, DType::kI32).data, DType::kI8, {T, K});
  twin.scale = gpu.upload(h.scale.data(), DType::kF32, {T, K / 64}, DType::kF32);
  return twin;
}
HostTwin download_twin(const Int8Twin& twin) {
  HostTwin h;
  h.q.resize(twin.q.numel());
  h.scale.resize(twin.scale.numel());
  CUDA_CHECK(cudaMemcpy(h.q.data(), twin.q.data, h.q.size(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(h.scale.data(), twin.scale.data, h.scale.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// Every token count the GEMV takes (one launch, NT 1/2/4, 32-token slices, 8-token slices, 64
// tokens per launch, NT 8, and 128, NT 16 (wgmma only; 64 for the other kernels), up to
// w4a16_gemv_step_tokens: 200 in slices), with and without programmatic dependent launch, then the
// dequantise + cuBLAS path once (T 300).
struct GemvRun {
  bool pdl;
  int per_launch;
  int T;
};
std::vector<GemvRun> launches_and_tokens() {
  std::vector<GemvRun> v;
  for (bool pdl : {false, true})
    for (int T : {1, 2, 7, 8, 9, 16, 17, 32, 33, 100}) v.push_back({pdl, 32, T});
  for (int T : {9, 20}) v.push_back({true, 8, T});
  for (int T : {33, 64, 100}) v.push_back({true, 64, T});  // NT 8
  for (int T : {65, 128, 200}) v.push_back({true, 128, T});  // NT 16
  v.push_back({true, 32, 200});
  v.push_back({true, 64, 300});
  return v;
}

TEST_F(CudaLinearQuantTest, W4A16MatchesCpu) {
  const GemvSettingsRestored restore;
  struct Shape {
    int N, K, group;
  };
  // K 128, 384 and 640 end on a short unit (2 chunks); group 512 stores its scales once a unit.
  // K 128 and 256 are not split (the TMA kernel's narrow blocks, tma_narrow_warps).
  for (Shape sh : std::vector<Shape>{{96, 128, 128}, {2000, 256, 128}, {200, 384, 128}, {1000, 5120, 128},
                                     {328, 17408, 128}, {24, 640, 128}, {72, 512, 64}, {40, 1024, 256}, {56, 1536, 512},
                                     {40, 256, 32}}) {
    W4Case c = make_w4(*gpu, rng, sh.N, sh.K, sh.group);
    if (sh.group == 32) EXPECT_FALSE(c.gpu_w.quantized()) << "group 32 is stored dequantised";
    else EXPECT_EQ(c.gpu_w.format, WeightFormat::kW4A16Tiled);
    Tensor w_cpu = cpu.upload(c.dense.data(), DType::kF32, {sh.N, sh.K}, DType::kF32);
    for (const GemvRun& run : launches_and_tokens()) {
      const int T = run.T;
      cuda::set_pdl_enabled(run.pdl);
      cuda::set_w4a16_gemv_tokens(run.per_launch);
      std::vector<float> x = random_bf16(size_t(T) * sh.K, rng);
      Tensor xc = cpu.upload(x.data(), DType::kF32, {T, sh.K}, DType::kF32);
      Tensor xg = gpu->upload(x.data(), DType::kF32, {T, sh.K}, DType::kBF16);
      Tensor oc = cpu.scratch(DType::kF32, {T, sh.N}), og = gpu->scratch(DType::kBF16, {T, sh.N});
      cpu.linear(xc, w_cpu, oc);
      std::vector<float> ref(oc.f32(), oc.f32() + oc.numel());
      // The TMA kernels with inputs in shared memory where they fit (the wide kernel from 9
      // tokens, in its wgmma form where built; fp16 inputs, or bf16 ones in 3), or through L1 (the
      // one-tile kernel at every T); the register kernel; the mma.sync wide kernel (4).
      for (int kernel : {0, 1, 2, 3, 4}) {
        cuda::set_w4a16_gemv_tma(kernel != 2);
        cuda::set_w4a16_gemv_x_smem(kernel != 1 && kernel != 2);
        cuda::set_w4a16_gemv_wide(kernel != 1 && kernel != 2);
        cuda::set_w4a16_gemv_f16(kernel != 3);
        if (!cuda::set_w4a16_gemv_wgmma(kernel != 4) && kernel == 0) ADD_FAILURE() << "built without sm_90a";
        gpu->linear_weight(xg, c.gpu_w, og);
        const std::vector<float> got = download(og);
        const std::string what = "w4a16 N" + std::to_string(sh.N) + " K" + std::to_string(sh.K) + " g" +
                                 std::to_string(sh.group) + " T" + std::to_string(T) + (run.pdl ? " pdl" : "") +
                                 " per launch " + std::to_string(run.per_launch) +
                                 (kernel == 0   ? " tma"
                                  : kernel == 1 ? " tma one-tile, x not in smem"
                                  : kernel == 2 ? " regs"
                                  : kernel == 3 ? " tma, bf16 inputs"
                                                : " tma, mma.sync wide");
        EXPECT_LE(rel_rms(got, ref), 5e-3) << what;
        // The GEMV is deterministic (split-K sums in a fixed order).
        if (c.gpu_w.quantized() && T <= cuda::w4a16_gemv_step_tokens()) {
          gpu->linear_quantized(xg, c.gpu_w, og);
          EXPECT_EQ(download(og), got) << what << " repeated";
        }
      }
      gpu->reset_scratch();
      cpu.reset_scratch();
    }
  }
}

// Weights with too many rows to split K (w4a16_gemv_splits 1 on the H200: the TMA kernel's narrow
// blocks of 9 warps) at the 27B's widths: gate_up (34,816 x 5,120,
// paired, swiglu out), a plain 30,000 x 2,560, K 640 ending on a short unit, a paired K 1,152 (4.5
// units). W4A16MatchesCpu's unsplit shapes have K <= 256, one unit a row block; these stream 3 to
// 20 through the narrow rings (3 stages of one unit at one token, 2 at more), their inputs staged
// as fp16 (at 1 and 3 tokens) or read through L1, and check that a repeated launch gives the same
// bits. The shapes of whole units (K 5,120 and 2,560, and 30,008 x 1,280, whose last row block has
// 8 rows) also take the K-slice kernel (qgemv_kslice.cuh), at 1, 3 and 8 tokens.
TEST_F(CudaLinearQuantTest, W4A16UnsplitShapesMatchCpu) {
  const GemvSettingsRestored restore;
  struct Shape {
    int N, K;
    bool paired;
  };
  for (const Shape& sh : {Shape{34816, 5120, true}, Shape{30000, 2560, false}, Shape{26000, 640, false},
                          Shape{26016, 1152, true}, Shape{30008, 1280, false}}) {
    const int N = sh.N, K = sh.K;
    W4Case c = make_w4(*gpu, rng, N, K, 128, sh.paired ? WeightRole::kGateUp : WeightRole::kLinear);
    for (int T : {1, 3, 8})
      for (int form : {0, 1, 2}) {  // inputs staged as fp16, read through L1, the K-slice kernel
        const bool f16 = form != 1, kslice = form == 2;
        if (kslice && K % 256 != 0) continue;
        if (kslice) {
          EXPECT_EQ(cuda::w4a16_gemv_splits(T, N, K), 1) << "N" << N << " K" << K << " T" << T << " unsplit";
        }
        cuda::set_w4a16_gemv_f16(f16);
        cuda::set_w4a16_gemv_kslice(kslice);
        const std::string what = "N" + std::to_string(N) + " K" + std::to_string(K) + " T" + std::to_string(T) +
                                 (kslice ? " k-slice" : f16 ? " f16" : " bf16");
        const std::vector<float> x = random_bf16(size_t(T) * K, rng);
        Tensor xg = gpu->upload(x.data(), DType::kF32, {T, K}, DType::kBF16);
        Tensor xc = cpu.upload(x.data(), DType::kF32, {T, K}, DType::kF32);
        const int out_cols = sh.paired ? N / 2 : N;
        Tensor oc = cpu.scratch(DType::kF32, {T, out_cols}), og = gpu->scratch(DType::kBF16, {T, out_cols});
        auto run_gpu = [&] {
          if (sh.paired) {
            Tensor gate = gpu->scratch(DType::kBF16, {T, out_cols}), up = gpu->scratch(DType::kBF16, {T, out_cols});
            gpu->linear_swiglu(xg, c.gpu_w, gate, up, og);
          } else {
            gpu->linear_weight(xg, c.gpu_w, og);
          }
          return download(og);
        };
        if (sh.paired) {
          LinearWeight w_cpu;
          w_cpu.dense = cpu.upload(c.dense.data(), DType::kF32, {N, K}, DType::kF32);
          Tensor gc = cpu.scratch(DType::kF32, {T, out_cols}), uc = cpu.scratch(DType::kF32, {T, out_cols});
          cpu.linear_swiglu(xc, w_cpu, gc, uc, oc);
        } else {
          cpu.linear(xc, cpu.upload(c.dense.data(), DType::kF32, {N, K}, DType::kF32), oc);
        }
        const std::vector<float> ref(oc.f32(), oc.f32() + oc.numel());
        const std::vector<float> got = run_gpu();
        EXPECT_LE(rel_rms(got, ref), 5e-3) << what;
        EXPECT_EQ(run_gpu(), got) << what << " repeated";
        gpu->reset_scratch();
        cpu.reset_scratch();
      }
  }
}

// The K-slice kernel's split form (qgemv_kslice.cuh) at 2, 5 and 8 tokens on split launches it
// takes: the 27B's down (5,120 x 17,408: 9 splits of 7-8 units) and a qkvz-like 16,392 x 5,120 (3
// splits of 6-7 units; its last tile one row block of 8 rows), against the CPU and bit for bit on a
// repeat. (Which launches it takes depends on the splits, so on the SM count: checked on a GPU of
// 132 SMs, the H100 and H200.)
TEST_F(CudaLinearQuantTest, W4A16KSliceSplitMatchesCpu) {
  const GemvSettingsRestored restore;
  cuda::set_w4a16_gemv_kslice_split(true);
  for (const auto& [N, K] : std::initializer_list<std::pair<int, int>>{{5120, 17408}, {16392, 5120}}) {
    W4Case c = make_w4(*gpu, rng, N, K, 128);
    const Tensor w_cpu = cpu.upload(c.dense.data(), DType::kF32, {N, K}, DType::kF32);
    for (int T : {2, 5, 8}) {
      const std::string what = "N" + std::to_string(N) + " K" + std::to_string(K) + " T" + std::to_string(T);
      const bool takes = cuda::w4a16_gemv_takes_kslice_split(T, N, K, 128);
      if (cuda::sm_count() == 132) {
        EXPECT_TRUE(takes) << what << ": the split form";
      }
      if (!takes) continue;
      const std::vector<float> x = random_bf16(size_t(T) * K, rng);
      Tensor xg = gpu->upload(x.data(), DType::kF32, {T, K}, DType::kBF16);
      Tensor xc = cpu.upload(x.data(), DType::kF32, {T, K}, DType::kF32);
      Tensor oc = cpu.scratch(DType::kF32, {T, N}), og = gpu->scratch(DType::kBF16, {T, N});
      cpu.linear(xc, w_cpu, oc);
      const std::vector<float> ref(oc.f32(), oc.f32() + oc.numel());
      gpu->linear_weight(xg, c.gpu_w, og);
      const std::vector<float> got = download(og);
      EXPECT_LE(rel_rms(got, ref), 5e-3) << what;
      gpu->linear_weight(xg, c.gpu_w, og);
      EXPECT_EQ(download(og), got) << what << " repeated";
      gpu->reset_scratch();
      cpu.reset_scratch();
    }
  }
}

// The diagnostic cuda::w4a16_l2_weights: a one-tile launch reads row block r's unit u (16 rows x
// 256 columns at group 128, with their scales) from unit r + u of the weight, counted row block by
// row block, and nothing outside the weight. Against the CPU linear of that aliased weight, for a
// split and an unsplit (narrow blocks) shape, at 1, 3 and 8 tokens. The wide kernel keeps the true
// layout.
TEST_F(CudaLinearQuantTest, L2WeightsDiagnosticReadsItsWindow) {
  const GemvSettingsRestored restore;
  constexpr int kUnitCols = 256;  // 4 chunks of 64 columns
  for (auto [N, K] : {std::pair{64, 1024}, std::pair{30000, 512}}) {
    W4Case c = make_w4(*gpu, rng, N, K, 128);
    const int units = K / kUnitCols;
    std::vector<float> aliased(size_t(N) * K);  // f32 [N, K]: the weight the diagnostic reads
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) {
        const int window = n / 16 + k / kUnitCols, rb = window / units, u = window % units;
        aliased[size_t(n) * K + k] = c.dense[size_t(16 * rb + n % 16) * K + u * kUnitCols + k % kUnitCols];
      }
    Tensor w_cpu = cpu.upload(aliased.data(), DType::kF32, {N, K}, DType::kF32);
    for (int T : {1, 3, 8}) {
      const std::string what = "N" + std::to_string(N) + " K" + std::to_string(K) + " T" + std::to_string(T);
      const std::vector<float> x = random_bf16(size_t(T) * K, rng);
      Tensor xg = gpu->upload(x.data(), DType::kF32, {T, K}, DType::kBF16);
      Tensor xc = cpu.upload(x.data(), DType::kF32, {T, K}, DType::kF32);
      Tensor oc = cpu.scratch(DType::kF32, {T, N}), og = gpu->scratch(DType::kBF16, {T, N});
      cpu.linear(xc, w_cpu, oc);
      cuda::set_w4a16_l2_weights(true);
      gpu->linear_weight(xg, c.gpu_w, og);
      cuda::set_w4a16_l2_weights(false);
      EXPECT_LE(rel_rms(download(og), std::vector<float>(oc.f32(), oc.f32() + oc.numel())), 5e-3) << what;
      gpu->reset_scratch();
      cpu.reset_scratch();
    }
  }
}

// W4A8 (LinearWeight::act_int8): the one-tile TMA GEMV rounds its staged inputs to int8, each
// token's 64-column chunk with its own scale, and sums on int8 tensor cores. Against the CPU twin
// (the same weight, dense, with act_int8: ops/act_int8.h rounds its inputs; bf16 activations, so a
// gated input is rounded to bf16 first as on the GPU), closer to it than to the linear of
// unrounded inputs, so the rounding did take place: split launches of 1 to 4 tokens, short units,
// groups 64 to 512, gated inputs. Launches that do not take int8 inputs (cuda::w4a16_gemv_takes_a8:
// unsplit ones such as the 27B's gate_up, 8 tokens) are held to the plain twin.
TEST_F(CudaLinearQuantTest, W4A8MatchesCpu) {
  if (!cuda::w4a16_gemv_tma()) GTEST_SKIP() << "W4A8 takes the TMA GEMV (sm_90)";
  struct Shape {
    int N, K, group;
    bool paired = false;
    int gate = -1;  // GateAct, or -1: none
  };
  const int silu = static_cast<int>(GateAct::kSiluMul), sigm = static_cast<int>(GateAct::kMulSigmoid);
  CpuOps cpu_bf16(/*bf16_activations=*/true);
  int n_a8 = 0, n_twin = 0;
  for (const Shape& sh : std::vector<Shape>{{96, 128, 128},
                                            {2000, 256, 128},
                                            {200, 384, 128},
                                            {1000, 5120, 128},
                                            {328, 17408, 128},
                                            {24, 640, 128},
                                            {72, 512, 64},
                                            {40, 1024, 256},
                                            {56, 1536, 512},
                                            {30000, 2560, 128},
                                            {34816, 5120, 128, true},
                                            {200, 1024, 128, false, silu},
                                            {200, 1024, 128, false, sigm},
                                            {5120, 17408, 128, false, silu}}) {
    const int N = sh.N, K = sh.K, out_cols = sh.paired ? N / 2 : N;
    W4Case c = make_w4(*gpu, rng, N, K, sh.group, sh.paired ? WeightRole::kGateUp : WeightRole::kLinear);
    c.gpu_w.act_int8 = true;
    LinearWeight w_cpu;
    w_cpu.dense = cpu_bf16.upload(c.dense.data(), DType::kF32, {N, K}, DType::kF32);
    for (int T : {1, 2, 4, 8}) {
      const std::string what = "N" + std::to_string(N) + " K" + std::to_string(K) + " g" + std::to_string(sh.group) +
                               " T" + std::to_string(T) + (sh.gate < 0 ? "" : " gated " + std::to_string(sh.gate));
      // As CudaOps: a SiLU gate applied while the inputs are staged; a sigmoid one by its own kernel.
      const bool fused_gate = sh.gate == silu && cuda::w4a16_gemv_gates_input(T, N, K, sh.group);
      const bool a8 = cuda::w4a16_gemv_takes_a8(T, N, K, sh.group, fused_gate);
      n_a8 += a8;
      const std::vector<float> x = random_bf16(size_t(T) * K, rng), xb = random_bf16(size_t(T) * K, rng);
      Tensor xg = gpu->upload(x.data(), DType::kF32, {T, K}, DType::kBF16);
      Tensor xbg = gpu->upload(xb.data(), DType::kF32, {T, K}, DType::kBF16);
      Tensor og = gpu->scratch(DType::kBF16, {T, out_cols});
      auto run_gpu = [&] {
        if (sh.paired) {
          Tensor gate = gpu->scratch(DType::kBF16, {T, out_cols}), up = gpu->scratch(DType::kBF16, {T, out_cols});
          gpu->linear_swiglu(xg, c.gpu_w, gate, up, og);
        } else if (sh.gate >= 0) {
          // gated_linear may overwrite its first input: a fresh copy each run
          Tensor a = gpu->upload(x.data(), DType::kF32, {T, K}, DType::kBF16);
          gpu->gated_linear(a, xbg, static_cast<GateAct>(sh.gate), c.gpu_w, og);
        } else {
          gpu->linear_weight(xg, c.gpu_w, og);
        }
        return download(og);
      };
      // The CPU twin with int8 inputs (rounded) and without (plain).
      auto run_cpu = [&](bool rounded) {
        w_cpu.act_int8 = rounded;
        Tensor xc = cpu_bf16.upload(x.data(), DType::kF32, {T, K}, DType::kF32);
        Tensor oc = cpu_bf16.scratch(DType::kF32, {T, out_cols});
        if (sh.paired) {
          Tensor gc = cpu_bf16.scratch(DType::kF32, {T, out_cols}), uc = cpu_bf16.scratch(DType::kF32, {T, out_cols});
          cpu_bf16.linear_swiglu(xc, w_cpu, gc, uc, oc);
        } else if (sh.gate >= 0) {
          cpu_bf16.gated_linear(xc, cpu_bf16.upload(xb.data(), DType::kF32, {T, K}, DType::kF32),
                            static_cast<GateAct>(sh.gate), w_cpu, oc);
        } else {
          cpu_bf16.linear_weight(xc, w_cpu, oc);
        }
        return std::vector<float>(oc.f32(), oc.f32() + oc.numel());
      };
      const std::vector<float> got = run_gpu(), ref = run_cpu(true), plain = run_cpu(false);
      const double err = rel_rms(got, ref), err_plain = rel_rms(got, plain);
      if (a8) {
        EXPECT_LE(err, 3e-3) << what;
        EXPECT_LT(err, 0.5 * err_plain) << what << ": no closer to the int8 inputs than to the plain ones";
      } else {
        EXPECT_LE(err_plain, 5e-3) << what << " (bf16 inputs)";
      }
      EXPECT_EQ(run_gpu(), got) << what << " repeated";
      // The same inputs as a producer's int8 twin (host-made), read through L1 by any launch,
      // unsplit ones included: a fused weight of two parts (linear_parts) or gate_up (linear_swiglu).
      if (sh.gate < 0 && cuda::w4a16_gemv_takes_a8(T, N, K, sh.group, false, true)) {
        RowScale with_twin;
        with_twin.twin = upload_twin(*gpu, host_twin(x, T, K), T, K);
        std::vector<float> got_twin;
        if (sh.paired) {
          Tensor gate = gpu->scratch(DType::kBF16, {T, out_cols}), up = gpu->scratch(DType::kBF16, {T, out_cols});
          gpu->linear_swiglu(xg, c.gpu_w, gate, up, og, with_twin);
          got_twin = download(og);
        } else {
          const int n0 = N / 2;
          const Tensor parts[2] = {gpu->scratch(DType::kBF16, {T, n0}), gpu->scratch(DType::kBF16, {T, N - n0})};
          gpu->linear_parts(xg, c.gpu_w, parts, false, with_twin);
          const std::vector<float> p0 = download(parts[0]), p1 = download(parts[1]);
          for (int t = 0; t < T; ++t) {
            got_twin.insert(got_twin.end(), p0.begin() + size_t(t) * n0, p0.begin() + size_t(t + 1) * n0);
            got_twin.insert(got_twin.end(), p1.begin() + size_t(t) * (N - n0), p1.begin() + size_t(t + 1) * (N - n0));
          }
        }
        const double err_twin = rel_rms(got_twin, ref);
        EXPECT_LE(err_twin, 3e-3) << what << " twin";
        EXPECT_LT(err_twin, 0.5 * rel_rms(got_twin, plain)) << what << " twin: not closer to the int8 inputs";
        ++n_twin;
      }
      gpu->reset_scratch();
      cpu_bf16.reset_scratch();
    }
  }
  // The split launches (K from 1,024 here) take int8 inputs at 1, 2 and 4 tokens.
  EXPECT_GE(n_a8, 3 * 5) << "launches with int8 inputs";
  EXPECT_GE(n_twin, 4 * 10) << "launches reading a twin";
}

// The producer's int8 twin (Ops::linear_add_rms_norm with Int8Twin buffers, the split GEMV's
// epilogue): bit for bit host_twin of the h it writes, at 1, 3 and 8 tokens, for the 27B's o_proj
// (H 5120) and a short last tile (H 320, group 64).
TEST_F(CudaLinearQuantTest, W4A8TwinOfDeferredNorm) {
  struct Shape {
    int H, K, group;
  };
  for (const Shape& sh : {Shape{5120, 6144, 128}, Shape{320, 1024, 64}}) {
    const int H = sh.H, K = sh.K;
    W4Case prod = make_w4(*gpu, rng, H, K, sh.group);
    std::vector<float> norm(H);
    std::uniform_real_distribution<float> ud(0.5f, 1.5f);
    for (auto& v : norm) v = ud(rng);
    Tensor wn = gpu->upload(norm.data(), DType::kF32, {H}, DType::kF32);
    for (int T : {1, 3, 8}) {
      const std::string what = "H" + std::to_string(H) + " T" + std::to_string(T);
      ASSERT_TRUE(gpu->makes_int8_twin(T, H)) << what;
      const std::vector<float> a = random_bf16(size_t(T) * K, rng), x = random_bf16(size_t(T) * H, rng, 4.f);
      Tensor ag = gpu->upload(a.data(), DType::kF32, {T, K}, DType::kBF16);
      Tensor xg = gpu->upload(x.data(), DType::kF32, {T, H}, DType::kBF16);
      Tensor ss = gpu->scratch(DType::kF32, {gpu->norm_parts(H), T});
      Int8Twin buffers{gpu->scratch(DType::kI8, {T, H}), gpu->scratch(DType::kF32, {T, H / 64})};
      NormedAct out{gpu->scratch(DType::kBF16, {T, H}), {}};
      gpu->linear_add_rms_norm(ag, nullptr, GateAct::kSiluMul, prod.gpu_w, xg, wn, 1e-6f, ss, out, buffers);
      ASSERT_FALSE(out.scale.twin.empty()) << what;
      const HostTwin want = host_twin(download(out.h), T, H), got = download_twin(out.scale.twin);
      EXPECT_EQ(got.q, want.q) << what;
      EXPECT_EQ(got.scale, want.scale) << what;
      gpu->reset_scratch();
    }
  }
}

// A fused W4A16 weight (Ops::linear_parts): one GEMV writes parts whose widths are not
// multiples of the 16-row tiles, in one launch, sliced steps and the cuBLAS path.
TEST_F(CudaLinearQuantTest, W4A16PartsMatchCpu) {
  const GemvSettingsRestored restore;
  for (const std::vector<int>& widths : std::vector<std::vector<int>>{{5, 37, 22}, {100, 3}, {16, 16, 16, 9}}) {
    int N = 0;
    for (int w : widths) N += w;
    const int K = 256;
    W4Case c = make_w4(*gpu, rng, N, K, 128);
    Tensor w_cpu = cpu.upload(c.dense.data(), DType::kF32, {N, K}, DType::kF32);
    for (int T : {1, 9, 40, 200, 300}) {  // 200 in GEMV slices, 300 by dequantise + cuBLAS
      std::vector<float> x = random_bf16(size_t(T) * K, rng);
      Tensor xc = cpu.upload(x.data(), DType::kF32, {T, K}, DType::kF32);
      Tensor xg = gpu->upload(x.data(), DType::kF32, {T, K}, DType::kBF16);
      Tensor oc = cpu.scratch(DType::kF32, {T, N});
      cpu.linear(xc, w_cpu, oc);
      std::vector<Tensor> parts;
      for (int w : widths) parts.push_back(gpu->scratch(DType::kBF16, {T, w}));
      for (bool tma : {true, false}) {  // both GEMV kernels (the TMA one wide from 9 tokens)
        cuda::set_w4a16_gemv_tma(tma);
        cuda::set_w4a16_gemv_x_smem(true);
        cuda::set_w4a16_gemv_wide(true);
        gpu->linear_parts(xg, c.gpu_w, parts);
        for (size_t p = 0, r0 = 0; p < parts.size(); r0 += widths[p], ++p) {
          std::vector<float> ref;
          for (int t = 0; t < T; ++t)
            ref.insert(ref.end(), oc.f32() + size_t(t) * N + r0, oc.f32() + size_t(t) * N + r0 + widths[p]);
          EXPECT_LE(rel_rms(download(parts[p]), ref), 5e-3)
              << "part " << p << " of " << widths.size() << ", N " << N << ", T " << T << (tma ? " tma" : " regs");
        }
      }
      gpu->reset_scratch();
      cpu.reset_scratch();
    }
  }
}

// The MLP's gate_up (WeightRole::kGateUp, rows paired in each 16-row block where N % 16 == 0):
// linear_swiglu's GEMV writes silu(gate) * up from its epilogue, bit for bit what linear_parts
// and silu_mul give on the same weight, and both against the CPU, on the one-warp blocks
// (N 34816, the 27B's, K not split), split K (N 400, the last block's sums), the wide kernel
// (9-64 tokens), the register kernel, the cuBLAS path (200 tokens), and N 200 (not paired).
TEST_F(CudaLinearQuantTest, W4A16SwigluMatchesCpu) {
  const GemvSettingsRestored restore;
  struct Shape {
    int N, K;
    bool paired;
  };
  for (const Shape& sh : {Shape{34816, 256, true}, Shape{400, 1024, true}, Shape{200, 512, false}}) {
    const int N = sh.N, K = sh.K, I = N / 2;
    W4Case c = make_w4(*gpu, rng, N, K, 128, WeightRole::kGateUp);
    EXPECT_EQ(c.gpu_w.paired, sh.paired) << "N " << N;
    LinearWeight w_cpu;
    w_cpu.dense = cpu.upload(c.dense.data(), DType::kF32, {N, K}, DType::kF32);
    for (int T : {1, 3, 8, 9, 40, 64, 200, 300}) {
      const std::string what = "N" + std::to_string(N) + " K" + std::to_string(K) + " T" + std::to_string(T);
      const std::vector<float> x = random_bf16(size_t(T) * K, rng);
      Tensor oc = cpu.scratch(DType::kF32, {T, I});
      Tensor gc = cpu.scratch(DType::kF32, {T, I}), uc = cpu.scratch(DType::kF32, {T, I});
      cpu.linear_swiglu(cpu.upload(x.data(), DType::kF32, {T, K}, DType::kF32), w_cpu, gc, uc, oc);
      const std::vector<float> ref(oc.f32(), oc.f32() + oc.numel());
      const std::vector<float> ref_gate(gc.f32(), gc.f32() + gc.numel()), ref_up(uc.f32(), uc.f32() + uc.numel());
      Tensor xg = gpu->upload(x.data(), DType::kF32, {T, K}, DType::kBF16);
      for (int kernel : {0, 1}) {  // the TMA kernels (wide from 9 tokens), the register kernel
        cuda::set_w4a16_gemv_tma(kernel == 0);
        const std::string how = what + (kernel == 0 ? " tma" : " regs");
        Tensor fused = gpu->scratch(DType::kBF16, {T, I}), apart = gpu->scratch(DType::kBF16, {T, I});
        Tensor gate = gpu->scratch(DType::kBF16, {T, I}), up = gpu->scratch(DType::kBF16, {T, I});
        gpu->linear_swiglu(xg, c.gpu_w, gate, up, fused);
        const Tensor parts[2] = {gate, up};
        gpu->linear_parts(xg, c.gpu_w, parts);
        EXPECT_LE(rel_rms(download(gate), ref_gate), 5e-3) << how << " gate";
        EXPECT_LE(rel_rms(download(up), ref_up), 5e-3) << how << " up";
        gpu->silu_mul(gate, up, apart);
        const std::vector<float> got = download(fused);
        EXPECT_EQ(got, download(apart)) << how;
        EXPECT_LE(rel_rms(got, ref), 5e-3) << how;
        // With a buffer for the product's fp16 copy (down_proj's input): filled where the epilogue
        // writes the product (a paired weight, 1-8 tokens, the TMA kernel), the product unchanged.
        Tensor half = gpu->scratch(DType::kF16, {T, I}), copied = gpu->scratch(DType::kBF16, {T, I});
        EXPECT_TRUE(set_bytes(half, 0xFF));  // NaN where unwritten
        gpu->linear_swiglu(xg, c.gpu_w, gate, up, copied, {}, &half);
        EXPECT_EQ(half.data != nullptr, kernel == 0 && sh.paired && T <= 8) << how << " fp16 copy";
        EXPECT_EQ(download(copied), got) << how << " with a copy";
        if (half.data) {
          EXPECT_EQ(sixteenth_misses(*gpu, copied, half), 0) << how << " fp16 copy";
        }
      }
      gpu->reset_scratch();
      cpu.reset_scratch();
    }
  }
}

// Gated linears (Ops::gated_linear: silu(a) * b or a * sigmoid(b), then the linear): the CUDA GEMV
// gates a SiLU-gated input while staging it, bit for bit what silu_mul and the plain GEMV give;
// T 20 and the sigmoid gate take the separate kernels. Both against the CPU.
TEST_F(CudaLinearQuantTest, W4A16GatedLinear) {
  const GemvSettingsRestored restore;
  if (cuda::w4a16_gemv_tma()) {
    EXPECT_TRUE(cuda::w4a16_gemv_gates_input(1, 200, 1024, 128));
    // At 4 tokens the 27B down_proj's inputs take the rings of one-unit stages to fit (qgemv_tma.cuh
    // XSmemForm); at 8 gated inputs go through L1, after the gate's own kernel.
    EXPECT_TRUE(cuda::w4a16_gemv_gates_input(4, 5120, 17408, 128)) << "the 27B down_proj at 4 tokens";
    EXPECT_FALSE(cuda::w4a16_gemv_gates_input(8, 5120, 17408, 128)) << "the 27B down_proj at 8 tokens";
    EXPECT_TRUE(cuda::w4a16_gemv_gates_input(4, 2560, 17408, 128)) << "N 2560 at 4 tokens";
  }
  struct Shape {
    int N, K;
    std::vector<int> tokens;
  };
  // N 2560 x K 17408 at 4 tokens: the one-unit rings (split K, the inputs too long for the others).
  for (const Shape& sh : {Shape{200, 1024, {1, 3, 8, 20}}, Shape{2560, 17408, {4}}}) {
    const int N = sh.N, K = sh.K;
    W4Case c = make_w4(*gpu, rng, N, K, 128);
    LinearWeight w_cpu;
    w_cpu.dense = cpu.upload(c.dense.data(), DType::kF32, {N, K}, DType::kF32);
    for (GateAct act : {GateAct::kSiluMul, GateAct::kMulSigmoid})
      for (int T : sh.tokens) {
        const std::vector<float> a = random_bf16(size_t(T) * K, rng), b = random_bf16(size_t(T) * K, rng);
        const std::string what = std::string(act == GateAct::kSiluMul ? "silu_mul" : "mul_sigmoid") + " N" +
                                 std::to_string(N) + " K" + std::to_string(K) + " T" + std::to_string(T);
        Tensor oc = cpu.scratch(DType::kF32, {T, N});
        cpu.gated_linear(cpu.upload(a.data(), DType::kF32, {T, K}, DType::kF32),
                         cpu.upload(b.data(), DType::kF32, {T, K}, DType::kF32), act, w_cpu, oc);
        const std::vector<float> ref(oc.f32(), oc.f32() + oc.numel());
        Tensor ag = gpu->upload(a.data(), DType::kF32, {T, K}, DType::kBF16);
        Tensor bg = gpu->upload(b.data(), DType::kF32, {T, K}, DType::kBF16);
        Tensor fused = gpu->scratch(DType::kBF16, {T, N}), apart = gpu->scratch(DType::kBF16, {T, N});
        gpu->gated_linear(ag, bg, act, c.gpu_w, fused);
        Tensor xg = gpu->scratch(DType::kBF16, {T, K});
        if (act == GateAct::kSiluMul) {
          gpu->silu_mul(ag, bg, xg);
        } else {
          xg = gpu->upload(a.data(), DType::kF32, {T, K}, DType::kBF16);  // a may have been gated in place
          gpu->sigmoid_mul(xg, bg);
        }
        gpu->linear_weight(xg, c.gpu_w, apart);
        const std::vector<float> got = download(fused);
        EXPECT_EQ(got, download(apart)) << what;
        EXPECT_LE(rel_rms(got, ref), 5e-3) << what;
        gpu->reset_scratch();
        cpu.reset_scratch();
      }
  }
}

// Ops::linear_add_rms_norm at 1, 3 and 8 tokens, where CUDA leaves the division by the RMS to the
// linears after it: the GEMV's epilogue adds its rows to x, writes h = x * w and its tiles' sums of
// squares, and the consumers scale their outputs (RowScale). Against the same ops with the norm
// not deferred (no sums given) and against the CPU: x bit for bit the separate kernels', every
// consumer within bf16 of both, 1e-2 (a tiled linear of three parts, a paired gate_up through
// linear_swiglu, the small dense GEMV of two parts), the same bits on a second launch, and the
// tiled parts given the fp16 copy against those without it. Then a down_proj of the product, a
// second linear_add_rms_norm, given the product's fp16 copy from linear_swiglu and not. Shapes: the
// 27B's o_proj (gated by sigmoid) and down, the consumers its attention's qkv; H 1152, where the
// unsplit gate_up (the 27B's 34,816 rows) takes 18 chunks a row block: 5 stages a warp, the last of
// 2 chunks, and the early refill of stage 2 asks for it; and N 320 (a short last tile) at group
// 64. At 3 and 8 tokens again with the K-slice kernel's split form on (on the 27B's shapes it takes
// qkv and down: w4a16_gemv_takes_kslice_split).
TEST_F(CudaLinearQuantTest, DeferredNormMatchesSeparate) {
  const GemvSettingsRestored restore;
  struct Shape {
    int H, K, group;
    bool gated;
    int I;
    std::array<int, 3> parts;
    bool unsplit_gate_up = false;  // checked: gate_up takes one split (narrow blocks) at one token
  };
  constexpr float kEps = 1e-6f;
  for (const Shape& sh : {Shape{5120, 6144, 128, true, 17408, {12288, 1024, 1024}},
                          Shape{5120, 17408, 128, false, 17408, {12288, 1024, 1024}},
                          Shape{1152, 3072, 128, false, 17408, {1024, 256, 128}, true},
                          Shape{320, 1024, 64, false, 448, {128, 64, 48}}}) {
    const int H = sh.H, K = sh.K, I = sh.I, Nq = sh.parts[0] + sh.parts[1] + sh.parts[2];
    constexpr int kSmallRows = 48;  // each of the small GEMV's two parts
    W4Case prod = make_w4(*gpu, rng, H, K, sh.group);
    W4Case gu = make_w4(*gpu, rng, 2 * I, H, sh.group, WeightRole::kGateUp);
    W4Case qkv = make_w4(*gpu, rng, Nq, H, sh.group);
    W4Case down = make_w4(*gpu, rng, H, I, sh.group);
    const std::vector<float> small = random_bf16(size_t(2 * kSmallRows) * H, rng, 0.05f);
    std::vector<float> norm(H);
    std::uniform_real_distribution<float> ud(0.5f, 1.5f);
    for (auto& v : norm) v = ud(rng);
    LinearWeight prod_c, gu_c, qkv_c, down_c, small_c, small_g;
    prod_c.dense = cpu.upload(prod.dense.data(), DType::kF32, {H, K}, DType::kF32);
    gu_c.dense = cpu.upload(gu.dense.data(), DType::kF32, {2 * I, H}, DType::kF32);
    qkv_c.dense = cpu.upload(qkv.dense.data(), DType::kF32, {Nq, H}, DType::kF32);
    down_c.dense = cpu.upload(down.dense.data(), DType::kF32, {H, I}, DType::kF32);
    small_c.dense = cpu.upload(small.data(), DType::kF32, {2 * kSmallRows, H}, DType::kF32);
    small_g.dense = gpu->upload(small.data(), DType::kF32, {2 * kSmallRows, H}, DType::kBF16);
    if (sh.unsplit_gate_up) {
      EXPECT_EQ(cuda::w4a16_gemv_splits(1, 2 * I, H), 1) << "H" << H << " gate_up unsplit";
    }
    // At 3 and 8 tokens also with the split launches on the K-slice kernel's split form.
    for (const auto& [T, kslice_split] :
         std::initializer_list<std::pair<int, bool>>{{1, false}, {3, false}, {8, false}, {3, true}, {8, true}}) {
      cuda::set_w4a16_gemv_kslice_split(kslice_split);
      const std::string what = "H" + std::to_string(H) + " K" + std::to_string(K) + " T" + std::to_string(T) +
                               (kslice_split ? " k-slice split" : "");
      if (kslice_split && H == 5120 && cuda::sm_count() == 132) {  // (its splits depend on the SM count)
        EXPECT_TRUE(cuda::w4a16_gemv_takes_kslice_split(T, Nq, H, sh.group)) << what << " qkv on the split form";
        EXPECT_TRUE(cuda::w4a16_gemv_takes_kslice_split(T, H, I, sh.group)) << what << " down on the split form";
      }
      const std::vector<float> a = random_bf16(size_t(T) * K, rng), b = random_bf16(size_t(T) * K, rng),
                               x = random_bf16(size_t(T) * H, rng, 4.f);
      // x after the op, then the consumers' outputs: 3 parts, silu(gate) * up, 2 small parts; then
      // x after the down_proj of silu(gate) * up.
      using Results = std::vector<std::vector<float>>;
      // copy: the norm's fp16 copy made where the backend makes one; gated_copy: the product's.
      // poison (bits 1: the norm's copy, 2: the product's): zeros written over the copy once made,
      // so that a consumer which reads it gives other results. made_copy, made_gated_copy: whether
      // the last run on the GPU made them; down_fused: whether its down_proj took the fused GEMV
      // (which reads the product's copy; the default ops read the product).
      bool made_copy = false, made_gated_copy = false, down_fused = false;
      auto run = [&](Ops& ops, const LinearWeight& wp, const LinearWeight& wgu, const LinearWeight& wq,
                     const LinearWeight& wd, const LinearWeight& ws, DType dt, bool defer, bool copy = true,
                     bool gated_copy = true, int poison = 0) {
        Tensor ag = ops.upload(a.data(), DType::kF32, {T, K}, dt), bg = ops.upload(b.data(), DType::kF32, {T, K}, dt);
        Tensor xg = ops.upload(x.data(), DType::kF32, {T, H}, dt);
        Tensor wn = ops.upload(norm.data(), DType::kF32, {H}, DType::kF32);
        Tensor ss = defer ? ops.scratch(DType::kF32, {ops.norm_parts(H), T}) : Tensor{};
        NormedAct out{ops.scratch(dt, {T, H}), {}};
        // The fp16 copy of out.h / 16 where the backend makes one (CUDA at 1-8 tokens), which the
        // unsplit gate_up reads instead of out.h (the 27B's I: 34,816 rows).
        Tensor half = nan_half_copy(ops, copy && defer, T, H);
        ops.linear_add_rms_norm(ag, sh.gated ? &bg : nullptr, GateAct::kMulSigmoid, wp, xg, wn, kEps, ss, out, {},
                                half);
        if (&ops == gpu.get()) {
          // Deferred wherever the GEMV takes one split-K launch of the one-tile kernel (the
          // sigmoid-gated o_proj too, its gate applied by a kernel of its own).
          EXPECT_EQ(!out.scale.empty(), defer && cuda::w4a16_gemv_norms_output(T, H, K, sh.group, false)) << what;
          EXPECT_EQ(out.scale.half.data != nullptr,
                    copy && !out.scale.empty() && cuda::w4a16_gemv_reads_f16_copy(T))
              << what << " fp16 copy";
          if (out.scale.half.data) {  // out.h / 16
            EXPECT_EQ(sixteenth_misses(ops, out.h, out.scale.half), 0) << what << " fp16 copy";
            if (poison & 1) {
              EXPECT_TRUE(set_bytes(out.scale.half, 0));
            }
          }
          made_copy = out.scale.half.data != nullptr;
        }
        const Tensor q[3] = {ops.scratch(dt, {T, sh.parts[0]}), ops.scratch(dt, {T, sh.parts[1]}),
                             ops.scratch(dt, {T, sh.parts[2]})};
        ops.linear_parts(out.h, wq, q, false, out.scale);
        Tensor gate = ops.scratch(dt, {T, I}), up = ops.scratch(dt, {T, I}), gated = ops.scratch(dt, {T, I});
        Tensor gated_half = nan_half_copy(ops, gated_copy && defer, T, I);
        ops.linear_swiglu(out.h, wgu, gate, up, gated, out.scale, &gated_half);
        if (&ops == gpu.get()) {
          EXPECT_EQ(gated_half.data != nullptr, gated_copy && defer && cuda::w4a16_gemv_reads_f16_copy(T))
              << what << " the product's fp16 copy";
          if (gated_half.data) {
            EXPECT_EQ(sixteenth_misses(ops, gated, gated_half), 0) << what << " the product's copy";
            if (poison & 2) {
              EXPECT_TRUE(set_bytes(gated_half, 0));
            }
          }
          made_gated_copy = gated_half.data != nullptr;
        }
        const Tensor sm[2] = {ops.scratch(dt, {T, kSmallRows}), ops.scratch(dt, {T, kSmallRows})};
        ops.linear_parts(out.h, ws, sm, true, out.scale);
        Results r;
        for (Tensor t : {xg, q[0], q[1], q[2], gated, sm[0], sm[1]}) {
          std::vector<float> h(t.numel());
          ops.download_f32(t, h.data());
          r.push_back(std::move(h));
        }
        Tensor ss2 = defer ? ops.scratch(DType::kF32, {ops.norm_parts(H), T}) : Tensor{};
        NormedAct out2{ops.scratch(dt, {T, H}), {}};
        ops.linear_add_rms_norm(gated, nullptr, GateAct::kSiluMul, wd, xg, wn, kEps, ss2, out2, {}, {}, gated_half);
        if (&ops == gpu.get()) down_fused = !out2.scale.empty();
        r.emplace_back(xg.numel());
        ops.download_f32(xg, r.back().data());
        ops.reset_scratch();
        return r;
      };
      const Results ref = run(cpu, prod_c, gu_c, qkv_c, down_c, small_c, DType::kF32, true);
      const Results apart = run(*gpu, prod.gpu_w, gu.gpu_w, qkv.gpu_w, down.gpu_w, small_g, DType::kBF16, false);
      const Results deferred = run(*gpu, prod.gpu_w, gu.gpu_w, qkv.gpu_w, down.gpu_w, small_g, DType::kBF16, true);
      EXPECT_EQ(run(*gpu, prod.gpu_w, gu.gpu_w, qkv.gpu_w, down.gpu_w, small_g, DType::kBF16, true), deferred)
          << what;
      // The tiled parts (qkvz, qkv) stage the fp16 copy as it is where they stage their inputs: at
      // 1-4 tokens the bits of the staging that makes their bf16 inputs fp16, at 5-8 fp16 inputs
      // where the launch without the copy takes bf16.
      const Results no_copy =
          run(*gpu, prod.gpu_w, gu.gpu_w, qkv.gpu_w, down.gpu_w, small_g, DType::kBF16, true, false, false);
      for (int i = 1; i <= 3; ++i) {
        if (T <= 4) EXPECT_EQ(deferred[i], no_copy[i]) << what << " part " << i - 1 << " staged from the copy";
        else EXPECT_LE(rel_rms(deferred[i], no_copy[i]), 1e-2) << what << " part " << i - 1 << " staged from the copy";
      }
      // down_proj given the product's copy (which it stages as it is) against the same product
      // without one: likewise.
      const Results no_gated_copy =
          run(*gpu, prod.gpu_w, gu.gpu_w, qkv.gpu_w, down.gpu_w, small_g, DType::kBF16, true, true, false);
      EXPECT_EQ(deferred[4], no_gated_copy[4]) << what << " swiglu with a copy";
      if (T <= 4) EXPECT_EQ(deferred[7], no_gated_copy[7]) << what << " down staged from the copy";
      else EXPECT_LE(rel_rms(deferred[7], no_gated_copy[7]), 1e-3) << what << " down staged from the copy";
      // The consumers read the copies where they are made: with zeros written over a copy, every
      // linear that reads it gives zeros (the down_proj adds none to x), far from its results.
      const char* names[8] = {" x", " part 0", " part 1", " part 2", " swiglu", " small 0", " small 1", " down x"};
      const Results poisoned =
          run(*gpu, prod.gpu_w, gu.gpu_w, qkv.gpu_w, down.gpu_w, small_g, DType::kBF16, true, true, true, 1);
      if (made_copy) {
        for (int i = 1; i <= 4; ++i)
          EXPECT_GT(rel_rms(poisoned[i], deferred[i]), 0.5) << what << names[i] << " read the norm's copy";
      }
      const Results gated_poisoned =
          run(*gpu, prod.gpu_w, gu.gpu_w, qkv.gpu_w, down.gpu_w, small_g, DType::kBF16, true, true, true, 2);
      if (made_gated_copy && down_fused) {  // (N 320 x K 448 takes the default ops: one split)
        std::vector<float> added(deferred[7].size()), added_poisoned(added.size());  // down_proj's part of x
        for (size_t i = 0; i < added.size(); ++i) {
          added[i] = deferred[7][i] - deferred[0][i];
          added_poisoned[i] = gated_poisoned[7][i] - gated_poisoned[0][i];
        }
        EXPECT_GT(rel_rms(added_poisoned, added), 0.5) << what << " down read the product's copy";
        EXPECT_EQ(gated_poisoned[4], deferred[4]) << what << " swiglu";
      }
      EXPECT_EQ(deferred[0], apart[0]) << what << " x";
      EXPECT_LE(rel_rms(deferred[0], ref[0]), 3e-3) << what << " x";
      for (int i = 1; i < 8; ++i) {
        EXPECT_LE(rel_rms(deferred[i], apart[i]), 1e-2) << what << names[i];
        EXPECT_LE(rel_rms(deferred[i], ref[i]), 1e-2) << what << names[i];
        EXPECT_LE(rel_rms(apart[i], ref[i]), 1e-2) << what << names[i];
      }
    }
  }
}

// The dequantise + cuBLAS path in blocks of rows: with a 2 MiB step scratch, a weight of N 1000
// x K 2048 (4 MB in bf16) is dequantised 128 rows at a time (the least block; a quarter of the
// free scratch holds fewer), and the blocks cross the parts of a fused weight. (A fused 27B
// gate_up, 357 MB in bf16, once exhausted the 256 MiB scratch of a serving step.)
TEST_F(CudaLinearQuantTest, W4A16DequantInRowBlocks) {
  CudaOpsOptions o;
  o.scratch_bytes = size_t(2) << 20;
  CudaOps small(o);
  const std::vector<int> widths = {300, 77, 623};
  const int N = 1000, K = 2048, T = cuda::w4a16_gemv_step_tokens() + 8;  // past the GEMV's steps: cuBLAS
  W4Case c = make_w4(small, rng, N, K, 128);
  Tensor w_cpu = cpu.upload(c.dense.data(), DType::kF32, {N, K}, DType::kF32);
  std::vector<float> x = random_bf16(size_t(T) * K, rng);
  Tensor xc = cpu.upload(x.data(), DType::kF32, {T, K}, DType::kF32);
  Tensor xg = small.upload(x.data(), DType::kF32, {T, K}, DType::kBF16);
  Tensor oc = cpu.scratch(DType::kF32, {T, N});
  cpu.linear(xc, w_cpu, oc);
  std::vector<Tensor> parts;
  for (int w : widths) parts.push_back(small.scratch(DType::kBF16, {T, w}));
  small.linear_parts(xg, c.gpu_w, parts);
  for (size_t p = 0, r0 = 0; p < parts.size(); r0 += widths[p], ++p) {
    std::vector<float> ref, got(parts[p].numel());
    for (int t = 0; t < T; ++t)
      ref.insert(ref.end(), oc.f32() + size_t(t) * N + r0, oc.f32() + size_t(t) * N + r0 + widths[p]);
    small.download_f32(parts[p], got.data());
    EXPECT_LE(rel_rms(got, ref), 5e-3) << "part " << p;
  }
  // A paired gate_up weight (N 1040 in blocks of 128 rows and a last one of 16): each block is
  // dequantised as its rows of the two halves.
  const int NP = 1040;
  small.reset_scratch();
  W4Case pc = make_w4(small, rng, NP, K, 128, WeightRole::kGateUp);
  ASSERT_TRUE(pc.gpu_w.paired);
  Tensor pw_cpu = cpu.upload(pc.dense.data(), DType::kF32, {NP, K}, DType::kF32);
  Tensor pref = cpu.scratch(DType::kF32, {T, NP});
  cpu.linear(xc, pw_cpu, pref);
  const Tensor halves[2] = {small.scratch(DType::kBF16, {T, NP / 2}), small.scratch(DType::kBF16, {T, NP / 2})};
  small.linear_parts(xg, pc.gpu_w, halves);
  for (int p = 0; p < 2; ++p) {
    std::vector<float> ref, got(halves[p].numel());
    for (int t = 0; t < T; ++t)
      ref.insert(ref.end(), pref.f32() + size_t(t) * NP + p * NP / 2, pref.f32() + size_t(t) * NP + (p + 1) * NP / 2);
    small.download_f32(halves[p], got.data());
    EXPECT_LE(rel_rms(got, ref), 5e-3) << "paired half " << p;
  }
}

TEST_F(CudaLinearQuantTest, Int8VocabMatchesCpuTwin) {
  GemvSettingsRestored restore;
  // H 384: 6 chunks (a short last unit of the wide GEMV's 4) and 3 groups (its last box of 2 half out).
  for (auto [V, H] : std::vector<std::pair<int, int>>{{1000, 256}, {3001, 5120}, {777, 384}}) {
    const std::vector<float> table = random_bf16(size_t(V) * H, rng, 0.05f);
    LinearWeight wc, wg;
    wc.dense = cpu.upload(table.data(), DType::kF32, {V, H}, DType::kF32);
    wg.dense = gpu->upload(table.data(), DType::kF32, {V, H}, DType::kBF16);
    cpu.prepare_weight(wc, WeightRole::kLmHead);  // fp32 values become q * scale in place
    gpu->prepare_weight(wg, WeightRole::kLmHead);
    ASSERT_EQ(wg.format, WeightFormat::kInt8Tiled);
    ASSERT_TRUE(wg.quantized() && !wc.quantized());

    // Gather: bit-exact against bf16(q * scale) of the host quantisation.
    std::vector<int32_t> ids;
    for (int i = 0; i < 37; ++i) ids.push_back((i * 7919 + 13) % V);
    ids.push_back(V - 1);
    gpu->begin_step(plan_of(ids));
    Tensor emb = gpu->scratch(DType::kBF16, {int64_t(ids.size()), H});
    gpu->embedding(wg, emb);
    const std::vector<float> got = download(emb);
    const float* twin = wc.dense.f32();
    std::vector<int8_t> q(size_t(V) * H);
    std::vector<float> scales(size_t(V) * H / kInt8Group);
    quantize_int8_rows(table.data(), V, H, q.data(), scales.data());
    size_t mismatches = 0, twin_mismatches = 0;
    for (size_t t = 0; t < ids.size(); ++t)
      for (int k = 0; k < H; ++k) {
        const size_t e = size_t(ids[t]) * H + k;
        const float want = float(q[e]) * scales[e / kInt8Group];
        mismatches += got[t * H + k] != bf16_to_f32(f32_to_bf16(want));
        twin_mismatches += twin[e] != want;
      }
    EXPECT_EQ(mismatches, 0u) << "int8 embedding V" << V << " H" << H;
    EXPECT_EQ(twin_mismatches, 0u) << "CPU twin";

    // lm_head: the GEMV (T <= 64, incl. split K for small V; at 9-64 tokens the wide kernel where
    // the GPU has one, and the one-tile kernel) and blocks of rows + cuBLAS (T > 64).
    for (bool wide : {true, false}) {
      cuda::set_int8_gemv_wide(wide);
      for (int T : {1, 8, 9, 16, 17, 33, 40, 64, 65, 130}) {
        if (!wide && T > 8 && T <= 64 && T != 33) continue;  // the one-tile kernel: one of its instances
        std::vector<float> x = random_bf16(size_t(T) * H, rng);
        Tensor xc = cpu.upload(x.data(), DType::kF32, {T, H}, DType::kF32);
        Tensor xg = gpu->upload(x.data(), DType::kF32, {T, H}, DType::kBF16);
        Tensor oc = cpu.scratch(DType::kF32, {T, V}), og = gpu->scratch(DType::kBF16, {T, V});
        cpu.linear(xc, wc.dense, oc);
        gpu->linear_quantized(xg, wg, og);
        std::vector<float> ref(oc.f32(), oc.f32() + oc.numel());
        EXPECT_LE(rel_rms(download(og), ref), 5e-3)
            << "int8 lm_head V" << V << " H" << H << " T" << T << (wide ? " wide" : " one-tile");
        cpu.reset_scratch();
      }
    }
    gpu->reset_scratch();
  }
}

// A table published as int8 rows (Ops::upload_int8_rows) is stored byte for byte as the same
// values in bf16 are by prepare_weight, padding included (V not a whole number of 16-row blocks,
// and past one host piece of 1,024 blocks). Codes of -128, in the published range but not the
// quantiser's, gather as q * s (power-of-two scales: exact in bf16).
TEST_F(CudaLinearQuantTest, Int8RowsUploadAsPrepared) {
  for (auto [V, H] : std::vector<std::pair<int, int>>{{37, 256}, {16 * 1024 + 21, 384}}) {
    const std::vector<float> table = random_bf16(size_t(V) * H, rng, 0.05f);
    std::vector<int8_t> q(size_t(V) * H);
    std::vector<float> scales(size_t(V) * H / kInt8Group);
    quantize_int8_rows(table.data(), V, H, q.data(), scales.data());
    LinearWeight prepared;
    prepared.dense = gpu->upload(table.data(), DType::kF32, {V, H}, DType::kBF16);
    gpu->prepare_weight(prepared, WeightRole::kEmbedding);
    ASSERT_TRUE(gpu->keeps_int8_vocab(H));
    const LinearWeight direct = gpu->upload_int8_rows(q.data(), scales.data(), V, H);
    ASSERT_EQ(direct.format, WeightFormat::kInt8Tiled);
    EXPECT_EQ(direct.rows, V);
    EXPECT_EQ(direct.group_size, 128);
    auto bytes = [](Tensor t) {
      std::vector<uint8_t> h(t.nbytes());
      CUDA_CHECK(cudaMemcpy(h.data(), t.data, h.size(), cudaMemcpyDeviceToHost));
      return h;
    };
    ASSERT_EQ(direct.packed.nbytes(), prepared.packed.nbytes());
    EXPECT_TRUE(bytes(direct.packed) == bytes(prepared.packed)) << "codes V" << V << " H" << H;
    EXPECT_TRUE(bytes(direct.scales) == bytes(prepared.scales)) << "scales V" << V << " H" << H;
  }
  // Every code from -128 to 127, in an order of its own in each row.
  const int V = 20, H = 128;
  std::vector<int8_t> q(size_t(V) * H);
  std::vector<float> scales(V);
  for (int r = 0; r < V; ++r) {
    scales[r] = std::ldexp(1.f, -6 - r % 3);
    for (int k = 0; k < H; ++k) q[size_t(r) * H + k] = static_cast<int8_t>((r * 31 + k * 17) % 256 - 128);
  }
  const LinearWeight w = gpu->upload_int8_rows(q.data(), scales.data(), V, H);
  std::vector<int32_t> ids(V);
  for (int r = 0; r < V; ++r) ids[r] = V - 1 - r;
  gpu->begin_step(plan_of(ids));
  Tensor emb = gpu->scratch(DType::kBF16, {V, H});
  gpu->embedding(w, emb);
  const std::vector<float> got = download(emb);
  size_t mismatches = 0;
  for (int t = 0; t < V; ++t)
    for (int k = 0; k < H; ++k)
      mismatches += got[size_t(t) * H + k] != float(q[size_t(ids[t]) * H + k]) * scales[ids[t]];
  EXPECT_EQ(mismatches, 0u);
  gpu->reset_scratch();
}

// Linears published as int8 rows (the seed's MTP head; Ops::upload_int8_rows) against the CPU,
// which holds their values in fp32: fused parts whose widths are not whole 16-row blocks (one
// int8 GEMV writes them all up to 64 tokens, cuBLAS on dequantised rows above), a consumer's norm
// scale (RowScale, applied after), and a gate_up through linear_swiglu. Codes span -128..127.
TEST_F(CudaLinearQuantTest, Int8RowsLinearsMatchCpu) {
  const int K = 384;
  auto int8_weight = [&](int N, Ops& ops, std::vector<int8_t>& q, std::vector<float>& scales) {
    q.resize(size_t(N) * K);
    for (int8_t& c : q) c = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
    scales = random_bf16(size_t(N) * K / kInt8Group, rng, 0.01f);
    return ops.upload_int8_rows(q.data(), scales.data(), N, K);
  };
  for (const std::vector<int>& widths : std::vector<std::vector<int>>{{37, 100, 16}, {200}}) {
    int N = 0;
    for (int w : widths) N += w;
    std::vector<int8_t> q;
    std::vector<float> scales;
    const LinearWeight wg = int8_weight(N, *gpu, q, scales);
    ASSERT_EQ(wg.format, WeightFormat::kInt8Tiled);
    const LinearWeight wc = cpu.upload_int8_rows(q.data(), scales.data(), N, K);
    for (int T : {1, 8, 9, 63, 64, 65, 500}) {
      for (bool scaled : {false, true}) {
        const std::string what = "N " + std::to_string(N) + " T " + std::to_string(T) + (scaled ? " scaled" : "");
        const std::vector<float> x = random_bf16(size_t(T) * K, rng);
        std::vector<float> ss(T);
        for (float& v : ss) v = float(K) * (0.5f + float(rng() % 1000) / 1000.f);
        RowScale sc, sg;
        if (scaled) {
          sc.ss = cpu.upload(ss.data(), DType::kF32, {1, T}, DType::kF32);
          sg.ss = gpu->upload(ss.data(), DType::kF32, {1, T}, DType::kF32);
          sc.eps = sg.eps = 1e-6f;
        }
        std::vector<Tensor> pc, pg;
        for (int w : widths) {
          pc.push_back(cpu.scratch(DType::kF32, {T, w}));
          pg.push_back(gpu->scratch(DType::kBF16, {T, w}));
        }
        cpu.linear_parts(cpu.upload(x.data(), DType::kF32, {T, K}, DType::kF32), wc, pc, false, sc);
        gpu->linear_parts(gpu->upload(x.data(), DType::kF32, {T, K}, DType::kBF16), wg, pg, false, sg);
        for (size_t p = 0; p < widths.size(); ++p) {
          const std::vector<float> ref(pc[p].f32(), pc[p].f32() + pc[p].numel());
          EXPECT_LE(rel_rms(download(pg[p]), ref), 5e-3) << what << " part " << p;
        }
        gpu->reset_scratch();
        cpu.reset_scratch();
      }
    }
  }
  // gate_up [2I, K] (WeightRole::kGateUp) through linear_swiglu: the product of its two parts.
  const int I = 72;
  std::vector<int8_t> q;
  std::vector<float> scales;
  LinearWeight wg = int8_weight(2 * I, *gpu, q, scales);
  gpu->prepare_weight(wg, WeightRole::kGateUp);
  ASSERT_EQ(wg.format, WeightFormat::kInt8Tiled);
  const LinearWeight wc = cpu.upload_int8_rows(q.data(), scales.data(), 2 * I, K);
  for (int T : {1, 63, 500}) {
    const std::vector<float> x = random_bf16(size_t(T) * K, rng);
    Tensor gc = cpu.scratch(DType::kF32, {T, I}), uc = cpu.scratch(DType::kF32, {T, I});
    Tensor oc = cpu.scratch(DType::kF32, {T, I});
    cpu.linear_swiglu(cpu.upload(x.data(), DType::kF32, {T, K}, DType::kF32), wc, gc, uc, oc);
    Tensor gg = gpu->scratch(DType::kBF16, {T, I}), ug = gpu->scratch(DType::kBF16, {T, I});
    Tensor og = gpu->scratch(DType::kBF16, {T, I});
    gpu->linear_swiglu(gpu->upload(x.data(), DType::kF32, {T, K}, DType::kBF16), wg, gg, ug, og);
    EXPECT_LE(rel_rms(download(og), std::vector<float>(oc.f32(), oc.f32() + oc.numel())), 5e-3) << "swiglu T " << T;
    gpu->reset_scratch();
    cpu.reset_scratch();
  }
}

// The ceilings of the GEMVs' two ways of reading weights (stream_probe.cu), as figures: bulk-copy
// rings by copy size, stages and warps an SM (2,176 bytes is one W4A16 unit at group 128; 8 warps
// x 3 blocks of 2 x 4,352 bytes are the split launches at one token, 9 warps x 2 blocks of 2 x
// 2,176 the unsplit ones such as gate_up: qgemv_tma.cuh kNarrowStages), each warp's pieces one
// stream or spread as one front over the buffer, filled by bulk copies or by the warp's 16-byte
// cp.async; and 16-byte loads in flight.
TEST_F(CudaLinearQuantTest, StreamingCeilings) {
  struct Bulk {
    int bytes, stages, threads, blocks_per_sm;
    cuda::StreamProbe::Method method = cuda::StreamProbe::kBulk;
  };
  constexpr auto kAsync = cuda::StreamProbe::kAsync;
  for (Bulk b : std::vector<Bulk>{{2176, 2, 288, 2},
                                  {2176, 2, 288, 2, kAsync},
                                  {2176, 3, 288, 2, kAsync},
                                  {4352, 2, 256, 3, kAsync},
                                  {2176, 4, 256, 3, kAsync},
                                  {2176, 3, 288, 2},
                                  {2176, 4, 288, 2},
                                  {2176, 5, 288, 2},
                                  {4352, 2, 288, 2},
                                  {1024, 4, 256, 3},
                                  {2176, 3, 256, 2},
                                  {2176, 3, 256, 3},
                                  {2176, 4, 256, 3},
                                  {2176, 6, 256, 2},
                                  {4352, 2, 256, 3},
                                  {4352, 3, 256, 2},
                                  {8704, 2, 128, 3},
                                  {16384, 2, 64, 3},
                                  {4352, 2, 32, 17},
                                  {2176, 4, 32, 17},
                                  {2176, 5, 32, 17}})
    for (auto order : {cuda::StreamProbe::kStreams, cuda::StreamProbe::kFront}) {
      const cuda::StreamProbe p{.method = b.method, .order = order, .bytes = b.bytes, .stages = b.stages,
                                .threads = b.threads, .blocks_per_sm = b.blocks_per_sm};
      const double gbps = cuda::stream_probe_gbps(p);
      EXPECT_GT(gbps, 0);
      std::printf("[figure] stream %-5s %-7s %5d B x %d stages, %2d warps x %2d blocks an SM: %.0f GB/s "
                  "(%.1f%% of %.0f GB/s)\n",
                  b.method == kAsync ? "async" : "bulk", order == cuda::StreamProbe::kFront ? "front" : "streams",
                  b.bytes, b.stages, b.threads / 32, b.blocks_per_sm, gbps, 100 * gbps / kCopyGbps, kCopyGbps);
    }
  for (auto [unroll, threads, blocks] : std::vector<std::array<int, 3>>{{4, 256, 4}, {8, 256, 3}, {8, 512, 2}}) {
    const cuda::StreamProbe p{
        .method = cuda::StreamProbe::kLoads, .unroll = unroll, .threads = threads, .blocks_per_sm = blocks};
    const double gbps = cuda::stream_probe_gbps(p);
    EXPECT_GT(gbps, 0);
    std::printf("[figure] stream loads %d x 16 B in flight, %2d warps x %d blocks an SM: %.0f GB/s "
                "(%.1f%% of %.0f GB/s)\n",
                unroll, threads / 32, blocks, gbps, 100 * gbps / kCopyGbps, kCopyGbps);
  }
}

// Whether the rings' alignment moves the stream rate, as figures: the bulk probe at the split
// launches' geometry (8 warps x 3 blocks an SM, two stages of one unit at 2-8 tokens and of two at
// one token) and the one-token narrow blocks' (9 warps x 2), each ring at 0, 16, 32 and 64 bytes
// past a 128-byte boundary. (The TMA GEMV's split launches had theirs at 16 past a 32-byte one.)
TEST_F(CudaLinearQuantTest, StreamingRingAlignment) {
  struct Bulk {
    int bytes, stages, threads, blocks_per_sm;
  };
  for (Bulk b : std::vector<Bulk>{{2176, 2, 256, 3}, {4352, 2, 256, 3}, {2176, 2, 288, 2}})
    for (int offset : {0, 16, 32, 64}) {
      const cuda::StreamProbe p{.bytes = b.bytes, .stages = b.stages, .threads = b.threads,
                                .blocks_per_sm = b.blocks_per_sm, .ring_offset = offset};
      const double gbps = cuda::stream_probe_gbps(p);
      EXPECT_GT(gbps, 0);
      std::printf("[figure] stream bulk %5d B x %d stages, %2d warps x %d blocks an SM, rings %2d B past 128: "
                  "%.0f GB/s (%.1f%% of %.0f GB/s)\n",
                  b.bytes, b.stages, b.threads / 32, b.blocks_per_sm, offset, gbps, 100 * gbps / kCopyGbps,
                  kCopyGbps);
    }
}

// What part of the GPU can read, as figures: the same probes on fewer SMs, a block an SM (the
// rings take more than half an SM's shared memory; the loads' blocks of 32 warps go to idle SMs
// first, as the block scheduler places them). A step's kernels between two linears (the GDN
// kernel, attention) hold SMs whose share of the stream the others must then carry.
TEST_F(CudaLinearQuantTest, StreamingBySmCount) {
  using SP = cuda::StreamProbe;
  struct Probe {
    SP::Method method;
    int bytes, stages, threads;
    SP::Order order = SP::kStreams;
  };
  for (Probe pr : std::vector<Probe>{{SP::kBulk, 4352, 2, 768},
                                     {SP::kBulk, 4352, 2, 768, SP::kFront},
                                     {SP::kAsync, 4352, 2, 768},
                                     {SP::kBulk, 2176, 3, 576},
                                     {SP::kAsync, 2176, 3, 576},
                                     {SP::kBulk, 2176, 2, 576},
                                     {SP::kAsync, 2176, 2, 576},
                                     {SP::kLoads, 0, 0, 1024}})
    for (int sms : {132, 110, 84, 66, 44}) {
      const cuda::StreamProbe p{.method = pr.method, .order = pr.order, .bytes = pr.bytes, .stages = pr.stages,
                                .threads = pr.threads, .blocks_per_sm = 1, .megabytes = 256, .sms = sms};
      const double gbps = cuda::stream_probe_gbps(p);
      EXPECT_GT(gbps, 0);
      if (pr.method != SP::kLoads)
        std::printf("[figure] stream %-5s %-7s %5d B x %d stages, %2d warps, %3d SMs: %.0f GB/s (%.1f GB/s an SM)\n",
                    pr.method == SP::kAsync ? "async" : "bulk", pr.order == SP::kFront ? "front" : "streams",
                    pr.bytes, pr.stages, pr.threads / 32, sms, gbps, gbps / sms);
      else
        std::printf("[figure] stream loads 8 x 16 B in flight, %2d warps, %3d SMs: %.0f GB/s (%.1f GB/s an SM)\n",
                    pr.threads / 32, sms, gbps, gbps / sms);
    }
}

// The rings' ceiling with no DRAM, as figures: the bulk probe at the one-token GEMVs' geometries
// (gate_up's K-slice blocks, 20 warps of 2 x 2,176 bytes an SM; the split launches', 8 warps x 3
// blocks of 2 x 4,352; the narrow blocks', 9 warps x 2 of 2 x 2,176) and deeper rings, reading
// 1 GB from the whole buffer (DRAM) or from its first 8 or 24 MB (L2). Each warp's pieces one
// stream (warps whose streams start a window apart read the same lines at once, as the GEMVs'
// window has them do) or one front (at a time the warps read distinct pieces). The GEMVs'
// figures with DS_W4A16_L2_WEIGHTS (weights from an L2 window) are bounded by these, not by the
// copy rate.
TEST_F(CudaLinearQuantTest, StreamingFromL2) {
  struct Bulk {
    int bytes, stages, threads, blocks_per_sm;
  };
  for (Bulk b : std::vector<Bulk>{{2176, 2, 640, 1}, {2176, 3, 640, 1}, {2176, 4, 640, 1}, {2176, 2, 1024, 1},
                                  {4352, 2, 256, 3}, {2176, 2, 288, 2}})
    for (auto order : {cuda::StreamProbe::kStreams, cuda::StreamProbe::kFront})
      for (int window : {0, 8, 24}) {
        const cuda::StreamProbe p{.order = order, .bytes = b.bytes, .stages = b.stages, .threads = b.threads,
                                  .blocks_per_sm = b.blocks_per_sm, .megabytes = 1024, .window_mb = window};
        const double gbps = cuda::stream_probe_gbps(p);
        EXPECT_GT(gbps, 0);
        const std::string from = window ? "L2, " + std::to_string(window) + " MB" : "DRAM";
        std::printf("[figure] stream bulk %-7s %5d B x %d stages, %2d warps x %d blocks an SM, from %s: %.0f GB/s "
                    "(%.1f%% of %.0f GB/s)\n",
                    order == cuda::StreamProbe::kFront ? "front" : "streams", b.bytes, b.stages, b.threads / 32,
                    b.blocks_per_sm, from.c_str(), gbps, 100 * gbps / kCopyGbps, kCopyGbps);
      }
}

// The ceiling of a decode step's weight stream without launch boundaries, as figures: the 27B's
// W4A16 linears of a step in layer order (GDN layers: in_proj_qkvz, out_proj; every fourth layer
// attention: qkv, o_proj; each then gate_up, down), then the int8 lm_head, read by one persistent
// launch whose rings run ahead from one linear into the next but whose warps read a linear only
// once every warp is done with the one before (step_stream_probe_ms). With a gap, the last block
// done with a linear waits that long before the next may be read (the small ops between them).
TEST_F(CudaLinearQuantTest, DecodeStepStreamCeiling) {
  auto w4a16 = [](int64_t N, int64_t K) { return N * K / 2 + N * (K / 128) * 4; };  // nibbles and f32 scales
  std::vector<int64_t> phases;
  for (int layer = 0; layer < 64; ++layer) {
    const bool attention = layer % 4 == 3;
    phases.push_back(attention ? w4a16(14336, 5120) : w4a16(16384, 5120));
    phases.push_back(w4a16(5120, 6144));
    phases.push_back(w4a16(34816, 5120));
    phases.push_back(w4a16(5120, 17408));
  }
  phases.push_back(int64_t(248320) * 5120 + int64_t(248320) * (5120 / 128) * 4);
  double total = 0;
  for (int64_t b : phases) total += double(b);
  struct Ring {
    int bytes, stages, threads, blocks_per_sm, gap_ns, grab;
  };
  for (Ring r : std::vector<Ring>{{2176, 6, 512, 1, 0, 0},
                                  {2176, 6, 512, 1, 1000, 0},
                                  {2176, 6, 512, 1, 3000, 0},
                                  {2176, 12, 256, 1, 0, 0},
                                  {2176, 3, 512, 1, 0, 0},
                                  {2176, 6, 512, 1, 0, 4},
                                  {2176, 6, 512, 1, 0, 16}}) {
    cuda::StepStreamProbe p;
    p.phase_bytes = phases;
    p.bytes = r.bytes;
    p.stages = r.stages;
    p.threads = r.threads;
    p.blocks_per_sm = r.blocks_per_sm;
    p.gap_ns = r.gap_ns;
    p.grab = r.grab;
    const double ms = cuda::step_stream_probe_ms(p);
    EXPECT_GT(ms, 0);
    const double roof_ms = total / (kCopyGbps * 1e9) * 1e3;
    std::printf("[figure] step stream, one launch: %zu linears %.2f GB, %5d B x %2d stages, %2d warps x %d blocks an "
                "SM, gap %4d ns, %s %2d: %.3f ms (%.1f%% of %.3f ms at %.0f GB/s)\n",
                phases.size(), total / 1e9, r.bytes, r.stages, r.threads / 32, r.blocks_per_sm, r.gap_ns,
                r.grab ? "claims of" : "equal shares", r.grab, ms,
                100 * roof_ms / ms, roof_ms, kCopyGbps);
    std::fflush(stdout);
  }
}

// Time per call and weight bytes streamed per second, cycling through enough copies of each
// weight that it never sits in the 50 MB L2.
TEST_F(CudaLinearQuantTest, TimingAt27BShapes) {
  struct Linear {
    const char* name;
    int N, K;
    int per_step;  // calls per decode step (48 GDN layers, 16 attention layers)
    int layout;    // 1: separate linears only, 2: fused linears only (Ops::linear_parts), 3: both
  };
  const std::vector<Linear> linears = {
      {"gdn in_proj_qkv", 10240, 5120, 48, 1},  {"gdn in_proj_z", 6144, 5120, 48, 1},
      {"gdn in_proj_qkvz", 16384, 5120, 48, 2}, {"gdn out_proj", 5120, 6144, 48, 3},
      {"attn q_proj", 12288, 5120, 16, 1},      {"attn k/v_proj", 1024, 5120, 32, 1},
      {"attn qkv", 14336, 5120, 16, 2},         {"attn o_proj", 5120, 6144, 16, 3},
      {"mlp gate/up", 17408, 5120, 128, 1},     {"mlp gate_up", 34816, 5120, 64, 2},
      {"mlp down", 5120, 17408, 64, 3}};
  struct Config {
    bool pdl, tma, x_smem;
    const char* name;
    bool l2_weights = false;  // the weights from an L2 window (cuda::w4a16_l2_weights; results wrong)
  };
  const std::vector<Config> loops = {{false, false, true, "regs plain"},
                                     {true, false, true, "regs pdl"},
                                     {false, true, true, "tma plain"},
                                     {true, true, true, "tma pdl"},
                                     {true, true, false, "tma pdl, x not in smem"},
                                     {true, true, true, "tma pdl, weights from L2", true}};
  const int reps = 50;
  // step_us[config][fused][T == 8]
  std::vector<std::array<std::array<double, 2>, 2>> step_us(loops.size());
  double step_bytes[2] = {0, 0};
  {
    const GemvSettingsRestored restore;  // the settings the W4A16 timings switch
    for (const Linear& l : linears) {
      const double bytes = double(l.N) * l.K / 2 + double((l.N + 15) / 16 * 16) * (l.K / 128) * 4;
      const int copies = std::max(2, static_cast<int>(std::ceil(256e6 / bytes)));
      std::vector<LinearWeight> ws(copies);
      for (int i = 0; i < copies; ++i) {
        ws[i].packed = gpu->alloc(DType::kI32, {l.N, l.K / 8});
        gpu->fill_random(ws[i].packed, 0.f, 0.f, 100 + i);
        ws[i].scales = gpu->alloc(DType::kF32, {l.N, l.K / 128});
        gpu->fill_random(ws[i].scales, 0.f, 0.01f, 200 + i);
        ws[i].group_size = 128;
        gpu->prepare_weight(ws[i], WeightRole::kLinear);
      }
      for (int f = 0; f < 2; ++f)
        if (l.layout & (1 << f)) step_bytes[f] += bytes * l.per_step;
      for (size_t li = 0; li < loops.size(); ++li) {
        cuda::set_pdl_enabled(loops[li].pdl);
        cuda::set_w4a16_gemv_tma(loops[li].tma);
        cuda::set_w4a16_gemv_x_smem(loops[li].x_smem);
        cuda::set_w4a16_l2_weights(loops[li].l2_weights);
        for (int T : {1, 8, 16, 17, 64, 512}) {
          // Longer steps: one shape, PDL on.
          if (T > 16 && ((li != 1 && li != 3) || std::string(l.name) != "mlp gate/up")) continue;
          if ((!loops[li].x_smem || loops[li].l2_weights) && T > 8) continue;  // settings for one token tile
          Tensor x = gpu->alloc(DType::kBF16, {T, l.K});
          gpu->fill_random(x, 0.f, 1.f, 300);
          Tensor out = gpu->alloc(DType::kBF16, {T, l.N});
          const double us = time_us(reps, [&](int i) { gpu->linear_quantized(x, ws[i % copies], out); });
          const double gbps = bytes / us * 1e-3;
          std::printf("[figure] w4a16 %s N=%d K=%d T=%d (%s): %.2f us, %.0f GB/s (%.1f%% of %.0f GB/s)\n",
                      loops[li].name, l.N, l.K, T, l.name, us, gbps, 100 * gbps / kCopyGbps, kCopyGbps);
          for (int f = 0; f < 2; ++f)
            if ((l.layout & (1 << f)) && (T == 1 || T == 8)) step_us[li][f][T == 8] += us * l.per_step;
        }
      }
    }
  }
  for (size_t li = 0; li < loops.size(); ++li)
    for (int f = 0; f < 2; ++f)
      for (int i = 0; i < 2; ++i) {
        const double us = step_us[li][f][i];
        std::printf("[figure] w4a16 %s 27B decode-step linears, %s, at T=%d (sum over the 64 layers, no lm_head): "
                    "%.3f ms for %.2f GB, %.0f GB/s (%.1f%% of %.0f GB/s)\n",
                    loops[li].name, f ? "fused" : "separate", i == 0 ? 1 : 8, us * 1e-3, step_bytes[f] * 1e-9,
                    step_bytes[f] / us * 1e-3, 100 * step_bytes[f] / us * 1e-3 / kCopyGbps, kCopyGbps);
      }

  // int8 lm_head [248320, 5120], quantised on the GPU from random bf16.
  const int V = 248320, H = 5120;
  LinearWeight head;
  head.dense = gpu->alloc(DType::kBF16, {V, H});
  gpu->fill_random(head.dense, 0.f, 0.05f, 400);
  gpu->prepare_weight(head, WeightRole::kLmHead);
  ASSERT_EQ(head.format, WeightFormat::kInt8Tiled);
  const double bytes = double(V) * H + double(V) * (H / 128) * 4;
  const GemvSettingsRestored restore;  // PDL, switched below
  for (bool pdl : {false, true})
    for (int T : {1, 8, 64, 65}) {
      if (pdl && T > 8) continue;
      cuda::set_pdl_enabled(pdl);
      Tensor x = gpu->alloc(DType::kBF16, {T, H});
      gpu->fill_random(x, 0.f, 1.f, 500);
      Tensor out = gpu->alloc(DType::kBF16, {T, V});
      const double us = time_us(reps, [&](int) { gpu->linear_quantized(x, head, out); });
      const double gbps = bytes / us * 1e-3;
      std::printf("[figure] int8 lm_head%s N=%d K=%d T=%d: %.2f us, %.0f GB/s (%.1f%% of %.0f GB/s)\n",
                  pdl ? " pdl" : "", V, H, T, us, gbps, 100 * gbps / kCopyGbps, kCopyGbps);
    }
  std::vector<int32_t> ids(64);
  for (int i = 0; i < 64; ++i) ids[i] = (i * 104729) % V;
  gpu->begin_step(plan_of(ids));
  Tensor emb = gpu->alloc(DType::kBF16, {64, H});
  std::printf("[figure] int8 embedding gather T=64 H=%d: %.2f us\n", H,
              time_us(reps, [&](int) { gpu->embedding(head, emb); }));
}

}  // namespace
}  // namespace ds
