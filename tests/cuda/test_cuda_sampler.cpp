// The GPU sampler (CudaOps::sample) against the CPU Sampler: greedy argmax with ties and -inf,
// top-k / top-p / min-p draws inside the CPU's support, draw frequencies, seeded
// reproducibility, penalties and logit bias, logprobs; V = 248320 and 1000003, 1..64 rows.
// Prints [figure] lines: device sampling vs download + CPU sampling. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device.h"
#include "core/dtype.h"
#include "engine/sampler.h"

namespace ds {
namespace {

constexpr int kVocab = 248320;

// Random logits rounded to bf16 (the CUDA activation dtype), so host and device see the same values.
std::vector<float> random_logits(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(nd(rng)));
  return v;
}

// The CPU sampler's support, best first: its sorted candidates [0, keep) (mirrors sampler.cpp).
std::vector<int32_t> cpu_support(const float* w, int V, const SamplingParams& p) {
  std::vector<int32_t> c(V);
  for (int i = 0; i < V; ++i) c[i] = i;
  auto by_logit = [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
  size_t n = V;
  if (p.top_k > 0 && p.top_k < V) {
    n = p.top_k;
    std::nth_element(c.begin(), c.begin() + (n - 1), c.end(), by_logit);
    c.resize(n);
  }
  std::sort(c.begin(), c.end(), by_logit);
  const float inv_t = 1.0f / p.temperature;
  std::vector<double> pr(n);
  const double mx = double(w[c[0]]) * inv_t;
  double z = 0;
  for (size_t i = 0; i < n; ++i) z += (pr[i] = std::exp(double(w[c[i]]) * inv_t - mx));
  for (double& x : pr) x /= z;
  size_t keep = n;
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < n; ++i)
      if ((cum += pr[i]) >= p.top_p) {
        keep = i + 1;
        break;
      }
  }
  if (p.min_p > 0.0f) {
    size_t k = 1;
    while (k < keep && pr[k] >= p.min_p * pr[0]) ++k;
    keep = k;
  }
  c.resize(keep);
  return c;
}

class CudaSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
    CudaOpsOptions o;
    o.scratch_bytes = size_t(1) << 30;
    gpu = std::make_unique<CudaOps>(o);
  }
  // logits: f32 [rows, V] (bf16 values) -> bf16 device tensor.
  Tensor upload(const std::vector<float>& logits, int rows, int V) {
    return gpu->upload(logits.data(), DType::kF32, {rows, V}, DType::kBF16);
  }
  std::vector<SampledToken> sample(Tensor logits, const std::vector<SampleRowSpec>& specs) {
    std::vector<SampledToken> out(specs.size());
    gpu->reset_scratch();
    gpu->sample(logits, specs, out.data());
    return out;
  }
  static SampleRowSpec spec_of(const SamplingParams& p, int row, uint64_t seed, uint64_t draw) {
    Sampler s(p, seed);
    SampleRowSpec spec = *s.device_spec({}, {});
    spec.row = row;
    spec.draw = draw;
    return spec;
  }

  std::unique_ptr<CudaOps> gpu;
  std::mt19937 rng{1234};
};

TEST_F(CudaSamplerTest, GreedyIsTheCpuArgmaxWithTiesAndInfinities) {
  for (int V : {kVocab, 1000003, 7}) {
    const int rows = V > 1000000 ? 8 : 64;
    std::vector<float> x = random_logits(size_t(rows) * V, rng, 2.0f);
    for (int r = 0; r < rows; ++r) {
      float* w = x.data() + size_t(r) * V;
      switch (r % 5) {
        case 1:  // ties at the maximum: the first index wins
          w[V - 1] = w[V / 2] = w[V / 3] = 60.0f;
          break;
        case 2:  // every logit -inf: no token (-1), as the CPU sampler
          std::fill(w, w + V, -INFINITY);
          break;
        case 3:  // mostly -inf, the maximum near the end
          for (int i = 0; i < V - 3; ++i) w[i] = -INFINITY;
          w[V - 2] = 1.0f;
          break;
        case 4:  // the maximum at index 0 and -inf elsewhere around it
          w[0] = 70.0f;
          w[1] = -INFINITY;
          break;
      }
    }
    Tensor t = upload(x, rows, V);
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    std::vector<SampleRowSpec> specs;
    for (int r = 0; r < rows; ++r) specs.push_back(spec_of(greedy, r, 1, 0));
    const auto got = sample(t, specs);
    for (int r = 0; r < rows; ++r) {
      Sampler cpu(greedy, 1);
      const auto want = cpu.sample(std::span<const float>(x).subspan(size_t(r) * V, V), {}, {});
      EXPECT_EQ(got[r].token, want.token) << "V " << V << " row " << r;
    }
  }
}

struct Truncation {
  const char* name;
  float temperature, top_p, min_p;
  int top_k;
};

TEST_F(CudaSamplerTest, DrawsStayInTheCpuSupport) {
  const Truncation cases[] = {
      {"top_k=20 top_p=0.95", 1.0f, 0.95f, 0.0f, 20},  // model-default sampling
      {"top_k=1", 1.0f, 1.0f, 0.0f, 1},
      {"top_k=50 top_p=0.8", 0.7f, 0.8f, 0.0f, 50},
      {"top_k=2048", 1.0f, 1.0f, 0.0f, 2048},
      {"top_p=0.9", 1.0f, 0.9f, 0.0f, 0},               // large support, no top-k
      {"min_p=0.05", 1.0f, 1.0f, 0.05f, 0},
      {"top_k=5000 top_p=0.95 min_p=0.01", 1.3f, 0.95f, 0.01f, 5000},
      {"temperature=0.5 only", 0.5f, 1.0f, 0.0f, 0},
  };
  for (int V : {kVocab, 1000003}) {
    const int rows = V > 1000000 ? 4 : 64;
    // a peaked and a flat half, so supports range from a few tokens to thousands
    std::vector<float> x(size_t(rows) * V);
    for (int r = 0; r < rows; ++r) {
      auto row = random_logits(V, rng, r % 2 ? 4.0f : 1.0f);
      std::copy(row.begin(), row.end(), x.begin() + size_t(r) * V);
    }
    Tensor t = upload(x, rows, V);
    for (const Truncation& c : cases) {
      SamplingParams p;
      p.temperature = c.temperature;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.top_k = c.top_k;
      std::vector<std::vector<int32_t>> support(rows);
      for (int r = 0; r < rows; ++r) support[r] = cpu_support(x.data() + size_t(r) * V, V, p);
      const int rounds = V > 1000000 ? 8 : 4;
      int n_outside = 0, n_boundary = 0;
      std::set<int32_t> distinct;
      for (int round = 0; round < rounds; ++round) {
        std::vector<SampleRowSpec> specs;
        for (int r = 0; r < rows; ++r) specs.push_back(spec_of(p, r, 1000 + round * 77 + r, round));
        const auto got = sample(t, specs);
        for (int r = 0; r < rows; ++r) {
          const auto& s = support[r];
          const int32_t tok = got[r].token;
          distinct.insert(tok);
          if (c.top_k == 1) {
            EXPECT_EQ(tok, s[0]) << c.name;
          }
          if (std::find(s.begin(), s.end(), tok) != s.end()) continue;
          // top-p sums in another order than the CPU: the next token may enter at an exact boundary
          const float* w = x.data() + size_t(r) * V;
          const bool next = c.top_p < 1.0f && w[tok] <= w[s.back()] &&
                            std::count_if(w, w + V, [&](float v) { return v > w[tok]; }) <= long(s.size());
          (next ? n_boundary : n_outside)++;
        }
      }
      EXPECT_EQ(n_outside, 0) << c.name << " V " << V;
      EXPECT_LE(n_boundary, 1) << c.name << " V " << V;
      if (c.top_k != 1) {
        EXPECT_GT(distinct.size(), 1u) << c.name << ": draws never vary";
      }
    }
  }
}

TEST_F(CudaSamplerTest, DrawFrequenciesFollowTheCpuProbabilities) {
  struct Case {
    int V;  // <= 2048: the sorted-candidate path; larger without top-k: the index-order draw
    Truncation t;
  };
  for (const Case& c : {Case{1001, {"top_k=10", 1.0f, 1.0f, 0.0f, 10}},
                        Case{4099, {"top_p=0.5 T=0.8", 0.8f, 0.5f, 0.0f, 0}},
                        Case{4099, {"min_p=0.2", 1.0f, 1.0f, 0.2f, 0}}}) {
    const int V = c.V;
    std::vector<float> x = random_logits(V, rng, 1.5f);
    Tensor t = upload(x, 1, V);
    SamplingParams p;
    p.temperature = c.t.temperature;
    p.top_p = c.t.top_p;
    p.min_p = c.t.min_p;
    p.top_k = c.t.top_k;
    const auto s = cpu_support(x.data(), V, p);
    std::vector<double> want(V, 0.0);
    double z = 0;
    for (int32_t i : s) z += (want[i] = std::exp(double(x[i]) / p.temperature));
    const int n = 8192;
    std::vector<SampleRowSpec> specs;
    for (int d = 0; d < n; ++d) specs.push_back(spec_of(p, 0, 42, d));  // one row, many draws
    std::vector<double> freq(V, 0.0);
    for (const auto& g : sample(t, specs)) freq[g.token] += 1.0 / n;
    double worst = 0;
    for (int i = 0; i < V; ++i) worst = std::max(worst, std::abs(freq[i] - want[i] / z));
    EXPECT_LT(worst, 0.025) << c.t.name << " V " << V << " support " << s.size();
  }
}

TEST_F(CudaSamplerTest, SameSeedSameTokensAcrossBatches) {
  const int rows = 16;
  std::vector<float> x = random_logits(size_t(rows) * kVocab, rng, 1.0f);
  Tensor t = upload(x, rows, kVocab);
  SamplingParams p;
  p.top_p = 0.9f;
  std::vector<SampleRowSpec> all, last;
  for (int r = 0; r < rows; ++r) all.push_back(spec_of(p, r, 7, 3));
  last.push_back(all.back());
  const auto a = sample(t, all), b = sample(t, all), c = sample(t, last);
  for (int r = 0; r < rows; ++r) EXPECT_EQ(a[r].token, b[r].token);
  EXPECT_EQ(c[0].token, a[rows - 1].token);  // a row's draw does not depend on its neighbours
}

TEST_F(CudaSamplerTest, PenaltiesAndBiasMatchTheCpuGreedy) {
  const int rows = 6, V = kVocab;
  std::vector<float> x = random_logits(size_t(rows) * V, rng, 2.0f);
  std::vector<int32_t> prompt, generated;
  for (int i = 0; i < 40; ++i) prompt.push_back(int32_t(rng() % V));
  for (int i = 0; i < 30; ++i) generated.push_back(int32_t(rng() % 50));  // repeats
  // make a penalised token the argmax of every row, so penalties decide the winner
  for (int r = 0; r < rows; ++r) x[size_t(r) * V + generated[0]] = 30.0f;
  Tensor t = upload(x, rows, V);
  std::vector<SamplingParams> ps(rows);
  for (auto& p : ps) p.temperature = 0.0f;
  ps[0].presence_penalty = 40.0f;
  ps[1].frequency_penalty = 5.0f;
  ps[2].repetition_penalty = 20.0f;
  ps[3].logit_bias = {{12345, 100.0f}, {V - 1, -5.0f}};
  ps[4].repetition_penalty = 1.3f;
  ps[4].presence_penalty = 0.5f;
  ps[4].frequency_penalty = 0.25f;
  ps[4].logit_bias = {{generated[0], -28.0f}};
  ps[5].logit_bias = {{-3, 9.0f}, {V + 4, 9.0f}};  // out of range: ignored on both sides
  std::vector<SampleRowSpec> specs;
  for (int r = 0; r < rows; ++r) {
    Sampler s(ps[r], 1);
    specs.push_back(*s.device_spec(prompt, generated));
    specs.back().row = r;
  }
  const auto got = sample(t, specs);
  for (int r = 0; r < rows; ++r) {
    Sampler cpu(ps[r], 1);
    const auto want = cpu.sample(std::span<const float>(x).subspan(size_t(r) * V, V), prompt, generated);
    EXPECT_EQ(got[r].token, want.token) << "row " << r;
  }
}

TEST_F(CudaSamplerTest, LogprobsMatchTheCpu) {
  for (int V : {kVocab, 1000003}) {
    const int rows = 3;
    std::vector<float> x = random_logits(size_t(rows) * V, rng, 3.0f);
    for (int i = 0; i < 5; ++i) x[size_t(V) + 100 + i] = 25.0f;  // row 1: tied top logprobs
    Tensor t = upload(x, rows, V);
    for (int n : {0, 5, 20}) {
      SamplingParams p;
      p.temperature = 0.0f;
      p.n_logprobs = n;
      std::vector<SampleRowSpec> specs;
      for (int r = 0; r < rows; ++r) specs.push_back(spec_of(p, r, 5, 0));
      const auto got = sample(t, specs);
      for (int r = 0; r < rows; ++r) {
        Sampler cpu(p, 5);
        const auto want = cpu.sample(std::span<const float>(x).subspan(size_t(r) * V, V), {}, {});
        ASSERT_EQ(got[r].token, want.token);
        EXPECT_NEAR(got[r].logprob, want.logprob, 1e-3);
        ASSERT_EQ(got[r].n_top, int(want.top.size()));
        for (int j = 0; j < got[r].n_top; ++j) {
          EXPECT_EQ(got[r].top_ids[j], want.top[j].token) << "V " << V << " row " << r << " rank " << j;
          EXPECT_NEAR(got[r].top_logprobs[j], want.top[j].logprob, 1e-3);
        }
      }
    }
  }
}

TEST_F(CudaSamplerTest, TimingAgainstDownloadAndCpu) {
  const int V = kVocab;
  std::vector<float> x = random_logits(size_t(64) * V, rng, 3.0f);
  Tensor t = upload(x, 64, V);
  const Truncation cases[] = {{"greedy", 0.0f, 1.0f, 0.0f, 0},
                              {"top_k=20 top_p=0.95", 1.0f, 0.95f, 0.0f, 20},
                              {"top_p=0.95", 1.0f, 0.95f, 0.0f, 0}};
  using Clock = std::chrono::steady_clock;
  for (int rows : {1, 64}) {
    for (const Truncation& c : cases) {
      SamplingParams p;
      p.temperature = c.temperature;
      p.top_p = c.top_p;
      p.top_k = c.top_k;
      std::vector<SampleRowSpec> specs;
      for (int r = 0; r < rows; ++r) specs.push_back(spec_of(p, r, 9, 0));
      sample(t, specs);  // warm-up
      const int iters = 20;
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) sample(t, specs);
      const double gpu_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / iters;
      // the host path: download [rows, V] and sample every row on the CPU
      std::vector<float> host(size_t(rows) * V);
      const int cpu_iters = 3;
      t0 = Clock::now();
      for (int i = 0; i < cpu_iters; ++i) {
        gpu->download_f32(t.rows(0, rows), host.data());
        for (int r = 0; r < rows; ++r) {
          Sampler s(p, 9);
          s.sample(std::span<const float>(host).subspan(size_t(r) * V, V), {}, {});
        }
      }
      const double cpu_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / cpu_iters;
      std::printf("[figure] gpu_sampler rows=%d V=%d %s: %.3f ms (download + CPU sampler: %.3f ms)\n", rows, V, c.name,
                  gpu_ms, cpu_ms);
    }
  }
}

}  // namespace
}  // namespace ds
