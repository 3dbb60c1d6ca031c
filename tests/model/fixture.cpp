// Fixture loading and the shared parity metric.
#include "model/fixture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_data_dir.h"

namespace ds::test {

std::string fixture_dir(const std::string& name) {
  if (!name.empty() && name.front() == '/') return name;  // a folder of a test's own (a modified copy)
  return test_data_dir() + "/" + name;
}

const std::vector<std::string>& fixture_names() {
  static const std::vector<std::string> names = {"tiny_wrapper_mtp", "tiny_causal_sharded", "tiny_wrapper_long",
                                                 "tiny_w4a16"};
  return names;
}

Reference load_reference(const std::string& name) {
  Reference r;
  std::ifstream in(fixture_dir(name) + "/reference.json");
  EXPECT_TRUE(in.good()) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str());
  r.prompt_ids = j["prompt_ids"].get<std::vector<int32_t>>();
  r.greedy_ids = j["greedy_ids"].get<std::vector<int32_t>>();
  r.greedy_margins = j["greedy_margins"].get<std::vector<float>>();
  auto logits = read_npy_f32(fixture_dir(name) + "/logits.npy");
  EXPECT_TRUE(logits.ok()) << logits.status().message();
  r.logits = std::move(logits.value());
  auto mtp = read_npy_f32(fixture_dir(name) + "/mtp_logits.npy");
  if (mtp.ok()) r.mtp_logits = std::move(mtp.value());
  return r;
}

Engine make_engine(const std::string& name, int n_slots, int n_blocks, int block_size, bool bf16_activations,
                   bool int8_vocab, ActInt8Layers a8) {
  Engine e;
  auto ck = Checkpoint::open(fixture_dir(name));
  EXPECT_TRUE(ck.ok()) << ck.status().message();
  e.ck = std::move(ck.value());
  e.ops = std::make_unique<CpuOps>(bf16_activations);
  e.ops->set_int8_vocab(int8_vocab);
  auto model = Qwen35Model::load(*e.ck, *e.ops, a8);
  EXPECT_TRUE(model.ok()) << model.status().message();
  e.model = std::move(model.value());
  e.runner = std::make_unique<Runner>(*e.model, *e.ops, RunnerOptions{n_blocks, block_size, n_slots});
  return e;
}

double max_err_over_std(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double mean = 0, var = 0, max_err = 0;
  for (float x : b) mean += x;
  mean /= b.size();
  for (float x : b) var += (x - mean) * (x - mean);
  const double std = std::sqrt(var / b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    max_err = std::max(max_err, std::abs(double(a[i]) - double(b[i])));
  }
  return max_err / std;
}

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> mtp_prompt_logits(Runner& runner, Ops& ops, Qwen35Model& model, const std::vector<int32_t>& ids,
                                     const std::vector<int>& rows) {
  const int n = static_cast<int>(ids.size());
  Sequence seq;
  seq.tokens = ids;
  EXPECT_TRUE(runner.admit(seq).ok());
  auto plan = runner.plan_step({SeqWork{&seq, n, false}});
  EXPECT_TRUE(plan.ok());
  ops.reset_scratch();
  Tensor hidden;
  model.forward(plan.value(), &hidden);
  StepPlan mtp = plan.value();
  mtp.token_ids.assign(ids.begin() + 1, ids.end());
  mtp.positions.resize(n - 1);
  mtp.cu_seqlens = {0, n - 1};
  mtp.logit_rows.assign(rows.begin(), rows.end());
  Tensor logits = model.forward_mtp(mtp, hidden.rows(0, n - 1));
  std::vector<float> out(logits.numel());
  ops.download_f32(logits, out.data());
  runner.release(seq);
  return out;
}

std::vector<float> prefill_logits(Engine& e, const std::vector<int32_t>& ids, const std::vector<int>& chunks) {
  Sequence seq;
  seq.tokens = ids;
  EXPECT_TRUE(e.runner->admit(seq).ok());
  std::vector<float> out;
  const int n = static_cast<int>(ids.size());
  for (size_t c = 0; seq.n_cached < n; ++c) {
    const int take = std::min(chunks[c % chunks.size()], n - seq.n_cached);
    auto r = e.runner->step({SeqWork{&seq, take, true}});
    EXPECT_TRUE(r.ok()) << r.status().message();
    out.insert(out.end(), r.value()[0].begin(), r.value()[0].end());
  }
  e.runner->release(seq);
  return out;
}

}  // namespace ds::test
