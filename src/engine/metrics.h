// Engine metrics as plain numbers (the server renders them as Prometheus text): gauges of
// the queues and pools, token and event counters, TTFT/TPOT histograms.
#pragma once

#include <cstdint>
#include <vector>

namespace ds {

struct Histogram {
  std::vector<double> bounds;    // [n] upper bounds in seconds, ascending (+Inf implied)
  std::vector<uint64_t> counts;  // [n + 1] per bucket (not cumulative)
  double sum = 0.0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v) {
    size_t i = 0;
    while (i < bounds.size() && v > bounds[i]) ++i;
    ++counts[i];
    sum += v;
    ++count;
  }
};

struct EngineMetrics {
  int n_running = 0;
  int n_waiting = 0;
  uint64_t prompt_tokens_total = 0;      // prompt tokens of admitted requests (counted once)
  uint64_t generation_tokens_total = 0;
  uint64_t preemptions_total = 0;
  uint64_t requests_finished_total[6] = {};  // by FinishReason (engine.h)
  uint64_t steps_total = 0;
  // Per engine step: the whole loop iteration (draining, scheduling, planning, the model,
  // pushing tokens to the streams) and, within it, the model forward + sampling with the
  // device synchronised. 1 - forward / step is the engine thread's own overhead.
  double step_seconds_total = 0.0;
  double forward_seconds_total = 0.0;
  int kv_blocks_total = 0, kv_blocks_used = 0;
  int state_slots_total = 0, state_slots_used = 0;
  Histogram ttft{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram tpot{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
};

}  // namespace ds
