// `bench serve`: the load generator (src/server/bench_serve.h) from the command line. The
// JSON report goes to stdout (and to --out when given).
#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "server/bench_serve.h"

namespace ds {

void register_bench_commands(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto o = std::make_shared<server::BenchServeOptions>();
  auto out = std::make_shared<std::string>();
  CLI::App* s = bench->add_subcommand("serve", "load-test an OpenAI-compatible server: throughput, TTFT/TPOT/ITL percentiles");
  s->add_option("--url", o->url, "server base URL")->capture_default_str();
  s->add_option("--model", o->model, "model id to request")->required();
  s->add_option("--api-key", o->api_key, "bearer token (env OPENAI_API_KEY)")->envname("OPENAI_API_KEY");
  s->add_option("--concurrency", o->concurrency, "concurrency levels, e.g. 1,8,64")->delimiter(',')->capture_default_str();
  s->add_option("--num-prompts", o->num_prompts, "requests per concurrency level")->capture_default_str();
  s->add_option("--input-len", o->input_len, "prompt length in words (token ids with --prompt-vocab)")->capture_default_str();
  s->add_option("--output-len", o->output_len, "max_tokens per request (ignore_eos)")->capture_default_str();
  s->add_option("--seed", o->seed, "prompt generator seed")->capture_default_str();
  s->add_option("--prompt-vocab", o->prompt_vocab, "send random token-id prompts from [0, N) instead of words");
  s->add_option("--dataset", o->dataset, "JSONL file with {\"prompt\": ...} per line");
  s->add_option("--timeout", o->timeout_s, "per-request timeout in seconds")->capture_default_str();
  s->add_option("--temperature", o->temperature, "sampling temperature of every request (0: greedy)")->capture_default_str();
  s->add_option("--top-p", o->top_p, "top_p of every request")->capture_default_str();
  s->add_option("--top-k", o->top_k, "top_k of every request (sent when > 0)")->capture_default_str();
  s->add_option("--out", *out, "also write the JSON report here");
  s->callback([o, out] {
    auto r = server::bench_serve(*o);
    if (!r.ok()) cli_fail(r.status().message());
    std::printf("%s\n", r.value().c_str());
    if (!out->empty()) std::ofstream(*out) << r.value() << "\n";
  });
}

}  // namespace ds
