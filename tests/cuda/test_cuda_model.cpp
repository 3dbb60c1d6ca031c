// The CUDA backend end to end on every fixture: logits against transformers' fp32 reference
// within bf16 tolerance, greedy continuations equal where the reference margin is clear of
// bf16 noise, chunked prefill against one-piece prefill, programmatic dependent launch against
// none, W4A8 end to end, vocabulary tables published quantized, the MTP head (bf16, and int8
// rows as the seed publishes it), and the step scratch bound (step_scratch_bytes) at the 27B's
// widths. Skipped where there is no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device.h"
#include "backend/cuda/launchers.h"
#include "model/fixture.h"
#include "unit/seed_requant.h"

namespace ds::test {
namespace {

struct GpuEngine {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<CudaOps> ops;
  std::unique_ptr<Qwen35Model> model;
  std::unique_ptr<Runner> runner;
};

// int8_vocab off by default here: these tests hold the model math to the bf16 baseline; the
// int8 tables are checked against the CPU twin (CudaDemoModel.Int8VocabWithinBf16OfCpuTwin).
GpuEngine make_gpu_engine(const std::string& name, StateDType state = StateDType::kF16, bool int8_vocab = false,
                          ActInt8Layers a8 = {}) {
  GpuEngine e;
  auto ck = Checkpoint::open(fixture_dir(name));
  EXPECT_TRUE(ck.ok()) << ck.status().message();
  e.ck = std::move(ck.value());
  CudaOpsOptions o;
  o.state_dtype = state;
  o.int8_vocab = int8_vocab;
  e.ops = std::make_unique<CudaOps>(o);
  auto model = Qwen35Model::load(*e.ck, *e.ops, a8);
  EXPECT_TRUE(model.ok()) << model.status().message();
  e.model = std::move(model.value());
  e.runner = std::make_unique<Runner>(*e.model, *e.ops, RunnerOptions{64, 16, 4});
  return e;
}

std::vector<float> gpu_prefill(GpuEngine& e, const std::vector<int32_t>& ids, int chunk) {
  Sequence seq;
  seq.tokens = ids;
  EXPECT_TRUE(e.runner->admit(seq).ok());
  std::vector<float> out;
  const int n = static_cast<int>(ids.size());
  while (seq.n_cached < n) {
    auto r = e.runner->step({SeqWork{&seq, std::min(chunk, n - seq.n_cached), true}});
    EXPECT_TRUE(r.ok()) << r.status().message();
    out.insert(out.end(), r.value()[0].begin(), r.value()[0].end());
  }
  e.runner->release(seq);
  return out;
}

class CudaModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  }
};

// The CUDA backend's error against transformers' fp32 logits may be at most 1.5x that of the
// same-precision baseline: the CPU reference with every activation rounded to bf16 (random
// tiny models amplify bf16 rounding to several percent, so no absolute bound is meaningful).
TEST_P(CudaModel, LogitsWithinBf16OfTransformers) {
  Reference ref = load_reference(GetParam());
  Engine baseline = make_engine(GetParam(), 4, 64, 16, /*bf16_activations=*/true);
  const double base = rel_rms(prefill_logits(baseline, ref.prompt_ids, {static_cast<int>(ref.prompt_ids.size())}),
                              ref.logits.data);
  for (StateDType sd : {StateDType::kF32, StateDType::kF16, StateDType::kBF16}) {
    GpuEngine e = make_gpu_engine(GetParam(), sd);
    const int n = static_cast<int>(ref.prompt_ids.size());
    std::vector<float> ours = gpu_prefill(e, ref.prompt_ids, n);
    const double rms = rel_rms(ours, ref.logits.data), mx = max_err_over_std(ours, ref.logits.data);
    std::cout << "[figure] " << GetParam() << " state " << static_cast<int>(sd) << " rel_rms " << rms
              << " max_err_over_std " << mx << " cpu_bf16_baseline_rel_rms " << base << "\n";
    EXPECT_LE(rms, 1.5 * base + 1e-3) << GetParam();
  }
}

TEST_P(CudaModel, GreedyMatchesWhereMarginIsClear) {
  Reference ref = load_reference(GetParam());
  GpuEngine e = make_gpu_engine(GetParam());
  auto ours = e.runner->generate_greedy(ref.prompt_ids, static_cast<int>(ref.greedy_ids.size()), 0, {});
  ASSERT_TRUE(ours.ok()) << ours.status().message();
  size_t same = 0;
  for (size_t i = 0; i < ref.greedy_ids.size(); ++i) {
    if (ref.greedy_margins[i] < 0.25f) break;  // bf16 logits move by ~0.05-0.1 here
    EXPECT_EQ(ours.value()[i], ref.greedy_ids[i]) << GetParam() << " position " << i;
    ++same;
  }
  std::cout << "[figure] " << GetParam() << " greedy positions checked " << same << "\n";
}

// Chunked prefill against one-piece prefill: chunks of different lengths take different kernels
// (the recurrent or the chunked delta rule, split-KV or flash attention, GEMV or cuBLAS), so
// each is held to the bf16 baseline against transformers; exact equality across step shapes
// is checked on the CPU backend.
TEST_P(CudaModel, ChunkedPrefillMatchesOnePiece) {
  Reference ref = load_reference(GetParam());
  GpuEngine e = make_gpu_engine(GetParam(), StateDType::kF32);
  const int n = static_cast<int>(ref.prompt_ids.size());
  std::vector<float> whole = gpu_prefill(e, ref.prompt_ids, n);
  Engine baseline = make_engine(GetParam(), 4, 64, 16, /*bf16_activations=*/true);
  const double base = rel_rms(prefill_logits(baseline, ref.prompt_ids, {n}), ref.logits.data);
  for (int chunk : {1, 7, 64}) {
    const std::vector<float> chunked = gpu_prefill(e, ref.prompt_ids, chunk);
    const double err = rel_rms(chunked, whole), err_ref = rel_rms(chunked, ref.logits.data);
    std::cout << "[figure] " << GetParam() << " chunk " << chunk << " rel_rms vs one piece " << err
              << " vs transformers " << err_ref << "\n";
    EXPECT_LE(err_ref, 1.5 * base + 1e-3);
    EXPECT_LE(err, 2.0 * base + 1e-3);
  }
}

// Programmatic dependent launch (DS_PDL) changes when kernels start, never what they compute:
// one-token steps (decode graphs) and 7-token steps (verify-shaped graphs) give bit-identical
// logits with it on and off.
TEST_P(CudaModel, PdlChangesNothing) {
  Reference ref = load_reference(GetParam());
  const bool before = cuda::pdl_enabled();
  std::vector<float> logits[2];
  for (int on = 0; on < 2; ++on) {
    cuda::set_pdl_enabled(on == 1);
    GpuEngine e = make_gpu_engine(GetParam());
    for (int chunk : {1, 7}) {
      const std::vector<float> l = gpu_prefill(e, ref.prompt_ids, chunk);
      logits[on].insert(logits[on].end(), l.begin(), l.end());
    }
  }
  cuda::set_pdl_enabled(before);
  ASSERT_EQ(logits[0].size(), logits[1].size());
  size_t differ = 0;
  for (size_t i = 0; i < logits[0].size(); ++i) differ += logits[0][i] != logits[1][i];
  EXPECT_EQ(differ, 0u) << GetParam() << ": logits that differ with programmatic dependent launch";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModel, ::testing::ValuesIn(fixture_names()));

// W4A8 (every layer class) end to end on the W4A16 fixture, in steps of 1 and 4 tokens. Its
// linears are too narrow for split launches, so none takes int8 inputs
// (cuda::w4a16_gemv_takes_a8; W4A8MatchesCpu holds the launches that do to the CPU twin): the
// flagged weights go through loading and every dispatch, and give the plain logits bit for bit.
TEST(CudaModelW4A8, UnsplitLaunchesKeepBf16Inputs) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const std::string name = "tiny_w4a16";
  const std::vector<int32_t> ids = load_reference(name).prompt_ids;
  GpuEngine plain = make_gpu_engine(name, StateDType::kF32);
  GpuEngine a8 = make_gpu_engine(name, StateDType::kF32, false, parse_act_int8_layers("all").value());
  const int I = a8.model->config().intermediate_size;
  EXPECT_FALSE(cuda::w4a16_gemv_takes_a8(1, a8.model->config().hidden_size, I, 128, false)) << "down_proj";
  for (int chunk : {1, 4}) EXPECT_EQ(gpu_prefill(a8, ids, chunk), gpu_prefill(plain, ids, chunk)) << "chunk " << chunk;
}

// The held-out prompt of the demo model's reference (tests/data/demo_reference); empty if missing.
std::vector<int32_t> demo_prompt() {
  std::ifstream in(fixture_dir("demo_reference") + "/reference.json");
  if (!in.good()) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str())["sequences"][0]["prompt_ids"].get<std::vector<int32_t>>();
}

const std::string kDemoModel = "../../models/qwen3_5-demo";  // relative to tests/data

// The demo model's CPU logits on the held-out prompt (fp32; int8 embedding / lm_head tables
// if asked) and the error of the same model with bf16 activations against them: the bound
// CUDA logits are judged by. Empty prompt if the reference is missing.
struct DemoReference {
  std::vector<int32_t> prompt;
  std::vector<float> logits;
  double base = 0;
};
DemoReference demo_reference(bool int8_vocab) {
  DemoReference r;
  r.prompt = demo_prompt();
  if (r.prompt.empty()) return r;
  const int n = static_cast<int>(r.prompt.size());
  Engine cpu = make_engine(kDemoModel, 4, 64, 16, /*bf16_activations=*/false, int8_vocab);
  Engine cpu_bf16 = make_engine(kDemoModel, 4, 64, 16, /*bf16_activations=*/true, int8_vocab);
  r.logits = prefill_logits(cpu, r.prompt, {n});
  r.base = rel_rms(prefill_logits(cpu_bf16, r.prompt, {n}), r.logits);
  return r;
}

// The trained demo model (models/qwen3_5-demo) on a held-out prompt: CUDA logits against the
// fp32 CPU reference (itself within 1e-5 of transformers), judged like the fixtures against
// the bf16 baseline; greedy agreement over 32 tokens reported as a figure.
TEST(CudaDemoModel, LogitsWithinBf16OfReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const std::vector<int32_t> prompt = demo_prompt();
  ASSERT_FALSE(prompt.empty());
  const int n = static_cast<int>(prompt.size());
  Engine cpu = make_engine(kDemoModel);
  Engine cpu_bf16 = make_engine(kDemoModel, 4, 64, 16, /*bf16_activations=*/true);
  GpuEngine gpu = make_gpu_engine(kDemoModel);
  const std::vector<float> ref = prefill_logits(cpu, prompt, {n});
  const double base = rel_rms(prefill_logits(cpu_bf16, prompt, {n}), ref);
  const double err = rel_rms(gpu_prefill(gpu, prompt, n), ref);
  auto g_cpu = cpu.runner->generate_greedy(prompt, 32, 0, {});
  auto g_gpu = gpu.runner->generate_greedy(prompt, 32, 0, {});
  ASSERT_TRUE(g_cpu.ok() && g_gpu.ok());
  size_t agree = 0;
  while (agree < g_cpu.value().size() && g_cpu.value()[agree] == g_gpu.value()[agree]) ++agree;
  std::cout << "[figure] demo rel_rms " << err << " cpu_bf16_baseline_rel_rms " << base << " greedy_agree " << agree
            << "/32\n";
  EXPECT_LE(err, 1.5 * base + 1e-3);
}

// The demo model (head dim 64, 2 query heads per KV head) decoding token by token and in
// 7-token verify-shaped steps (recorded graphs) with the tensor-core attention packing the GQA
// heads (DS_ATTN_DECODE=tc), against the CPU reference, judged like the one-piece prefill.
TEST(CudaDemoModel, TensorCoreDecodeAttentionWithinBf16OfReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const DemoReference ref = demo_reference(/*int8_vocab=*/false);
  ASSERT_FALSE(ref.prompt.empty());
  const bool before = cuda::attention_decode_tc();
  for (bool tc : {false, true}) {
    cuda::set_attention_decode_tc(tc);
    GpuEngine gpu = make_gpu_engine(kDemoModel);
    for (int chunk : {1, 7}) {
      const double err = rel_rms(gpu_prefill(gpu, ref.prompt, chunk), ref.logits);
      std::cout << "[figure] demo decode attention " << (tc ? "tc" : "simt") << " chunk " << chunk << " rel_rms "
                << err << " cpu_bf16_baseline_rel_rms " << ref.base << "\n";
      EXPECT_LE(err, 1.5 * ref.base + 1e-3) << (tc ? "tc" : "simt") << " chunk " << chunk;
    }
  }
  cuda::set_attention_decode_tc(before);
}

// The seed system's requantized vocabulary tables on the CUDA backend (unit/seed_requant.h): an
// int8 lm_head and embedding table, read as bf16 tables or quantised again into the backend's int8
// ones (the same codes); or an int4 lm_head, a W4A16 GEMV of the vocabulary's rows. Against the
// CPU on the same checkpoint with those tables dequantised as F32, judged like the fixtures
// against the CPU's bf16 baseline.
TEST(CudaModelQuantizedVocab, LogitsWithinBf16OfCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const Reference ref = load_reference("tiny_w4a16");
  const int n = static_cast<int>(ref.prompt_ids.size());
  for (bool int8_tables : {true, false}) {
    VocabCopies c("tiny_w4a16", int8_tables);
    Engine cpu = make_engine(c.dequantised.string());
    Engine baseline = make_engine(c.dequantised.string(), 4, 64, 16, /*bf16_activations=*/true);
    const std::vector<float> want = prefill_logits(cpu, ref.prompt_ids, {n});
    const double base = rel_rms(prefill_logits(baseline, ref.prompt_ids, {n}), want);
    for (bool int8_vocab : {false, true}) {
      if (int8_vocab && !int8_tables) continue;  // a bf16 embedding table quantised anew: not this test's
      GpuEngine g = make_gpu_engine(c.quantized.string(), StateDType::kF16, int8_vocab);
      if (!int8_tables) {  // the int4 lm_head stays W4A16: fewer bytes than the same values in bf16
        EXPECT_LT(g.ops->weight_bytes(), make_gpu_engine(c.dequantised.string()).ops->weight_bytes());
      }
      const double err = rel_rms(gpu_prefill(g, ref.prompt_ids, n), want);
      std::cout << "[figure] quantized vocab " << (int8_tables ? "int8 tables" : "int4 lm_head") << " int8_vocab "
                << int8_vocab << " rel_rms " << err << " cpu_bf16_baseline_rel_rms " << base << "\n";
      EXPECT_LE(err, 1.5 * base + 1e-3) << int8_tables << int8_vocab;
    }
  }
}

// The MTP head on the CUDA backend (forward_mtp over a prompt), bf16 and as the seed's int8 rows
// (seed_requant.h Int8MtpCopies: its linears on the int8 GEMV), against the CPU on the same values
// as F32, judged like the fixtures against the CPU's bf16 baseline; the int8 head holds fewer
// weight bytes.
TEST(CudaModelMtp, LogitsWithinBf16OfCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const Reference ref = load_reference("tiny_w4a16");
  std::vector<int> rows(ref.prompt_ids.size() - 1);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int>(i);
  Int8MtpCopies c("tiny_w4a16");
  Engine cpu = make_engine(c.dequantised.string());
  Engine baseline = make_engine(c.dequantised.string(), 4, 64, 16, /*bf16_activations=*/true);
  const std::vector<float> want = mtp_prompt_logits(*cpu.runner, *cpu.ops, *cpu.model, ref.prompt_ids, rows);
  const double base =
      rel_rms(mtp_prompt_logits(*baseline.runner, *baseline.ops, *baseline.model, ref.prompt_ids, rows), want);
  size_t bytes[2];
  for (bool int8_head : {false, true}) {
    GpuEngine g = make_gpu_engine((int8_head ? c.quantized : c.dequantised).string());
    ASSERT_TRUE(g.model->has_mtp());
    bytes[int8_head] = g.ops->weight_bytes();
    const double err = rel_rms(mtp_prompt_logits(*g.runner, *g.ops, *g.model, ref.prompt_ids, rows), want);
    std::cout << "[figure] mtp head " << (int8_head ? "int8" : "bf16") << " rel_rms " << err
              << " cpu_bf16_baseline_rel_rms " << base << "\n";
    EXPECT_LE(err, 1.5 * base + 1e-3) << (int8_head ? "int8" : "bf16");
  }
  EXPECT_LT(bytes[1], bytes[0]);
}

// The demo model with int8 embedding / lm_head tables (the CUDA default) against the CPU
// reference holding the same int8 tables, judged like the bf16 tables against the bf16 baseline.
TEST(CudaDemoModel, Int8VocabWithinBf16OfCpuTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const DemoReference ref = demo_reference(/*int8_vocab=*/true);
  ASSERT_FALSE(ref.prompt.empty());
  GpuEngine gpu = make_gpu_engine(kDemoModel, StateDType::kF16, /*int8_vocab=*/true);
  const double err = rel_rms(gpu_prefill(gpu, ref.prompt, static_cast<int>(ref.prompt.size())), ref.logits);
  std::cout << "[figure] demo int8 vocab rel_rms vs CPU twin " << err << " cpu_bf16_baseline_rel_rms " << ref.base
            << "\n";
  EXPECT_LE(err, 1.5 * ref.base + 1e-3);
}

// step_scratch_bytes sizes the step scratch for the largest step (serve's arena): a model of the
// 27B's widths (3 GDN layers, 1 attention, a small vocabulary, W4A16), its arena exactly that
// bound for 2,048 tokens and 64 logit rows, takes a step of 64 new 16-token prompts (1,024 tokens,
// 64 rows) and one of a 2,048-token prompt. Too small an arena stops the process (DS_FATAL).
TEST(CudaModelScratch, StepScratchBytesHoldsTheLargestStep) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  ModelConfig c;
  c.model_type = "qwen3_5_text";
  c.vocab_size = 4096;
  c.hidden_size = 5120;
  c.intermediate_size = 17408;
  c.layer_types = {LayerType::kLinearAttention, LayerType::kLinearAttention, LayerType::kLinearAttention,
                   LayerType::kFullAttention};
  c.num_hidden_layers = static_cast<int>(c.layer_types.size());
  c.num_attention_heads = 24;
  c.num_key_value_heads = 4;
  c.head_dim = 256;
  c.rope_theta = 1e7;
  c.partial_rotary_factor = 0.25f;
  c.rotary_dim = 64;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 48;
  c.linear_key_head_dim = 128;
  c.linear_value_head_dim = 128;
  c.max_position_embeddings = 4096;
  constexpr int kLong = 2048, kSeqs = 64, kPrompt = 16;
  CudaOpsOptions o;
  o.scratch_bytes = step_scratch_bytes(c, kLong, kSeqs);
  CudaOps ops(o);
  auto m = Qwen35Model::synthetic(c, ops, /*with_mtp=*/false, /*w4a16=*/true, 7);
  ASSERT_TRUE(m.ok()) << m.status().message();
  Runner runner(*m.value(), ops, RunnerOptions{256, 16, kSeqs + 1});
  std::vector<Sequence> seqs(kSeqs);
  std::vector<SeqWork> work;
  for (int i = 0; i < kSeqs; ++i) {
    for (int t = 0; t < kPrompt; ++t) seqs[i].tokens.push_back((i * 31 + t * 7) % c.vocab_size);
    ASSERT_TRUE(runner.admit(seqs[i]).ok());
    work.push_back(SeqWork{&seqs[i], kPrompt, true});
  }
  auto r = runner.step(work);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value().size(), size_t(kSeqs));
  for (Sequence& s : seqs) runner.release(s);
  Sequence longest;
  for (int t = 0; t < kLong; ++t) longest.tokens.push_back((t * 13) % c.vocab_size);
  ASSERT_TRUE(runner.admit(longest).ok());
  r = runner.step({SeqWork{&longest, kLong, true}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (float v : r.value()[0]) ASSERT_TRUE(std::isfinite(v));
  std::cout << "[figure] step scratch peak " << ops.scratch_peak() / 1048576.0 << " MiB of step_scratch_bytes "
            << o.scratch_bytes / 1048576.0 << " MiB\n";
  EXPECT_LE(ops.scratch_peak(), o.scratch_bytes);
}

}  // namespace
}  // namespace ds::test
