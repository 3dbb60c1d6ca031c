// Scheduler: continuous batching over the Runner's fixed pools. Each step it picks the work
// of running sequences (decodes first, then prefill chunks) under a token budget, admits
// waiting sequences while blocks and slots allow, and preempts by recompute (the newest
// running sequence gives back its blocks and slot and later re-prefills prompt + generated
// tokens) when the KV pool runs dry. Holds indices and pointers only: no JSON, no device code.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/runner.h"
#include "engine/seq_pools.h"

namespace ds {

// What the scheduler tracks of one request; the engine's request embeds it.
struct SchedSeq {
  Sequence seq;           // tokens = prompt + generated so far
  uint64_t arrival = 0;   // FCFS order: smaller is older and keeps its place under pressure
  bool running = false;   // holds a state slot
  int n_preemptions = 0;
};

// The default token budget of one step (chunked prefill + decodes), which the engine's and serve's
// options take too. 1024 against 256 on the 27B shape at --gpu-memory 24 (H100, 512-token
// prompts, 128 out): C64 1,047 against 517 output tok/s, TTFT p50 0.48 against 3.29 s, TPOT p50
// 56 against 100 ms; C8 638 against 471; C1 142 against 132; the KV pool 47,760 against 51,024
// tokens, as the step scratch grows with the budget. 2048: C64 1,188, KV pool 43,376
// (docs/perf/2026-12-05-s61-cuda-27b.md).
constexpr int kDefaultMaxStepTokens = 1024;

struct SchedulerOptions {
  int max_num_seqs = 64;                         // running sequences at once (<= the pool's state slots)
  int max_step_tokens = kDefaultMaxStepTokens;  // token budget of one step: decodes + prefill chunks
};

struct ScheduleOutput {
  std::vector<SchedSeq*> seqs;  // [n_work] in the order of `work`
  std::vector<SeqWork> work;    // [n_work] tokens to feed per sequence this step
  int n_preempted = 0;          // sequences preempted while planning this step
};

class Scheduler {
 public:
  Scheduler(SeqPools& pools, const SchedulerOptions& options);

  void add(SchedSeq* s);      // joins the waiting queue (in arrival order)
  void remove(SchedSeq* s);   // finished or cancelled: leaves the queues, frees its slot and blocks
  ScheduleOutput schedule();  // the next step's work (empty only when nothing is queued)

  int n_running() const { return static_cast<int>(running_.size()); }
  int n_waiting() const { return static_cast<int>(waiting_.size()); }
  bool idle() const { return running_.empty() && waiting_.empty(); }
  const SchedulerOptions& options() const { return options_; }

 private:
  int blocks_needed(const SchedSeq& s, int n_tokens) const;
  void preempt(SchedSeq* s);
  void insert_waiting(SchedSeq* s);

  SeqPools& pools_;
  SchedulerOptions options_;
  std::vector<SchedSeq*> running_;  // arrival order
  std::deque<SchedSeq*> waiting_;   // arrival order (preempted ones go back to their place)
};

}  // namespace ds
