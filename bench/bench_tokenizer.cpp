// Encode throughput of ds_tokenizer on one thread over JSONL documents (one JSON string per
// line), printed as one JSON line comparable to `make_tokenizer_reference.py --bench`.
//   bench_tokenizer TOKENIZER_DIR DOCS.jsonl [REPS]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_DIR DOCS.jsonl [REPS]\n", argv[0]);
    return 2;
  }
  int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  auto tok = ds::tok::Tokenizer::load_dir(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "error: %s\n", tok.status().message().c_str());
    return 1;
  }
  std::ifstream f(argv[2]);
  std::vector<std::string> docs;
  size_t n_bytes = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    docs.push_back(nlohmann::json::parse(line).get<std::string>());
    n_bytes += docs.back().size();
  }
  double best = 1e30, first = 0;
  size_t n_tok = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    n_tok = 0;
    for (const auto& d : docs) n_tok += tok.value()->encode(d).value().size();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0) first = dt;
    best = std::min(best, dt);
  }
  std::printf("{\"impl\": \"deltaserve ds_tokenizer\", \"bytes\": %zu, \"tokens\": %zu, \"chunks\": %zu, "
              "\"first_s\": %.6f, \"best_s\": %.6f, \"MB_per_s\": %.3f, \"tokens_per_s\": %.0f}\n",
              n_bytes, n_tok, docs.size(), first, best, n_bytes / best / 1e6, n_tok / best);
  return 0;
}
