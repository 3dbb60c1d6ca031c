// Sampler: logits processing in the order vLLM applies it (bias, penalties, temperature, then
// top-k / top-p / min-p truncation) and one seeded draw. Logprobs come from the raw logits.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace ds {

Sampler::Sampler(const SamplingParams& params, uint64_t fallback_seed)
    : params_(params), seed_(params.has_seed ? params.seed : fallback_seed), rng_(seed_) {}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0); }

namespace {

// log-softmax of x at every index needed: returns the log normaliser.
double log_sum_exp(std::span<const float> x) {
  float mx = -std::numeric_limits<float>::infinity();
  for (float v : x) mx = std::max(mx, v);
  double s = 0.0;
  for (float v : x) s += std::exp(static_cast<double>(v - mx));
  return mx + std::log(s);
}

}  // namespace

int32_t Sampler::pick(const float* w, int64_t V) {
  const float kMasked = -std::numeric_limits<float>::infinity();
  const bool greedy = params_.temperature <= 0.0f || params_.top_k == 1;
  if (greedy) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (w[i] > w[best]) best = i;  // first index on ties, as torch.argmax
    return w[best] == kMasked ? -1 : static_cast<int32_t>(best);
  } else {
    const float inv_t = 1.0f / params_.temperature;
    candidates_.clear();
    for (int64_t i = 0; i < V; ++i)
      if (w[i] != kMasked) candidates_.push_back(static_cast<int32_t>(i));
    if (candidates_.empty()) return -1;
    const int64_t n_live = static_cast<int64_t>(candidates_.size());
    auto by_logit = [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
    size_t n = candidates_.size();
    if (params_.top_k > 0 && static_cast<int64_t>(params_.top_k) < n_live) {
      n = static_cast<size_t>(params_.top_k);
      std::nth_element(candidates_.begin(), candidates_.begin() + (n - 1), candidates_.end(), by_logit);
      candidates_.resize(n);
    }
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
    // probabilities over the support, in descending order
    std::vector<double> p(n);
    const double mx = static_cast<double>(w[candidates_[0]]) * inv_t;
    double z = 0.0;
    for (size_t i = 0; i < n; ++i) z += (p[i] = std::exp(static_cast<double>(w[candidates_[i]]) * inv_t - mx));
    for (double& v : p) v /= z;
    size_t keep = n;
    if (params_.top_p < 1.0f) {
      double cum = 0.0;
      for (size_t i = 0; i < n; ++i) {
        cum += p[i];
        if (cum >= params_.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    if (params_.min_p > 0.0f) {
      const double floor_p = params_.min_p * p[0];
      size_t k = 1;
      while (k < keep && p[k] >= floor_p) ++k;
      keep = k;
    }
    double total = 0.0;
    for (size_t i = 0; i < keep; ++i) total += p[i];
    const double u = uniform() * total;
    double cum = 0.0;
    size_t pick = keep - 1;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i];
      if (u < cum) {
        pick = i;
        break;
      }
    }
    return candidates_[pick];
  }
}

SampleOutput Sampler::sample(std::span<const float> logits, std::span<const int32_t> prompt,
                             std::span<const int32_t> generated, const TokenConstraint* constraint) {
  const int64_t V = static_cast<int64_t>(logits.size());
  SampleOutput out;
  work_.assign(logits.begin(), logits.end());
  float* w = work_.data();

  for (const auto& [id, bias] : params_.logit_bias)
    if (id >= 0 && id < V) w[id] += bias;
  if (params_.repetition_penalty != 1.0f) {
    std::vector<bool> seen(V, false);
    auto mark = [&](int32_t t) {
      if (t >= 0 && t < V) seen[t] = true;
    };
    for (int32_t t : prompt) mark(t);
    for (int32_t t : generated) mark(t);
    for (int64_t i = 0; i < V; ++i)
      if (seen[i]) w[i] = w[i] > 0 ? w[i] / params_.repetition_penalty : w[i] * params_.repetition_penalty;
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : generated) ++counts[t];
    for (const auto& [t, c] : counts)
      if (t >= 0 && t < V) w[t] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(c);
  }

  if (!constraint) {
    out.token = pick(w, V);
  } else if (constraint->only() >= 0) {
    out.token = constraint->only();
  } else {
    // Lazy masking: most draws are allowed, so test the drawn token and redraw with it masked;
    // after a few refusals mask the whole vocabulary once (exact, but costs V checks).
    constexpr int kLazyDraws = 8;
    const float kMasked = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < kLazyDraws && out.token < 0; ++i) {
      const int32_t t = pick(w, V);
      if (t < 0) break;
      if (constraint->allows(t)) out.token = t;
      else w[t] = kMasked;
    }
    if (out.token < 0) {
      for (int64_t i = 0; i < V; ++i)
        if (w[i] != kMasked && !constraint->allows(static_cast<int32_t>(i))) w[i] = kMasked;
      out.token = pick(w, V);
    }
    if (out.token < 0) return out;
  }

  if (params_.n_logprobs >= 0) {
    const double lse = log_sum_exp(logits);
    out.logprob = static_cast<float>(logits[out.token] - lse);
    const int64_t k = std::min<int64_t>(params_.n_logprobs, V);
    if (k > 0) {
      std::vector<int32_t> idx(V);
      for (int64_t i = 0; i < V; ++i) idx[i] = static_cast<int32_t>(i);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
      for (int64_t i = 0; i < k; ++i) out.top.push_back({idx[i], static_cast<float>(logits[idx[i]] - lse)});
    }
  }
  return out;
}

std::optional<SampleRowSpec> Sampler::device_spec(std::span<const int32_t> prompt,
                                                  std::span<const int32_t> generated) {
  if (params_.n_logprobs > kMaxTopLogprobs) return std::nullopt;
  SampleRowSpec spec;
  spec.temperature = params_.temperature;
  spec.top_p = params_.top_p;
  spec.top_k = params_.top_k;
  spec.min_p = params_.min_p;
  spec.n_logprobs = params_.n_logprobs;
  spec.seed = seed_;
  spec.draw = device_draws_++;
  // One edit per touched token, with the values sample() would use (same float arithmetic).
  std::unordered_map<int32_t, size_t> at;
  auto edit = [&](int32_t t) -> LogitEdit& {
    auto [it, fresh] = at.emplace(t, spec.edits.size());
    if (fresh) spec.edits.push_back(LogitEdit{t, 0.0f, 1.0f, 0.0f});
    return spec.edits[it->second];
  };
  for (const auto& [id, bias] : params_.logit_bias) edit(id).bias += bias;
  if (params_.repetition_penalty != 1.0f) {
    for (int32_t t : prompt) edit(t).repetition = params_.repetition_penalty;
    for (int32_t t : generated) edit(t).repetition = params_.repetition_penalty;
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : generated) ++counts[t];
    for (const auto& [t, c] : counts)
      edit(t).subtract = params_.presence_penalty + params_.frequency_penalty * static_cast<float>(c);
  }
  return spec;
}

SampleOutput Sampler::from_device(const SampledToken& t) const {
  SampleOutput out;
  out.token = t.token;
  out.logprob = t.logprob;
  for (int i = 0; i < t.n_top; ++i) out.top.push_back({t.top_ids[i], t.top_logprobs[i]});
  return out;
}

}  // namespace ds
