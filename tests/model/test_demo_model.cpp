// The bundled demo model (models/qwen3_5-demo, trained by tools/train_demo_model.py) against
// Hugging Face transformers 5.17.0 on two held-out sequences (tests/data/demo_reference, written
// by the same run): logits, greedy continuations up to the first near-tie, and the MTP head.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/fixture.h"

namespace ds::test {
namespace {

// Relative to tests/data, so fixture_dir() and make_engine() take it as a fixture name.
const char* kModel = "../../models/qwen3_5-demo";

struct DemoSeq {
  std::vector<int32_t> prompt_ids, greedy_ids;
  std::vector<float> greedy_margins;
  std::vector<int> logit_rows, mtp_rows;
};

struct DemoRef {
  int vocab = 0;
  std::vector<DemoSeq> seqs;
  NpyArray logits;      // the logit_rows of every sequence, stacked: [sum rows, vocab]
  NpyArray mtp_logits;  // the mtp_rows of every sequence, stacked
};

DemoRef load_demo_reference() {
  DemoRef r;
  const std::string dir = fixture_dir("demo_reference");
  std::ifstream in(dir + "/reference.json");
  EXPECT_TRUE(in.good()) << dir;
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str());
  r.vocab = j["vocab_size"].get<int>();
  for (const auto& s : j["sequences"]) {
    DemoSeq d;
    d.prompt_ids = s["prompt_ids"].get<std::vector<int32_t>>();
    d.greedy_ids = s["greedy_ids"].get<std::vector<int32_t>>();
    d.greedy_margins = s["greedy_margins"].get<std::vector<float>>();
    d.logit_rows = s["logit_rows"].get<std::vector<int>>();
    d.mtp_rows = s["mtp_rows"].get<std::vector<int>>();
    r.seqs.push_back(std::move(d));
  }
  auto logits = read_npy_f32(dir + "/logits.npy");
  EXPECT_TRUE(logits.ok()) << logits.status().message();
  r.logits = std::move(logits.value());
  auto mtp = read_npy_f32(dir + "/mtp_logits.npy");
  EXPECT_TRUE(mtp.ok()) << mtp.status().message();
  r.mtp_logits = std::move(mtp.value());
  return r;
}

// Rows `rows` of a [n, vocab] matrix, concatenated.
std::vector<float> pick_rows(const std::vector<float>& all, int vocab, const std::vector<int>& rows) {
  std::vector<float> out;
  for (int r : rows) out.insert(out.end(), all.begin() + size_t(r) * vocab, all.begin() + size_t(r + 1) * vocab);
  return out;
}

TEST(DemoModel, ReferenceShapes) {
  DemoRef ref = load_demo_reference();
  ASSERT_EQ(ref.seqs.size(), 2u);
  size_t rows = 0, mrows = 0;
  for (const auto& s : ref.seqs) {
    EXPECT_GE(s.prompt_ids.size(), 64u);
    rows += s.logit_rows.size();
    mrows += s.mtp_rows.size();
  }
  ASSERT_EQ(ref.logits.shape, (std::vector<int64_t>{int64_t(rows), ref.vocab}));
  ASSERT_EQ(ref.mtp_logits.shape, (std::vector<int64_t>{int64_t(mrows), ref.vocab}));
  Engine e = make_engine(kModel);
  EXPECT_EQ(e.model->config().vocab_size, ref.vocab);
  EXPECT_TRUE(e.model->has_mtp());
}

TEST(DemoModel, LogitsMatchTransformers) {
  DemoRef ref = load_demo_reference();
  Engine e = make_engine(kModel);
  std::vector<float> ours, theirs = ref.logits.data;
  for (const auto& s : ref.seqs) {
    // Whole prompt in one step, and again in uneven chunks: both must match.
    std::vector<float> all = prefill_logits(e, s.prompt_ids, {static_cast<int>(s.prompt_ids.size())});
    std::vector<float> chunked = prefill_logits(e, s.prompt_ids, {37, 1, 64});
    auto a = pick_rows(all, ref.vocab, s.logit_rows);
    auto c = pick_rows(chunked, ref.vocab, s.logit_rows);
    ours.insert(ours.end(), a.begin(), a.end());
    EXPECT_LE(rel_rms(c, a), 1e-5);
  }
  const double err = max_err_over_std(ours, theirs);
  RecordProperty("max_err_over_std", std::to_string(err));
  EXPECT_LE(err, 1e-4);
}

TEST(DemoModel, GreedyMatchesUpToFirstNearTie) {
  DemoRef ref = load_demo_reference();
  Engine e = make_engine(kModel);
  for (const auto& s : ref.seqs) {
    auto ours = e.runner->generate_greedy(s.prompt_ids, static_cast<int>(s.greedy_ids.size()), 0, {});
    ASSERT_TRUE(ours.ok()) << ours.status().message();
    ASSERT_EQ(ours.value().size(), s.greedy_ids.size());
    size_t checked = 0;
    for (size_t i = 0; i < s.greedy_ids.size(); ++i) {
      if (s.greedy_margins[i] < 0.05f) break;  // transformers itself is at a near-tie here
      EXPECT_EQ(ours.value()[i], s.greedy_ids[i]) << "position " << i;
      ++checked;
    }
    EXPECT_GE(checked, 1u);
  }
}

TEST(DemoModel, MtpLogitsMatchReference) {
  DemoRef ref = load_demo_reference();
  Engine e = make_engine(kModel);
  ASSERT_TRUE(e.model->has_mtp());
  std::vector<float> ours;
  for (const auto& s : ref.seqs) {
    const std::vector<float> rows = mtp_prompt_logits(*e.runner, *e.ops, *e.model, s.prompt_ids, s.mtp_rows);
    ours.insert(ours.end(), rows.begin(), rows.end());
  }
  const double err = max_err_over_std(ours, ref.mtp_logits.data);
  RecordProperty("max_err_over_std", std::to_string(err));
  EXPECT_LE(err, 1e-4);
}

}  // namespace
}  // namespace ds::test
