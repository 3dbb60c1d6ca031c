// Sampler: picks the next token of one request from its fp32 logits on the CPU: penalties,
// logit bias, temperature, top-k, top-p, min-p, a per-request seeded generator, logprobs, and
// an optional TokenConstraint (mask-and-redraw). Knows nothing of HTTP or JSON. The device
// sampler (Ops::sample) follows the same semantics for unconstrained requests; device_spec()
// turns a request's state into its per-row spec.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "ops/sampling.h"
#include "engine/token_constraint.h"

namespace ds {

struct SamplingParams {
  float temperature = 1.0f;         // <= 0: greedy
  float top_p = 1.0f;               // (0, 1]
  int top_k = 0;                    // <= 0: off
  float min_p = 0.0f;               // [0, 1]; drops tokens below min_p * p(max)
  float presence_penalty = 0.0f;    // OpenAI: subtracted once from tokens already generated
  float frequency_penalty = 0.0f;   // OpenAI: subtracted per occurrence in the generated tokens
  float repetition_penalty = 1.0f;  // HF/vLLM: divides positive (multiplies negative) logits of prompt+generated tokens
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the raw logits
  bool has_seed = false;
  uint64_t seed = 0;
  int n_logprobs = -1;  // -1: none; 0..20: the sampled token's logprob and this many alternatives
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct SampleOutput {
  int32_t token = -1;
  float logprob = 0.0f;            // of `token` under the raw model distribution (n_logprobs >= 0)
  std::vector<TokenLogprob> top;   // [n_logprobs] most likely raw tokens, best first
};

// One per request: holds the request's generator, so draws continue across steps (and across
// a preemption, which only recomputes the cache) and are reproducible for a given seed.
class Sampler {
 public:
  // `fallback_seed` is used when params.has_seed is false.
  Sampler(const SamplingParams& params, uint64_t fallback_seed);

  // logits: f32 [vocab]. prompt/generated: the request's tokens so far (for penalties).
  // constraint: when given, the token is one it allows, drawn from the processed distribution
  // with the refused tokens masked; token -1 when it allows none.
  SampleOutput sample(std::span<const float> logits, std::span<const int32_t> prompt,
                      std::span<const int32_t> generated, const TokenConstraint* constraint = nullptr);

  // The spec of this request's next draw on a device sampler (logit bias and penalties become
  // per-token edits), or nullopt when the device cannot do it (more than kMaxTopLogprobs
  // logprobs). Each call takes a new draw number: device draws are a pure function of
  // (seed, draw number), reproducible for a seed but not equal to this class's host draws.
  std::optional<SampleRowSpec> device_spec(std::span<const int32_t> prompt, std::span<const int32_t> generated);
  // The device's answer as sample() gives it.
  SampleOutput from_device(const SampledToken& t) const;

  const SamplingParams& params() const { return params_; }

 private:
  double uniform();  // [0, 1) from 53 random bits (std distributions differ between libraries)
  int32_t pick(const float* w, int64_t V);  // greedy or one draw from processed logits w; -1 if all are -inf

  SamplingParams params_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  uint64_t device_draws_ = 0;
  std::vector<float> work_;           // f32 [vocab] processed logits
  std::vector<int32_t> candidates_;   // token ids still in the support
};

}  // namespace ds
