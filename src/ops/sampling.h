// Device sampling contract: what Ops::sample gets per logit row and what comes back. Plain
// data; the semantics are engine/sampler.h's (bias, penalties, temperature, top-k, top-p,
// min-p), with penalties and bias arriving as per-token edits the host computes.
#pragma once

#include <cstdint>
#include <vector>

namespace ds {

constexpr int kMaxTopLogprobs = 20;

// One token's logit edit, applied in the CPU sampler's order:
// w += bias; then w = w > 0 ? w / repetition : w * repetition; then w -= subtract.
// Neutral values (0, 1, 0) leave w unchanged.
struct LogitEdit {
  int32_t token = 0;
  float bias = 0.0f;
  float repetition = 1.0f;
  float subtract = 0.0f;  // presence + frequency * count, computed on the host as the CPU sampler does
};

struct SampleRowSpec {
  int32_t row = 0;           // logits row
  float temperature = 1.0f;  // <= 0 (or top_k == 1): greedy argmax
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  int32_t n_logprobs = -1;   // -1: none; 0..kMaxTopLogprobs
  // The draw's uniform number is a pure function of (seed, draw): reproducible for a given
  // seed and independent of which other rows share the step.
  uint64_t seed = 0;
  uint64_t draw = 0;
  std::vector<LogitEdit> edits;  // at most one per token
};

// What comes back per row (POD: copied from the device as it is).
struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;  // raw log-softmax of `token` (n_logprobs >= 0)
  int32_t n_top = 0;
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};  // raw log-softmax, best first (ties: lower id first)
};

}  // namespace ds
