// Runner: plan building (positions, block tables, logit rows) and greedy generation.
#include "engine/runner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace ds {

Runner::Runner(Qwen35Model& model, Ops& ops, const RunnerOptions& options)
    : model_(model), ops_(ops), options_(options), kv_(options.n_blocks), slots_(options.n_slots) {
  ops_.alloc_caches(model_.cache_geometry(options.n_blocks, options.block_size, options.n_slots));
}

Status Runner::admit(Sequence& seq) {
  DS_ASSERT(seq.state_slot < 0, "sequence admitted twice");
  seq.state_slot = slots_.allocate();
  if (seq.state_slot < 0)
    return Status(ErrorCode::kResourceExhausted, "all " + std::to_string(slots_.n_slots()) + " state slots are in use");
  seq.n_cached = 0;
  return Status();
}

void Runner::release(Sequence& seq) {
  if (seq.state_slot >= 0) slots_.release(seq.state_slot);
  seq.state_slot = -1;
  kv_.release(seq.blocks);
  seq.n_cached = 0;
}

Result<StepPlan> Runner::plan_step(const std::vector<SeqWork>& work) {
  StepPlan plan;
  plan.cu_seqlens.push_back(0);
  int max_blocks = 1;
  for (const SeqWork& w : work) {
    Sequence& s = *w.seq;
    DS_ASSERT(s.state_slot >= 0, "sequence not admitted");
    DS_ASSERT(w.n_tokens >= 1 && s.n_cached + w.n_tokens <= static_cast<int>(s.tokens.size()),
              "work of %d tokens from %d of %zu", w.n_tokens, s.n_cached, s.tokens.size());
    const int n_ctx = s.n_cached + w.n_tokens;
    if (n_ctx > max_context())
      return out_of_range("sequence of " + std::to_string(n_ctx) + " tokens exceeds the context of " +
                          std::to_string(max_context()));
    const int need = (n_ctx + options_.block_size - 1) / options_.block_size - static_cast<int>(s.blocks.size());
    if (need > 0 && !kv_.allocate(need, s.blocks))
      return Status(ErrorCode::kResourceExhausted, "KV cache full: " + std::to_string(need) + " blocks needed, " +
                                                       std::to_string(kv_.n_free()) + " free");
    max_blocks = std::max(max_blocks, static_cast<int>(s.blocks.size()));
    const int row0 = plan.n_tokens();
    for (int i = 0; i < w.n_tokens; ++i) {
      plan.token_ids.push_back(s.tokens[s.n_cached + i]);
      plan.positions.push_back(s.n_cached + i);
      if (w.all_logits || i == w.n_tokens - 1) plan.logit_rows.push_back(row0 + i);
    }
    plan.cu_seqlens.push_back(plan.n_tokens());
    plan.n_past.push_back(s.n_cached);
    plan.state_slots.push_back(s.state_slot);
  }
  plan.max_blocks = max_blocks;
  plan.block_tables.assign(size_t(work.size()) * max_blocks, -1);
  for (size_t i = 0; i < work.size(); ++i)
    std::copy(work[i].seq->blocks.begin(), work[i].seq->blocks.end(), plan.block_tables.begin() + i * max_blocks);
  return plan;
}

Result<std::vector<std::vector<float>>> Runner::step(const std::vector<SeqWork>& work) {
  DS_ASSIGN_OR_RETURN(StepPlan plan, plan_step(work));
  ops_.reset_scratch();
  Tensor logits = model_.forward(plan);
  const int64_t V = model_.config().vocab_size;
  std::vector<float> all(static_cast<size_t>(logits.numel()));
  ops_.download_f32(logits, all.data());
  std::vector<std::vector<float>> out;
  size_t row = 0;
  for (const SeqWork& w : work) {
    const size_t rows = w.all_logits ? w.n_tokens : 1;
    out.emplace_back(all.begin() + row * V, all.begin() + (row + rows) * V);
    row += rows;
    w.seq->n_cached += w.n_tokens;
  }
  return out;
}

Result<StepSamples> Runner::step_and_sample(const std::vector<SeqWork>& work, const std::vector<SampleJob>& jobs) {
  DS_ASSERT(jobs.size() == work.size(), "one sample job per work item");
  static const bool force_cpu = [] {
    const char* env = std::getenv("DS_CPU_SAMPLER");  // env: DS_CPU_SAMPLER=1: host sampling (A/B)
    return env && std::strcmp(env, "0") != 0;
  }();
  DS_ASSIGN_OR_RETURN(StepPlan plan, plan_step(work));
  const auto t0 = std::chrono::steady_clock::now();
  ops_.reset_scratch();
  Tensor logits = model_.forward(plan);  // act [n_out, V]
  const int64_t V = model_.config().vocab_size;
  StepSamples out;
  out.samples.resize(work.size());
  std::vector<SampleRowSpec> specs;
  std::vector<size_t> spec_item;
  std::vector<size_t> host_items;
  int64_t row = 0;
  std::vector<int64_t> last_row(work.size());
  for (size_t i = 0; i < work.size(); ++i) {
    row += work[i].all_logits ? work[i].n_tokens : 1;
    last_row[i] = row - 1;
    if (!jobs[i].sampler) continue;
    std::optional<SampleRowSpec> spec;
    if (!force_cpu && !jobs[i].constraint && ops_.supports_sample()) spec = jobs[i].sampler->device_spec(jobs[i].prompt, jobs[i].generated);
    if (!spec) {
      host_items.push_back(i);
      continue;
    }
    spec->row = static_cast<int32_t>(last_row[i]);
    specs.push_back(std::move(*spec));
    spec_item.push_back(i);
  }
  if (!specs.empty()) {
    std::vector<SampledToken> tokens(specs.size());
    ops_.sample(logits, specs, tokens.data());
    for (size_t j = 0; j < specs.size(); ++j)
      out.samples[spec_item[j]] = jobs[spec_item[j]].sampler->from_device(tokens[j]);
  }
  if (host_items.size() == 1) {  // one row: copy just it
    std::vector<float> host_row(static_cast<size_t>(V));
    const size_t i = host_items[0];
    ops_.download_f32(logits.rows(last_row[i], 1), host_row.data());
    out.samples[i] = jobs[i].sampler->sample(host_row, jobs[i].prompt, jobs[i].generated, jobs[i].constraint);
  } else if (!host_items.empty()) {  // the whole [n_out, V] in one copy
    std::vector<float> all(static_cast<size_t>(logits.numel()));
    ops_.download_f32(logits, all.data());
    for (size_t i : host_items)
      out.samples[i] = jobs[i].sampler->sample(std::span<const float>(all).subspan(last_row[i] * V, V),
                                               jobs[i].prompt, jobs[i].generated, jobs[i].constraint);
  }
  ops_.synchronize();
  out.model_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const SeqWork& w : work) w.seq->n_cached += w.n_tokens;
  return out;
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

Result<std::vector<int32_t>> Runner::generate_greedy(const std::vector<int32_t>& prompt, int max_tokens,
                                                     int prefill_chunk, const std::vector<int>& stop_ids) {
  if (prompt.empty()) return invalid_argument("the prompt is empty");
  const int V = model_.config().vocab_size;
  for (int32_t id : prompt)
    if (id < 0 || id >= V)
      return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  if (static_cast<int>(prompt.size()) + max_tokens > max_context())
    return out_of_range("prompt of " + std::to_string(prompt.size()) + " tokens plus " + std::to_string(max_tokens) +
                        " new tokens exceeds the context of " + std::to_string(max_context()));
  Sequence seq;
  seq.tokens = prompt;
  DS_RETURN_IF_ERROR(admit(seq));
  std::vector<int32_t> generated;
  std::vector<float> last;
  Status status;
  while (seq.n_cached < static_cast<int>(seq.tokens.size())) {  // prefill
    const int left = static_cast<int>(seq.tokens.size()) - seq.n_cached;
    auto r = step({SeqWork{&seq, prefill_chunk > 0 ? std::min(prefill_chunk, left) : left, false}});
    if (!r.ok()) {
      status = r.status();
      break;
    }
    last = std::move(r.value()[0]);
  }
  while (status.ok() && static_cast<int>(generated.size()) < max_tokens) {
    const int32_t next = argmax(last.data(), V);
    generated.push_back(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
    if (static_cast<int>(generated.size()) == max_tokens) break;
    seq.tokens.push_back(next);
    auto r = step({SeqWork{&seq, 1, false}});
    if (!r.ok()) {
      status = r.status();
      break;
    }
    last = std::move(r.value()[0]);
  }
  release(seq);
  if (!status.ok()) return status;
  return generated;
}

}  // namespace ds
