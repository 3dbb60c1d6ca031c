// Runner: turns per-sequence work into StepPlans, owns the block/slot bookkeeping and runs
// the model through a backend. One thread; the scheduler (later) sits on top of it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cache/kv_block_pool.h"
#include "cache/state_slots.h"
#include "core/status.h"
#include "engine/sampler.h"
#include "engine/seq_pools.h"
#include "model/qwen3_5.h"

namespace ds {

// One sequence's residency in the caches.
struct Sequence {
  std::vector<int32_t> tokens;  // every known token: prompt, then generated
  int n_cached = 0;             // leading tokens whose KV and GDN state are in the caches
  std::vector<int32_t> blocks;  // KV block ids, in order
  int state_slot = -1;
};

// Feed tokens[n_cached, n_cached + n_tokens) of `seq` in this step.
struct SeqWork {
  Sequence* seq = nullptr;
  int n_tokens = 0;
  bool all_logits = false;  // logits of every fed row, else of the last one only
};

// The engine's draw for one work item: from its last logit row, once the step has run.
struct SampleJob {
  Sampler* sampler = nullptr;              // null: no draw (the sequence is still in prefill)
  std::span<const int32_t> prompt, generated;  // the request's tokens (penalties)
  const TokenConstraint* constraint = nullptr;  // output rules: sampled on the host (mask and redraw)
};

// step_and_sample's answer: one draw per job with a sampler, and the seconds the model
// forward and the sampling took, device work included (the engine's overhead metric).
struct StepSamples {
  std::vector<std::optional<SampleOutput>> samples;  // [work.size()]
  double model_seconds = 0.0;
};

struct RunnerOptions {
  int n_blocks = 256;   // KV blocks per layer
  int block_size = 16;  // tokens per block
  int n_slots = 8;      // concurrent sequences (GDN state slots)
};

class Runner : public SeqPools {
 public:
  Runner(Qwen35Model& model, Ops& ops, const RunnerOptions& options);

  Qwen35Model& model() { return model_; }
  Ops& ops() { return ops_; }
  int max_context() const { return options_.n_blocks * options_.block_size; }

  Status admit(Sequence& seq) override;   // takes a state slot
  void release(Sequence& seq) override;   // frees its slot and blocks

  // Pool counts for the scheduler (SeqPools).
  int block_size() const override { return options_.block_size; }
  int n_blocks() const override { return kv_.n_blocks(); }
  int n_free_blocks() const override { return kv_.n_free(); }
  int n_slots() const override { return slots_.n_slots(); }
  int n_free_slots() const override { return slots_.n_free(); }

  // Builds the plan of one varlen step, taking KV blocks as needed.
  Result<StepPlan> plan_step(const std::vector<SeqWork>& work);
  // Runs one step; returns fp32 logits per work item, [rows, vocab] flattened.
  Result<std::vector<std::vector<float>>> step(const std::vector<SeqWork>& work);
  // Runs one step and draws a token for every job with a sampler: on the device when the
  // backend has a sampler (only tokens and logprobs come back), on the host from downloaded
  // logits for rows the device cannot do. env: DS_CPU_SAMPLER=1 forces the host path (A/B).
  Result<StepSamples> step_and_sample(const std::vector<SeqWork>& work, const std::vector<SampleJob>& jobs);

  // Greedy decoding of one sequence: prefill in chunks of `prefill_chunk` tokens (<= 0: all
  // at once), then up to max_tokens new tokens, stopping after any of stop_ids.
  Result<std::vector<int32_t>> generate_greedy(const std::vector<int32_t>& prompt, int max_tokens, int prefill_chunk,
                                               const std::vector<int>& stop_ids);

 private:
  Qwen35Model& model_;
  Ops& ops_;
  RunnerOptions options_;
  KvBlockPool kv_;
  StateSlots slots_;
};

// Index of the largest value (the first one on ties, as torch.argmax).
int32_t argmax(const float* x, int64_t n);

}  // namespace ds
