// Every CudaOps op against its CpuOps twin on awkward shapes (T = 1, 63, 500; widths that
// are not powers of two; GQA; num_v_heads > num_k_heads; several sequences per step and a
// second step continuing from the caches). Skipped where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/clocks.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/launchers.h"
#include "cuda/cuda_test_util.h"
#include "backend/cuda/device.h"

namespace ds {
namespace {

using cuda_test::rel_rms;
using cuda_test::random_bf16;
using cuda_test::nan_half_copy;
using cuda_test::sixteenth_misses;

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
    CudaOpsOptions o;
    o.state_dtype = StateDType::kF32;
    gpu = std::make_unique<CudaOps>(o);
  }
  // The same host data as a CPU tensor (F32) and a GPU tensor (BF16 unless want_f32).
  std::pair<Tensor, Tensor> both(const std::vector<float>& h, std::initializer_list<int64_t> shape, bool want_f32 = false) {
    return {cpu.upload(h.data(), DType::kF32, shape, DType::kF32),
            gpu->upload(h.data(), DType::kF32, shape, want_f32 ? DType::kF32 : DType::kBF16)};
  }
  std::pair<Tensor, Tensor> outputs(std::initializer_list<int64_t> shape, bool f32 = false) {
    return {cpu.scratch(DType::kF32, shape), gpu->scratch(f32 ? DType::kF32 : DType::kBF16, shape)};
  }
  void expect_close(const std::pair<Tensor, Tensor>& t, double tol, const std::string& what) {
    std::vector<float> c(t.first.numel()), g(t.second.numel());
    cpu.download_f32(t.first, c.data());
    gpu->download_f32(t.second, g.data());
    const double err = rel_rms(g, c);
    RecordProperty(what, std::to_string(err));
    EXPECT_LE(err, tol) << what;
  }
  void begin(const StepPlan& p) {
    cpu.begin_step(p);
    gpu->begin_step(p);
  }

  CpuOps cpu;
  std::unique_ptr<CudaOps> gpu;
  std::mt19937 rng{42};
};

// A plan of sequences with the given new-token counts, n_past and one block table each.
StepPlan make_plan(const std::vector<int>& lens, const std::vector<int>& past, int block_size, int max_blocks) {
  StepPlan p;
  p.cu_seqlens = {0};
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int i = 0; i < lens[s]; ++i) {
      p.token_ids.push_back((i * 7 + 3) % 50);
      p.positions.push_back(past[s] + i);
      p.logit_rows.push_back(p.cu_seqlens.back() + i);
    }
    p.cu_seqlens.push_back(p.cu_seqlens.back() + lens[s]);
    p.n_past.push_back(past[s]);
    p.state_slots.push_back(static_cast<int>(s));
    for (int b = 0; b < max_blocks; ++b) p.block_tables.push_back(static_cast<int>(s) * max_blocks + b);
  }
  p.max_blocks = max_blocks;
  (void)block_size;
  return p;
}

// Weights upload from f32, bf16 and fp16 host data as bf16 or f32, converted a piece of 4 M values
// at a time: a tensor of more than two pieces, ending on a short one, arrives whole and rounded
// once (bf16 and fp16 values of the host data exactly).
TEST_F(CudaOpsTest, UploadConvertsEveryPiece) {
  const int64_t n = (int64_t(1) << 23) + 1001;
  std::vector<float> h = random_bf16(n, rng);
  std::vector<uint16_t> hb(n), hh(n);
  for (int64_t i = 0; i < n; ++i) {
    hb[i] = f32_to_bf16(h[i]);
    hh[i] = f32_to_f16(h[i]);
  }
  auto download = [&](Tensor t) {
    std::vector<float> v(n);
    gpu->download_f32(t, v.data());
    return v;
  };
  EXPECT_EQ(download(gpu->upload(h.data(), DType::kF32, {n}, DType::kBF16)), h);
  EXPECT_EQ(download(gpu->upload(h.data(), DType::kF32, {n}, DType::kF32)), h);
  EXPECT_EQ(download(gpu->upload(hb.data(), DType::kBF16, {n}, DType::kBF16)), h);
  std::vector<float> from_f16(n);
  for (int64_t i = 0; i < n; ++i) from_f16[i] = bf16_to_f32(f32_to_bf16(f16_to_f32(hh[i])));
  EXPECT_EQ(download(gpu->upload(hh.data(), DType::kF16, {n}, DType::kBF16)), from_f16);
}

TEST_F(CudaOpsTest, NormsAndElementwise) {
  for (auto [R, D] : std::vector<std::pair<int, int>>{{1, 64}, {63, 200}, {500, 96}, {3, 5120}, {2, 44}}) {
    auto x = both(random_bf16(R * D, rng), {R, D});
    auto w = both(random_bf16(D, rng, 0.5f), {D}, true);
    auto out = outputs({R, D});
    cpu.rms_norm(x.first, w.first, 1e-6f, out.first);
    gpu->rms_norm(x.second, w.second, 1e-6f, out.second);
    expect_close(out, 1e-2, "rms_norm_" + std::to_string(R) + "x" + std::to_string(D));
    for (bool sig : {false, true}) {
      auto z = both(random_bf16(R * D, rng), {R, D});
      auto o2 = outputs({R, D});
      cpu.gated_rms_norm(x.first, z.first, w.first, 1e-6f, sig, o2.first);
      gpu->gated_rms_norm(x.second, z.second, w.second, 1e-6f, sig, o2.second);
      expect_close(o2, 1e-2, std::string("gated_rms_norm_") + (sig ? "sigmoid" : "silu"));
    }
    auto y = both(random_bf16(R * D, rng), {R, D});
    auto prod = outputs({R, D});
    cpu.silu_mul(x.first, y.first, prod.first);
    gpu->silu_mul(x.second, y.second, prod.second);
    expect_close(prod, 1e-2, "silu_mul");
    cpu.sigmoid_mul(prod.first, y.first);
    gpu->sigmoid_mul(prod.second, y.second);
    expect_close(prod, 1e-2, "sigmoid_mul");
    cpu.add(prod.first, x.first);
    gpu->add(prod.second, x.second);
    expect_close(prod, 1e-2, "add");
    auto normed = outputs({R, D});
    cpu.add_rms_norm(prod.first, y.first, w.first, 1e-6f, normed.first);
    gpu->add_rms_norm(prod.second, y.second, w.second, 1e-6f, normed.second);
    expect_close(prod, 1e-2, "add_rms_norm_sum");
    expect_close(normed, 1e-2, "add_rms_norm");
    auto cat = outputs({R, 2 * D});
    cpu.concat_cols(x.first, y.first, cat.first);
    gpu->concat_cols(x.second, y.second, cat.second);
    expect_close(cat, 1e-6, "concat_cols");
  }
}

TEST_F(CudaOpsTest, LinearEmbeddingGather) {
  for (int T : {1, 7, 16, 63, 500}) {
    const int K = 96, N = 200, V = 50;
    auto x = both(random_bf16(T * K, rng), {T, K});
    auto w = both(random_bf16(N * K, rng, 0.1f), {N, K});
    auto out = outputs({T, N});
    cpu.linear(x.first, w.first, out.first);
    gpu->linear(x.second, w.second, out.second);
    expect_close(out, 1e-2, "linear_T" + std::to_string(T));
    StepPlan p = make_plan({T}, {0}, 16, 1);
    p.logit_rows = {T - 1, 0};
    begin(p);
    // Rows of 96 (copied 16 bytes at a time) and 100 values (not a multiple of 8: element by element).
    for (int H : {K, K + 4}) {
      auto table = both(random_bf16(V * H, rng), {V, H});
      auto emb = outputs({T, H});
      LinearWeight table_cpu, table_gpu;
      table_cpu.dense = table.first;
      table_gpu.dense = table.second;
      cpu.embedding(table_cpu, emb.first);
      gpu->embedding(table_gpu, emb.second);
      expect_close(emb, 1e-6, "embedding_H" + std::to_string(H));
      auto rows = outputs({2, H});
      cpu.gather_rows(emb.first, rows.first);
      gpu->gather_rows(emb.second, rows.second);
      expect_close(rows, 1e-6, "gather_rows_H" + std::to_string(H));
    }
  }
}

// A fused dense weight (Ops::linear_parts): the small-GEMV launch with parts (T <= 32, a block a
// pass of up to 8 tokens; widths not multiples of 8; K = 8,200 past the weight vectors a thread
// loads before its loop) and the default row views beyond it; the same after a linear of the same
// input, where the small GEMV waits for it only at its end.
TEST_F(CudaOpsTest, DenseLinearParts) {
  const std::vector<int> widths = {5, 48, 43};
  const int N = 96;
  for (int K : {96, 8200})
  for (int T : {1, 7, 16, 17, 32, 33, 65}) {
    const std::string at = "_K" + std::to_string(K) + "_T" + std::to_string(T);
    auto x = both(random_bf16(T * K, rng), {T, K});
    LinearWeight wc, wg;
    auto w = both(random_bf16(N * K, rng, 0.1f), {N, K});
    wc.dense = w.first;
    wg.dense = w.second;
    std::vector<std::pair<Tensor, Tensor>> parts;
    std::vector<Tensor> pc, pg;
    for (int n : widths) {
      parts.push_back(outputs({T, n}));
      pc.push_back(parts.back().first);
      pg.push_back(parts.back().second);
    }
    cpu.linear_parts(x.first, wc, pc);
    gpu->linear_parts(x.second, wg, pg);
    for (size_t i = 0; i < parts.size(); ++i)
      expect_close(parts[i], 1e-2, "linear_parts" + at + "_part" + std::to_string(i));
    // After a linear of the same input (a fused linear's second group): the same values, the
    // small GEMV waiting for that linear only at its end.
    auto download = [&](Tensor t) {
      std::vector<float> h(t.numel());
      gpu->download_f32(t, h.data());
      return h;
    };
    std::vector<std::vector<float>> first;
    for (const Tensor& t : pg) {
      first.push_back(download(t));
      gpu->fill_random(t, 0.f, 1.f, 99);  // so a launch that wrote nothing fails
    }
    Tensor other = gpu->scratch(DType::kBF16, {T, N});
    gpu->linear(x.second, wg.dense, other);
    gpu->linear_parts(x.second, wg, pg, /*after_same_input=*/true);
    for (size_t i = 0; i < pg.size(); ++i) EXPECT_EQ(download(pg[i]), first[i]) << at << " part " << i;
    // A deferred norm's scale (RowScale: the sums of squares of two parts of each row), which the
    // small GEMV takes a pass of tokens at a time.
    std::vector<float> ss(2 * T);
    for (float& v : ss) v = 0.5f * K * (0.5f + float(rng() % 1000) / 1000.f);
    RowScale sc, sg;
    sc.ss = cpu.upload(ss.data(), DType::kF32, {2, T}, DType::kF32);
    sg.ss = gpu->upload(ss.data(), DType::kF32, {2, T}, DType::kF32);
    sc.eps = sg.eps = 1e-6f;
    cpu.linear_parts(x.first, wc, pc, false, sc);
    gpu->linear_parts(x.second, wg, pg, false, sg);
    for (size_t i = 0; i < parts.size(); ++i)
      expect_close(parts[i], 1e-2, "linear_parts_scaled" + at + "_part" + std::to_string(i));
  }
}

TEST_F(CudaOpsTest, SplitQueryGateAndRope) {
  const int T = 63, nH = 3, hd = 40;
  StepPlan p = make_plan({20, 43}, {0, 1000}, 16, 4);
  begin(p);
  auto pg = both(random_bf16(T * nH * 2 * hd, rng), {T, nH * 2 * hd});
  auto q = outputs({T, nH, hd});
  auto gate = outputs({T, nH * hd});
  cpu.split_query_gate(pg.first, nH, hd, q.first, gate.first);
  gpu->split_query_gate(pg.second, nH, hd, q.second, gate.second);
  expect_close(gate, 1e-6, "split_gate");
  cpu.rope(q.first, 20, 10000.0);
  gpu->rope(q.second, 20, 10000.0);
  expect_close(q, 1e-2, "rope");
}

// The fused attention input op (one launch on CUDA) against the CPU's five ops: rotary dims that
// are and are not a multiple of 64, GQA, T = 1 and 63.
TEST_F(CudaOpsTest, AttentionPrepMatchesItsParts) {
  struct Case {
    int hd, rotary_dim, nH, nKV;
    std::vector<int> lens;
  };
  for (const Case& c : std::vector<Case>{{256, 64, 6, 2, {1}}, {40, 20, 3, 1, {20, 43}}, {128, 128, 4, 4, {63}}}) {
    int T = 0;
    for (int l : c.lens) T += l;
    std::vector<int> past(c.lens.size(), 0);
    past.back() = 1000;
    begin(make_plan(c.lens, past, 16, 4));
    auto pg = both(random_bf16(T * c.nH * 2 * c.hd, rng), {T, c.nH * 2 * c.hd});
    auto k = both(random_bf16(T * c.nKV * c.hd, rng), {T, c.nKV, c.hd});
    auto q_norm = both(random_bf16(c.hd, rng, 0.5f), {c.hd}, true);
    auto k_norm = both(random_bf16(c.hd, rng, 0.5f), {c.hd}, true);
    auto q = outputs({T, c.nH, c.hd});
    auto gate = outputs({T, c.nH * c.hd});
    cpu.attention_prep(pg.first, k.first, q_norm.first, k_norm.first, 1e-6f, c.rotary_dim, 1e7, q.first, gate.first);
    gpu->attention_prep(pg.second, k.second, q_norm.second, k_norm.second, 1e-6f, c.rotary_dim, 1e7, q.second,
                        gate.second);
    const std::string what = "attention_prep_hd" + std::to_string(c.hd);
    expect_close(gate, 1e-6, what + "_gate");
    expect_close(q, 1e-2, what + "_q");
    expect_close(k, 1e-2, what + "_k");
  }
}

TEST_F(CudaOpsTest, Conv1dAcrossSteps) {
  const int C = 100, K = 4;
  CacheGeometry g;
  g.n_state_layers = 1, g.n_slots = 3, g.conv_rows = K - 1, g.conv_dim = C, g.n_v_heads = 1, g.k_head_dim = 1,
  g.v_head_dim = 1, g.n_kv_layers = 1, g.n_blocks = 1, g.n_kv_heads = 1, g.head_dim = 1;
  cpu.alloc_caches(g);
  gpu->alloc_caches(g);
  auto w = both(random_bf16(C * K, rng, 0.5f), {C, K}, true);
  std::vector<int> past = {0, 0, 0};
  // Fresh sequences of a few tokens (the verify kernel), a long chunk (the per-token kernels), a
  // step of up to 2, 7 and 16 tokens, then a decode step (a token each: the one-thread walk).
  const std::vector<std::vector<int>> steps = {{2, 3, 1}, {1, 5, 63}, {2, 1, 1}, {1, 7, 2}, {16, 3, 9}, {1, 1, 1}};
  for (const std::vector<int>& lens : steps) {
    const int T = lens[0] + lens[1] + lens[2];
    begin(make_plan(lens, past, 16, 1));
    auto x = both(random_bf16(T * C, rng), {T, C});
    auto out = outputs({T, C});
    cpu.conv1d_silu(x.first, w.first, 0, out.first);
    gpu->conv1d_silu(x.second, w.second, 0, out.second);
    expect_close(out, 1e-2, "conv1d_step");
    for (int s = 0; s < 3; ++s) past[s] += lens[s];
  }
}

TEST_F(CudaOpsTest, GdnGatesAndDeltaRule) {
  // dv = 80 splits the state into column tiles of 32, 32 and 16; dk = 48 is not a power of two;
  // dk = dv = 128 is the model's.
  // The verify steps of few sequences take a CTA pair a head (their pairs fit one wave here), or
  // with the pairs off the kernel of a CTA a head in 4 parts (as where they do not fit).
  // With the one-token kernel on (the default) the decode steps take it; off, the kernel of a CTA a
  // head or its 32-column tiles, as described below.
  // With the tensor-core verify kernel on (the default), the verify steps of dk = dv = 128 and an
  // fp16 state take it instead (every sequence of up to 16 tokens); it runs with the others' forms
  // of the decode steps between.
  const bool pair_before = cuda::gdn_decode_pair(), token_before = cuda::gdn_decode_token();
  const bool mma_before = cuda::gdn_verify_mma();
  int copies[2] = {0, 0};  // decode and verify steps whose kernel made the normed output's fp16 copy
  for (bool mma : {true, false})
  for (bool token : {true, false})
  for (bool pair : {true, false})
  for (auto [Hk, Hv, dk, dv] : std::vector<std::array<int, 4>>{{2, 6, 16, 24}, {1, 3, 48, 80}, {1, 2, 128, 128}})
  for (StateDType sd : {StateDType::kF32, StateDType::kF16, StateDType::kBF16}) {
    const int state_code = sd == StateDType::kF32 ? 0 : sd == StateDType::kF16 ? 1 : 2;
    if (mma && !cuda::gdn_verify_mma_supported(dk, dv, state_code)) continue;  // as with it off
    cuda::set_gdn_verify_mma(mma);
    cuda::set_gdn_decode_pair(pair);
    cuda::set_gdn_decode_token(token);
    const int C = 2 * Hk * dk + Hv * dv;
    CudaOpsOptions o;
    o.state_dtype = sd;
    gpu = std::make_unique<CudaOps>(o);
    CacheGeometry g;
    g.n_state_layers = 2, g.n_slots = 9, g.conv_rows = 3, g.conv_dim = C, g.n_v_heads = Hv, g.k_head_dim = dk,
    g.v_head_dim = dv, g.n_kv_layers = 1, g.n_blocks = 1, g.n_kv_heads = 1, g.head_dim = 1;
    cpu.alloc_caches(g);
    gpu->alloc_caches(g);
    auto a_log = both(random_bf16(Hv, rng, 0.5f), {Hv}, true);
    auto dt_bias = both(random_bf16(Hv, rng, 0.5f), {Hv}, true);
    std::vector<int> past(9, 0);
    // A long step, then decode and verify sized ones; from the third on through
    // gdn_gates_delta_rule (on CUDA the decode kernel makes the gates itself; the CPU runs the two
    // ops), the fourth to sixth through gdn_gates_delta_rule_norm (on CUDA the decode steps, a token
    // a sequence, take the kernel of a CTA a head, which also normalises; the verify step the two
    // ops). The next two have 9 sequences (6 of them new), which take the kernel of a CTA a head (8
    // or more sequences), the second with verify blocks of up to 16 tokens. Then two verify steps
    // of 2 and 1 sequences (up to 8 tokens) through gdn_gates_delta_rule_norm, which on CUDA take
    // the kernel of a CTA a head with its norm (gdn_verify_head) as a CTA pair, or in 4 parts of a
    // column's rows, the second continuing the first's state; last a decode step of 2 sequences
    // with the norm that reads the states they wrote, in 4 parts too (gdn_head_parts; the decode
    // steps of 3 and 9 sequences before take 2).
    const std::vector<std::vector<int>> steps = {{1, 63, 130}, {1, 1, 9}, {16, 3, 1}, {1, 1, 1}, {8, 8, 8},
                                                 {1, 1, 1, 1, 1, 1, 1, 1, 1}, {2, 16, 1, 2, 5, 2, 2, 8, 3},
                                                 {8, 3}, {5}, {1, 1}};
    auto norm_w = both(random_bf16(dv, rng, 0.5f), {dv}, true);
    for (size_t step = 0; step < steps.size(); ++step) {
      const std::vector<int>& lens = steps[step];
      const bool fused = step >= 2, normed = (step >= 3 && step <= 5) || step >= 7;
      int T = 0;
      for (int len : lens) T += len;
      begin(make_plan(lens, past, 16, 1));
      auto a = both(random_bf16(T * Hv, rng), {T, Hv});
      auto b = both(random_bf16(T * Hv, rng), {T, Hv});
      auto qkv = both(random_bf16(T * C, rng), {T, C});
      auto out = outputs({T, Hv, dv});
      GdnShape sh{Hk, Hv, dk, dv};
      const double tol = sd == StateDType::kF32 ? 1e-2 : sd == StateDType::kF16 ? 1.5e-2 : 3e-2;
      const std::string what = "dk" + std::to_string(dk) + "_dv" + std::to_string(dv) + "_state" +
                               std::to_string(static_cast<int>(sd)) + "_step" + std::to_string(step) +
                               (pair ? "_pair" : "") + (token ? "_token" : "") + (mma ? "_mma" : "");
      if (normed) {
        auto z = both(random_bf16(T * Hv * dv, rng), {T, Hv * dv});
        auto normed_out = outputs({T, Hv * dv});
        const bool sig = step % 2 == 1;
        cpu.gdn_gates_delta_rule_norm(qkv.first, a.first, b.first, a_log.first, dt_bias.first, sh, 1, z.first,
                                      norm_w.first, 1e-6f, sig, normed_out.first);
        // With a buffer for the output's fp16 copy (out_proj's input): filled by the one-token and
        // verify kernels at up to 8 tokens, and then out / 16.
        Tensor half = nan_half_copy(*gpu, true, T, Hv * dv);
        gpu->gdn_gates_delta_rule_norm(qkv.second, a.second, b.second, a_log.second, dt_bias.second, sh, 1, z.second,
                                       norm_w.second, 1e-6f, sig, normed_out.second, &half);
        expect_close(normed_out, tol, "gdn_rule_norm_" + what);
        if (half.data) {
          EXPECT_EQ(sixteenth_misses(*gpu, normed_out.second, half), 0) << what << " fp16 copy";
          ++copies[T > static_cast<int>(lens.size())];
        }
        for (size_t s = 0; s < lens.size(); ++s) past[s] += lens[s];
        continue;
      }
      if (fused) {
        cpu.gdn_gates_delta_rule(qkv.first, a.first, b.first, a_log.first, dt_bias.first, sh, 1, out.first);
        gpu->gdn_gates_delta_rule(qkv.second, a.second, b.second, a_log.second, dt_bias.second, sh, 1, out.second);
      } else {
        auto gg = outputs({T, Hv}, true);
        auto beta = outputs({T, Hv}, true);
        cpu.gdn_gates(a.first, b.first, a_log.first, dt_bias.first, gg.first, beta.first);
        gpu->gdn_gates(a.second, b.second, a_log.second, dt_bias.second, gg.second, beta.second);
        expect_close(gg, 1e-5, "gdn_g");
        expect_close(beta, 1e-5, "gdn_beta");
        cpu.gated_delta_rule(qkv.first, gg.first, beta.first, sh, 1, out.first);
        gpu->gated_delta_rule(qkv.second, gg.second, beta.second, sh, 1, out.second);
      }
      expect_close(out, tol, "gdn_rule_" + what);
      for (size_t s = 0; s < lens.size(); ++s) past[s] += lens[s];
    }
  }
  cuda::set_gdn_decode_pair(pair_before);
  cuda::set_gdn_decode_token(token_before);
  cuda::set_gdn_verify_mma(mma_before);
  EXPECT_GT(copies[0], 0) << "decode steps that made the normed output's fp16 copy (the one-token kernel)";
  EXPECT_GT(copies[1], 0) << "verify steps that made the normed output's fp16 copy (the tensor-core kernel)";
}

// conv_gdn_norm with the conv in the one-token GDN decode kernel (cuda::GdnConv) against
// conv1d_silu and gdn_gates_delta_rule_norm on a second CudaOps: the same bits, step after step,
// so the conv and recurrent states the fused kernel writes are the separate kernels' too; and the
// CPU's two ops within tolerance. Decode steps of 1, 2 and 9 sequences (the 27B's 9 x 48 heads
// take two waves, so the two ops), fresh sequences beside continuing ones (a k-head's q and k conv
// state rows, read by every CTA of its v-heads, written by the last to arrive), and verify steps
// between (the two ops); conv widths 4 and 2; Hv / Hk 3, 1 and the 27B's 48 / 16; runtime head
// dims and the model's 128.
TEST_F(CudaOpsTest, ConvGdnNormMatchesSeparate) {
  const bool conv_before = cuda::gdn_conv_fused();
  cuda::set_gdn_conv_fused(true);
  for (auto [Hk, Hv, dk, dv, K] : std::vector<std::array<int, 5>>{
           {2, 6, 16, 24, 4}, {1, 3, 48, 80, 2}, {2, 2, 128, 128, 4}, {16, 48, 128, 128, 4}}) {
    const int C = 2 * Hk * dk + Hv * dv;
    CudaOpsOptions o;
    o.state_dtype = StateDType::kF16;
    gpu = std::make_unique<CudaOps>(o);
    CudaOps sep(o);
    CacheGeometry g;
    g.n_state_layers = 2, g.n_slots = 9, g.conv_rows = K - 1, g.conv_dim = C, g.n_v_heads = Hv, g.k_head_dim = dk,
    g.v_head_dim = dv, g.n_kv_layers = 1, g.n_blocks = 1, g.n_kv_heads = 1, g.head_dim = 1;
    cpu.alloc_caches(g);
    gpu->alloc_caches(g);
    sep.alloc_caches(g);
    struct Three {
      Tensor cpu, gpu, sep;
    };
    auto three = [&](const std::vector<float>& h, std::initializer_list<int64_t> shape, bool f32 = false) {
      auto [c, gg] = both(h, shape, f32);
      return Three{c, gg, sep.upload(h.data(), DType::kF32, shape, f32 ? DType::kF32 : DType::kBF16)};
    };
    const Three conv_w = three(random_bf16(C * K, rng, 0.5f), {C, K}, true);
    const Three a_log = three(random_bf16(Hv, rng, 0.5f), {Hv}, true);
    const Three dt_bias = three(random_bf16(Hv, rng, 0.5f), {Hv}, true);
    const Three norm_w = three(random_bf16(dv, rng, 0.5f), {dv}, true);
    const GdnShape sh{Hk, Hv, dk, dv};
    std::vector<int> past(9, 0);
    const std::vector<std::vector<int>> steps = {{1},    {1, 1}, {1, 1, 1, 1, 1, 1, 1, 1, 1}, {8, 3}, {1, 1},
                                                 {1, 1}, {5},    {1, 1, 1},                   {1}};
    int fused_steps = 0;
    for (size_t step = 0; step < steps.size(); ++step) {
      const std::vector<int>& lens = steps[step];
      int T = 0;
      for (int len : lens) T += len;
      const StepPlan plan = make_plan(lens, past, 16, 1);
      begin(plan);
      sep.begin_step(plan);
      const Three mixed = three(random_bf16(T * C, rng), {T, C});
      const Three a = three(random_bf16(T * Hv, rng), {T, Hv});
      const Three b = three(random_bf16(T * Hv, rng), {T, Hv});
      const Three z = three(random_bf16(T * Hv * dv, rng), {T, Hv * dv});
      const bool sig = step % 2 == 1;
      const std::string what = "Hk" + std::to_string(Hk) + "_Hv" + std::to_string(Hv) + "_dk" + std::to_string(dk) +
                               "_K" + std::to_string(K) + "_step" + std::to_string(step);
      const bool decode = T == static_cast<int>(lens.size());
      EXPECT_EQ(gpu->gdn_takes_conv(sh, K), decode && cuda::gdn_conv_fits(static_cast<int>(lens.size()), Hv)) << what;
      fused_steps += gpu->gdn_takes_conv(sh, K);
      auto out = outputs({T, Hv * dv});
      Tensor half = nan_half_copy(*gpu, true, T, Hv * dv);
      gpu->conv_gdn_norm(mixed.gpu, conv_w.gpu, a.gpu, b.gpu, a_log.gpu, dt_bias.gpu, sh, 1, z.gpu, norm_w.gpu, 1e-6f,
                         sig, out.second, &half);
      // The fp16 copy (out_proj's input) wherever the conv is in the kernel (the one-token kernel)
      // at up to 8 tokens.
      if (gpu->gdn_takes_conv(sh, K) && T <= 8) {
        EXPECT_NE(half.data, nullptr) << what << " fp16 copy";
      }
      if (half.data) {
        EXPECT_EQ(sixteenth_misses(*gpu, out.second, half), 0) << what << " fp16 copy";
      }
      cpu.conv_gdn_norm(mixed.cpu, conv_w.cpu, a.cpu, b.cpu, a_log.cpu, dt_bias.cpu, sh, 1, z.cpu, norm_w.cpu, 1e-6f,
                        sig, out.first);
      Tensor qkv_sep = sep.scratch(DType::kBF16, {T, C});
      Tensor out_sep = sep.scratch(DType::kBF16, {T, Hv * dv});
      sep.conv1d_silu(mixed.sep, conv_w.sep, 1, qkv_sep);
      sep.gdn_gates_delta_rule_norm(qkv_sep, a.sep, b.sep, a_log.sep, dt_bias.sep, sh, 1, z.sep, norm_w.sep, 1e-6f, sig,
                                    out_sep);
      std::vector<float> fused(out.second.numel()), separate(out_sep.numel());
      gpu->download_f32(out.second, fused.data());
      sep.download_f32(out_sep, separate.data());
      int differ = 0;
      for (size_t i = 0; i < fused.size(); ++i) differ += fused[i] != separate[i];
      EXPECT_EQ(differ, 0) << what << ": outputs of the fused kernel that differ from the separate ops'";
      expect_close(out, 2e-2, "conv_gdn_norm_" + what);
      for (size_t s = 0; s < lens.size(); ++s) past[s] += lens[s];
    }
    EXPECT_GE(fused_steps, 6) << "steps that took the conv in the GDN kernel";
  }
  cuda::set_gdn_conv_fused(conv_before);
}

// Paged GQA attention on prefill and decode steps, decode chunks through the split-KV kernel
// and (head dim 256: the tensor-core kernel has it) through the tensor-core kernel with the
// query heads packed per KV head (DS_ATTN_DECODE=tc).
TEST_F(CudaOpsTest, PagedAttentionGqa) {
  const bool tc_before = cuda::attention_decode_tc();
  for (bool tc : {false, true})
    for (int hd : {40, 256}) {
      cuda::set_attention_decode_tc(tc);
      const int nH = 6, nKV = 2, bs = 16, max_blocks = 40;
      CacheGeometry g;
      g.n_kv_layers = 2, g.n_blocks = 3 * max_blocks, g.block_size = bs, g.n_kv_heads = nKV, g.head_dim = hd;
      g.n_state_layers = 1, g.n_slots = 3, g.conv_rows = 1, g.conv_dim = 1, g.n_v_heads = 1, g.k_head_dim = 1,
      g.v_head_dim = 1;
      cpu.alloc_caches(g);
      gpu->alloc_caches(g);
      std::vector<int> past = {0, 0, 0};
      // 600- and 300-token prefills, then decode-sized steps: long contexts take the split-KV path.
      for (const std::vector<int>& lens :
           std::vector<std::vector<int>>{{1, 63, 20}, {1, 1, 40}, {500, 230, 5}, {1, 1, 3}}) {
        const int T = lens[0] + lens[1] + lens[2];
        begin(make_plan(lens, past, bs, max_blocks));
        auto q = both(random_bf16(T * nH * hd, rng), {T, nH, hd});
        auto k = both(random_bf16(T * nKV * hd, rng), {T, nKV, hd});
        auto v = both(random_bf16(T * nKV * hd, rng), {T, nKV, hd});
        auto out = outputs({T, nH * hd});
        const float scale = 1.0f / std::sqrt(float(hd));
        cpu.attention(q.first, k.first, v.first, 1, scale, out.first);
        gpu->attention(q.second, k.second, v.second, 1, scale, out.second);
        expect_close(out, 1e-2, "attention_hd" + std::to_string(hd) + (tc ? " tc" : ""));
        for (int s = 0; s < 3; ++s) past[s] += lens[s];
      }
    }
  cuda::set_attention_decode_tc(tc_before);
}

// The gated attention (o_proj's input: attention, then out * sigmoid(gate)) equals attention and
// sigmoid_mul bit for bit, where the merge of the key splits applies the gate as where a kernel of
// its own does; with the 27B's group of 6 query heads a KV head and head dim 256, so one sequence's
// steps take both decode-sized kernels (1, 3 and 4 tokens: attention_decode_kernel; 8: the flash
// kernel), whose graph-shaped steps split the block table's whole width, and the prefill takes the
// separate gate (as every step does with DS_ATTN_DECODE=simt). Where the merge gates a step of 1-8
// tokens it also fills the fp16 copy (out / 16); elsewhere it leaves none.
TEST_F(CudaOpsTest, GatedAttentionMatchesSeparate) {
  const bool tc_before = cuda::attention_decode_tc();
  for (bool tc : {true, false}) {
    cuda::set_attention_decode_tc(tc);
    const int nH = 12, nKV = 2, hd = 256, bs = 16, max_blocks = 40, D = nH * hd;
    CacheGeometry g;
    g.n_kv_layers = 2, g.n_blocks = max_blocks, g.block_size = bs, g.n_kv_heads = nKV, g.head_dim = hd;
    g.n_state_layers = 1, g.n_slots = 1, g.conv_rows = 1, g.conv_dim = 1, g.n_v_heads = 1, g.k_head_dim = 1,
    g.v_head_dim = 1;
    cpu.alloc_caches(g);
    gpu->alloc_caches(g);
    int past = 0;
    for (int T : {4, 600, 1, 8, 3, 1}) {
      const std::string what = "T " + std::to_string(T) + " at " + std::to_string(past) + (tc ? " tc" : " simt");
      begin(make_plan({T}, {past}, bs, max_blocks));
      auto q = both(random_bf16(T * nH * hd, rng), {T, nH, hd});
      auto k = both(random_bf16(T * nKV * hd, rng), {T, nKV, hd});
      auto v = both(random_bf16(T * nKV * hd, rng), {T, nKV, hd});
      auto gate = both(random_bf16(T * D, rng, 2.f), {T, D});
      auto out = outputs({T, D});
      const float scale = 1.0f / std::sqrt(float(hd));
      cpu.gated_attention(q.first, k.first, v.first, 1, scale, gate.first, out.first);
      Tensor half = nan_half_copy(*gpu, true, T, D);
      const bool asked = half.data != nullptr;
      gpu->gated_attention(q.second, k.second, v.second, 1, scale, gate.second, out.second, &half);
      // The separate ops, on the other KV layer (the same keys appended there).
      Tensor sep = gpu->scratch(DType::kBF16, {T, D});
      gpu->attention(q.second, k.second, v.second, 0, scale, sep);
      gpu->sigmoid_mul(sep, gate.second);
      std::vector<float> fused(T * D), separate(T * D);
      gpu->download_f32(out.second, fused.data());
      gpu->download_f32(sep, separate.data());
      int differ = 0;
      for (size_t i = 0; i < fused.size(); ++i) differ += fused[i] != separate[i];
      EXPECT_EQ(differ, 0) << what << ": outputs that differ from attention and sigmoid_mul";
      expect_close(out, 1e-2, "gated_attention " + what);
      // The merge gates the decode-sized steps; the prefill goes through sigmoid_mul.
      EXPECT_EQ(half.data != nullptr, asked && tc && T <= 8) << what << ": fp16 copy";
      if (half.data) {
        EXPECT_EQ(sixteenth_misses(*gpu, out.second, half), 0) << what << " fp16 copy";
      }
      gpu->reset_scratch();
      past += T;
    }
  }
  cuda::set_attention_decode_tc(tc_before);
}

// The instruction-fetch probe (code_probe.cu), as figures: the cycles a CTA takes for straight-line
// FFMA code of 4-128 KB with its code cold (other code has just run on every SM) or warm, against
// the same FFMAs as a loop; and the FFMAs a cycle each busy sub-partition issued (one is its most;
// the loop issues 3 instructions of its own a 64 FFMAs). 48 CTAs of 8 warps are the one-token GDN
// kernel's grid at the 27B shape's 48 v-heads; one warp, the last block of a split GEMV's tile
// adding up the partials (one token). (A warm launch of 48 CTAs may find other SMs than the launch
// before it; 132 CTAs fill every SM.)
TEST_F(CudaOpsTest, InstructionFetchFigures) {
  for (int ctas : {48, cuda::sm_count()})
    for (int threads : {32, 256, 512})
      for (int kb : {4, 16, 32, 64, 128}) {
        double c[3];  // straight cold, straight warm, rolled cold
        for (int form = 0; form < 3; ++form) {
          cuda::CodeProbe p;
          p.kilobytes = kb;
          p.rolled = form == 2;
          p.cold = form != 1;
          p.ctas = ctas;
          p.threads = threads;
          c[form] = cuda::code_probe_cycles(p);
          EXPECT_GT(c[form], 0);
        }
        // A warp's FFMAs times the warps of a busy sub-partition, over the cycles.
        const double issued = kb * 1024.0 / 16 * std::max(1, threads / 32 / 4);
        std::printf("[figure] code %3d KB, %3d CTAs x %2d warps: straight cold %7.0f cycles (%.2f a cycle), warm "
                    "%7.0f (%.2f), rolled %7.0f (%.2f)\n",
                    kb, ctas, threads / 32, c[0], issued / c[0], c[1], issued / c[1], c[2], issued / c[2]);
      }
}

// The bench's clock and power figures (clocks.h): NVML answers for this GPU, every 2 ms while a
// span is sampled, with a clock and a power in range; end() without begin() reads nothing.
TEST_F(CudaOpsTest, ClockSamplerReadsClockAndPower) {
  ClockSampler clocks;
  if (!clocks.available()) GTEST_SKIP() << "no NVML for this GPU";
  EXPECT_EQ(clocks.end().samples, 0);
  clocks.begin();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const ClockFigures f = clocks.end();
  std::printf("[figure] idle: %d samples, SM %.0f MHz, %.1f W, capped %.0f%%, reasons 0x%llx\n", f.samples, f.sm_mhz,
              f.watts, 100 * f.capped, f.reasons);
  EXPECT_GE(f.samples, 10);
  EXPECT_GT(f.sm_mhz, 100);
  EXPECT_LT(f.sm_mhz, 5000);
  EXPECT_GT(f.watts, 5);
  EXPECT_LT(f.watts, 2000);
  EXPECT_GE(f.capped, 0);
  EXPECT_LE(f.capped, 1);
}

}  // namespace
}  // namespace ds
