// bench serve: a load generator for any OpenAI-compatible server. Seeded prompts (random
// words, or random token ids with --prompt-vocab, or a JSONL dataset), streaming
// /v1/completions at each concurrency; throughput and TTFT/TPOT/ITL percentiles as JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ds::server {

struct BenchServeOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model;
  std::string api_key;
  std::vector<int> concurrency = {1, 8, 64};
  int num_prompts = 64;        // per concurrency level
  int input_len = 128;         // words (or token ids with prompt_vocab)
  int output_len = 128;        // max_tokens, with ignore_eos
  uint64_t seed = 0;
  int prompt_vocab = 0;        // > 0: prompts are random token ids in [0, prompt_vocab)
  std::string dataset;         // JSONL with {"prompt": "..."} per line (overrides generated prompts)
  double timeout_s = 600;
  // Sampling sent with every request (temperature 0: greedy); top_k is sent only when > 0.
  double temperature = 0.0;
  double top_p = 1.0;
  int top_k = 0;
};

// Runs every concurrency level; returns the JSON report (also what is printed).
Result<std::string> bench_serve(const BenchServeOptions& o);

}  // namespace ds::server
