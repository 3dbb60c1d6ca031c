// `serve`: loads a model folder (default: the bundled demo model), or random weights of a
// config's shapes (`--config C --synthetic`, for benchmarks with token-id prompts), and runs the
// OpenAI-compatible HTTP server until SIGINT/SIGTERM.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "core/log.h"
#include "server/http_server.h"
#include "server/served_model.h"

namespace ds {

namespace {

server::HttpServer* g_server = nullptr;

void on_signal(int) {
  if (g_server) g_server->stop();
}


// --model, else env DS_MODEL, else the bundled demo model.
std::string resolve_model_dir(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* env = std::getenv("DS_MODEL"); env && *env) return env;
#ifdef DS_DEFAULT_MODEL_DIR
  const std::string dir = DS_DEFAULT_MODEL_DIR;
#else
  const std::string dir = "models/qwen3_5-demo";
#endif
  if (!std::filesystem::exists(dir + "/config.json"))
    cli_fail("no --model given and the bundled demo model is not at " + dir +
         " (it is being trained; pass --model DIR or set DS_MODEL)");
  return dir;
}

void run_serve(server::ServeOptions o, const std::string& config, bool synthetic) {
  if (synthetic) {
    if (config.empty()) cli_fail("--synthetic needs --config FILE (the shapes to draw random weights for)");
    if (!o.model_dir.empty()) cli_fail("give either --model or --config with --synthetic, not both");
    o.synthetic_config = config;
  } else {
    if (!config.empty()) cli_fail("--config is used with --synthetic");
    o.model_dir = resolve_model_dir(o.model_dir);
  }
  if (o.max_num_seqs < 1) cli_fail("--max-num-seqs must be at least 1");
  if (o.max_step_tokens < 1) cli_fail("--max-step-tokens must be at least 1");
  if (o.block_size < 2 || (o.block_size & (o.block_size - 1)) != 0)
    cli_fail("--block-size must be a power of two, at least 2 (got " + std::to_string(o.block_size) + ")");
  auto model = server::ServedModel::load(o);
  if (!model.ok()) cli_fail(model.status().message());
  server::HttpServer http(*model.value(), o);
  if (Status s = http.bind(); !s.ok()) cli_fail(s.message());
  g_server = &http;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  DS_LOG_INFO("serve", "serving '%s' on http://%s:%d%s", model.value()->name.c_str(), o.host.c_str(), http.port(),
              o.api_key.empty() ? "" : " (API key required)");
  std::printf("listening on http://%s:%d\n", o.host.c_str(), http.port());
  std::fflush(stdout);
  http.run();
  g_server = nullptr;
  DS_LOG_INFO("serve", "stopped");
}

}  // namespace

void register_serve_commands(CLI::App& app) {
  auto o = std::make_shared<server::ServeOptions>();
  CLI::App* s = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat, completions, models, health, metrics)");
  s->add_option("--model", o->model_dir, "checkpoint folder with tokenizer (default: env DS_MODEL, else the bundled demo model)");
  s->add_option("--served-model-name", o->served_model_name, "the model id clients send (default: the folder's name)");
  s->add_option("--device", o->device, "cpu (fp32 reference), cuda, or auto")->capture_default_str();
  s->add_option("--host", o->host, "address to bind")->capture_default_str();
  s->add_option("--port", o->port, "port (0: any free port, printed on stdout)")->capture_default_str();
  s->add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' on /v1/* (env DS_API_KEY)")->envname("DS_API_KEY");
  s->add_option("--max-num-seqs", o->max_num_seqs, "sequences batched at once (= GDN state slots)")->capture_default_str();
  s->add_option("--max-step-tokens", o->max_step_tokens, "token budget of one step (prefill chunks + decodes)")->capture_default_str();
  s->add_option("--max-model-len", o->max_model_len, "context per request (0: min(max_position_embeddings, 4096))");
  s->add_option("--kv-blocks", o->kv_blocks, "KV cache blocks (0: max-num-seqs contexts / 4, at least one)");
  s->add_option("--block-size", o->block_size, "tokens per KV block")->capture_default_str();
  s->add_option("--gpu-memory", o->gpu_memory_gib,
                "GiB the process may use on the device (weights, scratch, runtime context, a reserve for graphs, state slots, KV); sizes the KV pool");
  s->add_option("--max-waiting", o->max_waiting, "requests held beyond --max-num-seqs before 429")->capture_default_str();
  s->add_option("--max-body-bytes", o->max_body_bytes, "request body size limit")->capture_default_str();
  s->add_option("--request-timeout", o->request_timeout_s, "per-request deadline in seconds")->capture_default_str();
  auto config = std::make_shared<std::string>();
  auto synthetic = std::make_shared<bool>(false);
  s->add_option("--config", *config, "config.json whose shapes get random weights (with --synthetic)");
  s->add_flag("--synthetic", *synthetic,
              "serve random weights (token-id prompts; a stand-in tokenizer writes id N as \"<tN>\")");
  s->add_flag("--w4a16", o->synthetic_w4a16, "with --synthetic: W4A16 linears (GPU)");
  s->add_option("--w4a8", o->w4a8, kW4A8Help)->capture_default_str();
  s->callback([o, config, synthetic] { run_serve(*o, *config, *synthetic); });
}

}  // namespace ds
