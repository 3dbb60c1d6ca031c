// `logits` and `generate`: load a checkpoint folder, run the model on given token ids.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/log.h"
#include "engine/backend_factory.h"
#include "engine/runner.h"
#include "io/checkpoint.h"
#include "io/npy.h"

namespace ds {

namespace {

struct ModelArgs {
  std::string model_dir;
  std::string ids_text;
  std::string device = "auto";
  int chunk = 0;
};



#ifndef DS_DEFAULT_MODEL_DIR
#define DS_DEFAULT_MODEL_DIR "models/qwen3_5-demo"
#endif

void add_model_options(CLI::App* sub, ModelArgs& a) {
  // Without --model: $DS_MODEL if set, else the bundled demo model (models/qwen3_5-demo).
  const char* env = std::getenv("DS_MODEL");
  a.model_dir = env != nullptr && *env != '\0' ? env : DS_DEFAULT_MODEL_DIR;
  sub->add_option("--model", a.model_dir,
                  "checkpoint folder (config.json + safetensors); default: $DS_MODEL, else the bundled demo model")
      ->capture_default_str();
  sub->add_option("--ids", a.ids_text, "prompt token ids, comma-separated")->required();
  sub->add_option("--device", a.device, "cpu (fp32 reference), cuda, or auto")->capture_default_str();
  sub->add_option("--chunk", a.chunk, "prefill chunk size in tokens (0: the whole prompt in one step)");
}

struct Loaded {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<Qwen35Model> model;
  std::unique_ptr<Runner> runner;
};

// step_tokens: the largest step's tokens, logit_rows its logit rows (they size the step scratch).
Loaded load(const ModelArgs& a, int context, int step_tokens, int logit_rows) {
  Loaded l;
  auto ck = Checkpoint::open(a.model_dir);
  if (!ck.ok()) cli_fail(ck.status().message());
  l.ck = std::move(ck.value());
  auto ops = make_backend(a.device, step_scratch_bytes(l.ck->config(), step_tokens, logit_rows));
  if (!ops.ok()) cli_fail(ops.status().message());
  l.ops = std::move(ops.value());
  auto model = Qwen35Model::load(*l.ck, *l.ops);
  if (!model.ok()) cli_fail(model.status().message());
  l.model = std::move(model.value());
  RunnerOptions ro;
  ro.block_size = 16;
  ro.n_blocks = (context + ro.block_size - 1) / ro.block_size;
  ro.n_slots = 1;
  l.runner = std::make_unique<Runner>(*l.model, *l.ops, ro);
  return l;
}

void run_logits(const ModelArgs& a, const std::string& out_path) {
  std::vector<int32_t> ids = cli_parse_ids(a.ids_text);
  if (ids.empty()) cli_fail("--ids: no token ids given");
  const int n = static_cast<int>(ids.size()), step = a.chunk > 0 ? std::min(a.chunk, n) : n;
  Loaded l = load(a, n, step, step);  // every position's logits
  const int V = l.model->config().vocab_size;
  for (int32_t id : ids)
    if (id >= V) cli_fail("--ids: token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  Sequence seq;
  seq.tokens = ids;
  if (Status s = l.runner->admit(seq); !s.ok()) cli_fail(s.message());
  std::vector<float> logits;
  while (seq.n_cached < n) {
    const int take = a.chunk > 0 ? std::min(a.chunk, n - seq.n_cached) : n - seq.n_cached;
    auto r = l.runner->step({SeqWork{&seq, take, true}});
    if (!r.ok()) cli_fail(r.status().message());
    logits.insert(logits.end(), r.value()[0].begin(), r.value()[0].end());
  }
  if (Status s = write_npy_f32(out_path, logits.data(), {n, V}); !s.ok()) cli_fail(s.message());
  std::printf("%s\n", out_path.c_str());
}

void run_generate(const ModelArgs& a, int max_tokens, bool ignore_eos) {
  std::vector<int32_t> ids = cli_parse_ids(a.ids_text);
  if (ids.empty()) cli_fail("--ids: no token ids given");
  if (max_tokens < 0) cli_fail("--max-tokens must be >= 0");
  const int n = static_cast<int>(ids.size());
  Loaded l = load(a, n + max_tokens, a.chunk > 0 ? std::min(a.chunk, n) : n, 1);
  std::vector<int> stops = ignore_eos ? std::vector<int>{} : l.model->config().eos_token_ids;
  auto t0 = std::chrono::steady_clock::now();
  auto r = l.runner->generate_greedy(ids, max_tokens, a.chunk, stops);
  if (!r.ok()) cli_fail(r.status().message());
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  DS_LOG_INFO("generate", "%zu prompt + %zu generated tokens in %.3f s on %s", ids.size(), r.value().size(), sec,
              l.ops->name());
  std::string out = "[";
  for (size_t i = 0; i < r.value().size(); ++i) out += (i ? "," : "") + std::to_string(r.value()[i]);
  std::printf("%s]\n", out.c_str());
}

}  // namespace

void register_model_commands(CLI::App& app) {
  auto args = std::make_shared<ModelArgs>();
  auto out_path = std::make_shared<std::string>();
  CLI::App* logits = app.add_subcommand("logits", "write float32 logits [n_ids, vocab] of every position as .npy");
  add_model_options(logits, *args);
  logits->add_option("--out", *out_path, "output .npy path")->required();
  logits->callback([args, out_path] { run_logits(*args, *out_path); });

  auto gargs = std::make_shared<ModelArgs>();
  auto max_tokens = std::make_shared<int>(16);
  auto ignore_eos = std::make_shared<bool>(false);
  CLI::App* gen = app.add_subcommand("generate", "greedy decoding; prints the new ids as a JSON array");
  add_model_options(gen, *gargs);
  gen->add_option("--max-tokens", *max_tokens, "tokens to generate")->capture_default_str();
  gen->add_flag("--ignore-eos", *ignore_eos, "do not stop at the config's eos_token_id");
  gen->callback([gargs, max_tokens, ignore_eos] { run_generate(*gargs, *max_tokens, *ignore_eos); });
}

}  // namespace ds
