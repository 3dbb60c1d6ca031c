// The chunked tensor-core gated delta rule (launch_gdn_chunked) against the fp32 token-by-token
// CPU reference: partial chunks (T = 1, 63, 64, 65, 500, 4100), several sequences per step,
// continuation from random non-zero states in all three state dtypes, Hv > Hk, head dims that
// are not multiples of 8 (the element-copy path) or of the 32-column tile, and the 27B shape;
// the CudaOps dispatch (chunked prefill, recurrent decode, chunked again) against CpuOps; and
// timings against the recurrent kernel. Skipped where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/gdn_ref.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "cuda/cuda_test_util.h"
#include "backend/cuda/device.h"
#include "backend/cuda/launchers.h"
#include "core/dtype.h"

namespace ds {
namespace {

using cuda_test::rel_rms;

// Device buffer of n elements.
template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& host) {
    CUDA_CHECK(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n);
    CUDA_CHECK(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
};

// One step of the rule: sequences of `lens` new tokens; past[s] > 0 continues from a random
// state in slot n_seqs - s (slot 0 is never used and must come back unchanged).
struct Problem {
  int Hk, Hv, dk, dv;
  int state_dtype;  // 0 f32, 1 f16, 2 bf16
  std::vector<int> lens, past;
  int n_seqs() const { return static_cast<int>(lens.size()); }
  int n_slots() const { return n_seqs() + 1; }
  int width() const { return 2 * Hk * dk + Hv * dv; }
  int tokens() const {
    int t = 0;
    for (int n : lens) t += n;
    return t;
  }
  int max_len() const { return *std::max_element(lens.begin(), lens.end()); }
  int64_t state_elems() const { return int64_t(n_slots()) * Hv * dk * dv; }
  std::string name() const {
    std::string s = "Hk" + std::to_string(Hk) + "_Hv" + std::to_string(Hv) + "_dk" + std::to_string(dk) + "_dv" +
                    std::to_string(dv) + "_sd" + std::to_string(state_dtype) + "_lens";
    for (size_t i = 0; i < lens.size(); ++i) s += "_" + std::to_string(lens[i]) + "p" + std::to_string(past[i]);
    return s;
  }
};

uint16_t to_storage16(float x, int dtype) { return dtype == 1 ? f32_to_f16(x) : f32_to_bf16(x); }
float from_storage16(uint16_t x, int dtype) { return dtype == 1 ? f16_to_f32(x) : bf16_to_f32(x); }

// Inputs as the GPU sees them (bf16 activations, the pool in its dtype), kept as fp32.
struct Inputs {
  std::vector<float> qkv, g, beta;  // [T, C], [T, Hv], [T, Hv]
  std::vector<float> state;         // [n_slots, Hv, dk, dv]; NaN in the slots of fresh sequences
  std::vector<int32_t> cu, past, slots;
};

Inputs make_inputs(const Problem& p, std::mt19937& rng) {
  Inputs in;
  const int T = p.tokens();
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  in.qkv.resize(size_t(T) * p.width());
  for (auto& x : in.qkv) x = bf16_to_f32(f32_to_bf16(nd(rng)));
  in.g.resize(size_t(T) * p.Hv);
  in.beta.resize(in.g.size());
  for (size_t i = 0; i < in.g.size(); ++i) {
    in.g[i] = i % 17 == 5 ? -6.f : -0.7f * ud(rng);  // mostly mild decay, some near-resets
    in.beta[i] = 0.05f + 0.95f * ud(rng);
  }
  in.state.assign(p.state_elems(), 0.25f);
  const int64_t per_slot = int64_t(p.Hv) * p.dk * p.dv;
  in.cu = {0};
  for (int s = 0; s < p.n_seqs(); ++s) {
    in.cu.push_back(in.cu.back() + p.lens[s]);
    in.past.push_back(p.past[s]);
    const int slot = p.n_seqs() - s;
    in.slots.push_back(slot);
    float* S = &in.state[slot * per_slot];
    for (int64_t i = 0; i < per_slot; ++i)
      S[i] = p.past[s] > 0 ? 0.5f * nd(rng) : std::numeric_limits<float>::quiet_NaN();
  }
  if (p.state_dtype != 0)
    for (auto& x : in.state) x = from_storage16(to_storage16(x, p.state_dtype), p.state_dtype);
  return in;
}

// fp32 token-by-token reference: out [T, Hv, dv] and the pool after the step.
void reference(const Problem& p, const Inputs& in, std::vector<float>& out, std::vector<float>& state) {
  const int T = p.tokens(), C = p.width(), Hk = p.Hk, Hv = p.Hv, dk = p.dk, dv = p.dv;
  std::vector<float> qn(size_t(T) * Hk * dk), kn(qn.size());
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < Hk; ++h) {
      std::memcpy(&qn[(size_t(t) * Hk + h) * dk], &in.qkv[size_t(t) * C + h * dk], dk * sizeof(float));
      std::memcpy(&kn[(size_t(t) * Hk + h) * dk], &in.qkv[size_t(t) * C + (Hk + h) * dk], dk * sizeof(float));
      l2_normalize(&qn[(size_t(t) * Hk + h) * dk], dk, 1.0f / std::sqrt(float(dk)));
      l2_normalize(&kn[(size_t(t) * Hk + h) * dk], dk, 1.0f);
    }
  out.assign(size_t(T) * Hv * dv, 0.f);
  state = in.state;
  const int64_t head_elems = int64_t(dk) * dv;
  const int jobs = p.n_seqs() * Hv;
  std::atomic<int> next{0};
  auto worker = [&]() {
    for (int job = next++; job < jobs; job = next++) {
      const int s = job / Hv, h = job % Hv, kh = h / (Hv / Hk), t0 = in.cu[s];
      float* S = &state[(int64_t(in.slots[s]) * Hv + h) * head_elems];
      if (in.past[s] == 0) std::fill(S, S + head_elems, 0.f);
      GdnHeadInputs hi{&qn[(size_t(t0) * Hk + kh) * dk], &kn[(size_t(t0) * Hk + kh) * dk],
                       &in.qkv[size_t(t0) * C + 2 * Hk * dk + h * dv], &in.g[size_t(t0) * Hv + h],
                       &in.beta[size_t(t0) * Hv + h], int64_t(Hk) * dk, C, Hv, p.lens[s], dk, dv};
      gdn_head_recurrent(hi, S, &out[(size_t(t0) * Hv + h) * dv], int64_t(Hv) * dv);
    }
  };
  std::vector<std::thread> pool;
  const int n_threads = std::max(1, std::min<int>(jobs, std::thread::hardware_concurrency()));
  for (int i = 0; i < n_threads; ++i) pool.emplace_back(worker);
  for (auto& th : pool) th.join();
}

// The step's device inputs and outputs.
struct DeviceProblem {
  DeviceBuffer<uint16_t> qkv;
  DeviceBuffer<float> g, beta;
  DeviceBuffer<uint8_t> state;
  DeviceBuffer<uint16_t> out;
  DeviceBuffer<int32_t> cu, past, slots;
  DeviceBuffer<uint8_t> scratch;
  const Problem& p;

  DeviceProblem(const Problem& prob, const Inputs& in)
      : qkv(to_bf16(in.qkv)), g(in.g), beta(in.beta), state(state_bytes(prob, in.state)),
        out(size_t(prob.tokens()) * prob.Hv * prob.dv), cu(in.cu), past(in.past), slots(in.slots),
        scratch(cuda::gdn_chunked_scratch_bytes(prob.tokens(), prob.Hk, prob.Hv)), p(prob) {}

  static std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16(x[i]);
    return b;
  }
  static std::vector<uint8_t> state_bytes(const Problem& p, const std::vector<float>& x) {
    std::vector<uint8_t> bytes(x.size() * (p.state_dtype == 0 ? 4 : 2));
    if (p.state_dtype == 0) {
      std::memcpy(bytes.data(), x.data(), bytes.size());
    } else {
      for (size_t i = 0; i < x.size(); ++i) {
        const uint16_t v = to_storage16(x[i], p.state_dtype);
        std::memcpy(&bytes[2 * i], &v, 2);
      }
    }
    return bytes;
  }
  void reset_state(const Inputs& in) { state.upload(state_bytes(p, in.state)); }

  void run(bool chunked, cudaStream_t s = nullptr) {
    const auto* q = reinterpret_cast<const cuda::bf16*>(qkv.ptr);
    auto* o = reinterpret_cast<cuda::bf16*>(out.ptr);
    if (chunked)
      cuda::launch_gdn_chunked(q, g.ptr, beta.ptr, state.ptr, p.state_dtype, o, cu.ptr, past.ptr, slots.ptr,
                               p.n_seqs(), p.tokens(), p.max_len(), p.Hk, p.Hv, p.dk, p.dv, scratch.ptr, s);
    else
      cuda::launch_gdn_recurrent(q, cuda::GdnGates{g.ptr, beta.ptr}, state.ptr, p.state_dtype, o, cu.ptr, past.ptr,
                                 slots.ptr, p.n_seqs(), p.Hk, p.Hv, p.dk, p.dv, /*short_chunks=*/false, s);
  }
  std::vector<float> out_f32() const {
    std::vector<uint16_t> b = out.download();
    std::vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
    return f;
  }
  std::vector<float> state_f32() const {
    std::vector<uint8_t> bytes = state.download();
    std::vector<float> f(p.state_elems());
    for (size_t i = 0; i < f.size(); ++i) {
      if (p.state_dtype == 0) {
        std::memcpy(&f[i], &bytes[4 * i], 4);
      } else {
        uint16_t v;
        std::memcpy(&v, &bytes[2 * i], 2);
        f[i] = from_storage16(v, p.state_dtype);
      }
    }
    return f;
  }
};

class GdnChunkedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  }
  std::mt19937 rng{7};
};

// bf16 operands (q, k, v exact; S, T, V', P rounded) with fp32 accumulation: expect a few 1e-3
// relative RMS on out (bf16 output rounding alone is ~1e-3) and on the state.
TEST_F(GdnChunkedTest, MatchesRecurrentReference) {
  std::vector<Problem> problems;
  for (int sd : {0, 1, 2}) problems.push_back({2, 6, 16, 24, sd, {1, 63, 64, 65}, {0, 5, 0, 9}});
  problems.push_back({3, 3, 20, 20, 1, {130, 7}, {0, 3}});          // dims off 8: element copies
  problems.push_back({2, 6, 32, 64, 1, {500}, {0}});                // tiny_w4a16 dims
  problems.push_back({2, 6, 32, 64, 2, {200, 300}, {40, 0}});
  problems.push_back({1, 3, 48, 80, 0, {129}, {11}});               // second column tile of 16
  problems.push_back({16, 48, 128, 128, 1, {1000, 37, 129}, {0, 64, 200}});
  problems.push_back({16, 48, 128, 128, 2, {1, 64}, {3, 0}});
  problems.push_back({16, 48, 128, 128, 0, {63}, {17}});
  problems.push_back({16, 48, 128, 128, 1, {4100}, {0}});
  for (const Problem& p : problems) {
    ASSERT_TRUE(cuda::gdn_chunked_supported(p.dk, p.dv));
    const Inputs in = make_inputs(p, rng);
    std::vector<float> ref_out, ref_state;
    reference(p, in, ref_out, ref_state);
    DeviceProblem dev(p, in);
    dev.run(/*chunked=*/true);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double e_out = rel_rms(dev.out_f32(), ref_out);
    const double e_state = rel_rms(dev.state_f32(), ref_state);
    std::printf("[figure] gdn_chunked rel_rms %s: out %.2e state %.2e\n", p.name().c_str(), e_out, e_state);
    RecordProperty(p.name() + "_out", std::to_string(e_out));
    RecordProperty(p.name() + "_state", std::to_string(e_state));
    EXPECT_LE(e_out, 1e-2) << p.name();
    EXPECT_LE(e_state, 1e-2) << p.name();
  }
}

// The same step through the recurrent kernel and the chunked one, timed with events.
TEST_F(GdnChunkedTest, TimingAgainstRecurrent) {
  for (int T : {16, 32, 64, 256, 1024, 4096}) {
    const Problem p{16, 48, 128, 128, 1, {T}, {0}};
    const Inputs in = make_inputs(p, rng);
    DeviceProblem dev(p, in);
    float ms[2] = {0.f, 0.f};
    for (int chunked = 0; chunked < 2; ++chunked) {
      const int reps = chunked || T <= 256 ? 10 : 3;
      dev.run(chunked == 1);  // warm-up
      cudaEvent_t e0, e1;
      CUDA_CHECK(cudaEventCreate(&e0));
      CUDA_CHECK(cudaEventCreate(&e1));
      CUDA_CHECK(cudaEventRecord(e0));
      for (int r = 0; r < reps; ++r) dev.run(chunked == 1);
      CUDA_CHECK(cudaEventRecord(e1));
      CUDA_CHECK(cudaEventSynchronize(e1));
      CUDA_CHECK(cudaEventElapsedTime(&ms[chunked], e0, e1));
      ms[chunked] /= reps;
      CUDA_CHECK(cudaEventDestroy(e0));
      CUDA_CHECK(cudaEventDestroy(e1));
    }
    std::printf("[figure] gdn_chunked T=%d Hk=16 Hv=48 dk=dv=128: %.3f ms (recurrent %.3f ms)\n", T, ms[1], ms[0]);
    // Fresh sequences: both kernels computed the same step; they must agree.
    const std::vector<float> chunked_out = dev.out_f32();
    dev.run(false);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LE(rel_rms(chunked_out, dev.out_f32()), 1e-2) << "T=" << T;
  }
}

// CudaOps::gated_delta_rule dispatch: chunked prefill, recurrent decode, chunked continuation
// (sequences with n_past > 0 and decode-sized ones in the same step), against CpuOps.
TEST_F(GdnChunkedTest, DispatchMatchesCpuOps) {
  const int Hk = 2, Hv = 6, dk = 32, dv = 64, C = 2 * Hk * dk + Hv * dv;
  for (StateDType sd : {StateDType::kF32, StateDType::kF16}) {
    CudaOpsOptions o;
    o.state_dtype = sd;
    CudaOps gpu(o);
    CpuOps cpu;
    CacheGeometry geo;
    geo.n_state_layers = 2, geo.n_slots = 3, geo.conv_rows = 3, geo.conv_dim = C, geo.n_v_heads = Hv,
    geo.k_head_dim = dk, geo.v_head_dim = dv, geo.n_kv_layers = 1, geo.n_blocks = 1, geo.n_kv_heads = 1,
    geo.head_dim = 1;
    cpu.alloc_caches(geo);
    gpu.alloc_caches(geo);
    std::vector<int> past = {0, 0, 0};
    for (const std::vector<int>& lens : std::vector<std::vector<int>>{{100, 1, 40}, {1, 1, 1}, {70, 2, 1}}) {
      StepPlan plan;
      plan.cu_seqlens = {0};
      for (int s = 0; s < 3; ++s) {
        for (int i = 0; i < lens[s]; ++i) {
          plan.token_ids.push_back(i % 50);
          plan.positions.push_back(past[s] + i);
          plan.logit_rows.push_back(plan.cu_seqlens.back() + i);
        }
        plan.cu_seqlens.push_back(plan.cu_seqlens.back() + lens[s]);
        plan.n_past.push_back(past[s]);
        plan.state_slots.push_back(2 - s);
        plan.block_tables.push_back(s);
      }
      plan.max_blocks = 1;
      cpu.begin_step(plan);
      gpu.begin_step(plan);
      const int T = plan.n_tokens();
      const Problem shape{Hk, Hv, dk, dv, 0, lens, past};
      const Inputs in = make_inputs(shape, rng);
      const GdnShape sh{Hk, Hv, dk, dv};
      Tensor cq = cpu.upload(in.qkv.data(), DType::kF32, {T, C}, DType::kF32);
      Tensor cg = cpu.upload(in.g.data(), DType::kF32, {T, Hv}, DType::kF32);
      Tensor cb = cpu.upload(in.beta.data(), DType::kF32, {T, Hv}, DType::kF32);
      Tensor gq = gpu.upload(in.qkv.data(), DType::kF32, {T, C}, DType::kBF16);
      Tensor gg = gpu.upload(in.g.data(), DType::kF32, {T, Hv}, DType::kF32);
      Tensor gb = gpu.upload(in.beta.data(), DType::kF32, {T, Hv}, DType::kF32);
      Tensor co = cpu.scratch(DType::kF32, {T, Hv, dv});
      Tensor go = gpu.scratch(DType::kBF16, {T, Hv, dv});
      cpu.gated_delta_rule(cq, cg, cb, sh, 1, co);
      gpu.gated_delta_rule(gq, gg, gb, sh, 1, go);
      std::vector<float> c(co.numel()), g(go.numel());
      cpu.download_f32(co, c.data());
      gpu.download_f32(go, g.data());
      const double err = rel_rms(g, c);
      const double tol = sd == StateDType::kF32 ? 1e-2 : 1.5e-2;
      std::printf("[figure] gdn_chunked dispatch state_dtype=%d lens=%d,%d,%d: rel_rms %.2e\n",
                  sd == StateDType::kF32 ? 0 : 1, lens[0], lens[1], lens[2], err);
      EXPECT_LE(err, tol) << "step " << lens[0] << "," << lens[1] << "," << lens[2];
      cpu.reset_scratch();
      gpu.reset_scratch();
      for (int s = 0; s < 3; ++s) past[s] += lens[s];
    }
  }
}

}  // namespace
}  // namespace ds
