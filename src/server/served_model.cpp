// ServedModel loading: pool sizing, EOS ids from every source, generation_config defaults.
#include "server/served_model.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/log.h"
#include "engine/backend_factory.h"
#include "engine/memory_plan.h"

namespace ds::server {

using json = nlohmann::json;

namespace {

// The step scratch of the engine's largest step: max_step_tokens tokens (a step of decodes only
// may hold max_num_seqs), a logit row a sequence.
size_t largest_step_scratch(const ServeOptions& o, const ModelConfig& cfg) {
  return step_scratch_bytes(cfg, std::max(o.max_step_tokens, o.max_num_seqs), o.max_num_seqs);
}

// A byte-level BPE tokenizer with no merges for a synthetic model of `vocab` ids: the 256 byte
// tokens, then "<tN>" for every other id, so generated ids have a readable text.
Result<std::shared_ptr<tok::Tokenizer>> synthetic_tokenizer(int vocab) {
  std::vector<int> byte_char(256);  // the ByteLevel byte -> code point map
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    byte_char[b] = printable ? b : 256 + extra++;
  }
  json v = json::object();
  for (int b = 0; b < 256 && b < vocab; ++b) {
    const int cp = byte_char[b];
    std::string utf8;
    if (cp < 0x80) utf8 += static_cast<char>(cp);
    else {
      utf8 += static_cast<char>(0xC0 | (cp >> 6));
      utf8 += static_cast<char>(0x80 | (cp & 0x3F));
    }
    v[utf8] = b;
  }
  for (int id = 256; id < vocab; ++id) v["<t" + std::to_string(id) + ">"] = id;
  json tj = {{"model", {{"type", "BPE"}, {"vocab", v}, {"merges", json::array()}}},
             {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
             {"decoder", {{"type", "ByteLevel"}}},
             {"added_tokens", json::array()}};
  return tok::Tokenizer::from_json(tj.dump(), "", "synthetic tokenizer");
}

// The folder part of load(): tokenizer, chat template, checkpoint, model, generation_config.
Status load_folder(const ServeOptions& o, ServedModel& m, std::vector<int32_t>& eos) {
  namespace fs = std::filesystem;
  if (!fs::exists(o.model_dir + "/tokenizer.json"))
    return not_found(o.model_dir + " has no tokenizer.json: the server needs the checkpoint's tokenizer");
  DS_ASSIGN_OR_RETURN(m.tokenizer, tok::Tokenizer::load_dir(o.model_dir));
  std::string tmpl = m.tokenizer->chat_template();
  if (tmpl.empty() && fs::exists(o.model_dir + "/chat_template.jinja")) {
    std::ifstream f(o.model_dir + "/chat_template.jinja");
    std::stringstream ss;
    ss << f.rdbuf();
    tmpl = ss.str();
  }
  if (!tmpl.empty()) {
    auto t = tok::ChatTemplate::parse(tmpl);
    if (!t.ok()) return Status(t.status().code(), o.model_dir + ": chat template: " + t.status().message());
    m.chat_template = std::move(t.value());
  } else {
    DS_LOG_WARN("serve", "%s has no chat template: /v1/chat/completions will answer 400", o.model_dir.c_str());
  }

  DS_ASSIGN_OR_RETURN(m.ck, Checkpoint::open(o.model_dir));
  DS_ASSIGN_OR_RETURN(m.ops, make_backend(o.device, largest_step_scratch(o, m.ck->config())));
  DS_ASSIGN_OR_RETURN(ActInt8Layers a8, parse_act_int8_layers(o.w4a8));
  DS_ASSIGN_OR_RETURN(m.model, Qwen35Model::load(*m.ck, *m.ops, a8));
  const ModelConfig& cfg = m.model->config();
  eos.assign(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
  if (m.tokenizer->eos_id()) eos.push_back(*m.tokenizer->eos_id());
  std::ifstream gf(o.model_dir + "/generation_config.json");
  if (gf) {
    std::stringstream ss;
    ss << gf.rdbuf();
    json g = json::parse(ss.str(), nullptr, false);
    if (g.is_discarded() || !g.is_object()) return invalid_argument(o.model_dir + "/generation_config.json: not a JSON object");
    auto num = [&](const char* k) -> std::optional<float> {
      return g.contains(k) && g[k].is_number() ? std::optional<float>(g[k].get<float>()) : std::nullopt;
    };
    m.defaults.temperature = num("temperature");
    m.defaults.top_p = num("top_p");
    m.defaults.min_p = num("min_p");
    m.defaults.repetition_penalty = num("repetition_penalty");
    if (g.contains("top_k") && g["top_k"].is_number_integer()) m.defaults.top_k = g["top_k"].get<int>();
    if (g.contains("eos_token_id")) {
      const json& e = g["eos_token_id"];
      if (e.is_number_integer()) eos.push_back(e.get<int32_t>());
      if (e.is_array())
        for (const auto& x : e)
          if (x.is_number_integer()) eos.push_back(x.get<int32_t>());
    }
  }
  return Status();
}

}  // namespace

ServedModel::~ServedModel() {
  if (engine) engine->stop();
}

Result<std::unique_ptr<ServedModel>> ServedModel::load(const ServeOptions& o) {
  namespace fs = std::filesystem;
  if (o.synthetic_config.empty() && !fs::is_directory(o.model_dir))
    return not_found("model folder " + o.model_dir + " does not exist");
  auto m = std::make_unique<ServedModel>();
  m->name = o.served_model_name.empty() ? fs::path(o.model_dir).lexically_normal().filename().string() : o.served_model_name;
  if (m->name.empty()) m->name = fs::path(o.model_dir).lexically_normal().parent_path().filename().string();
  m->created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();

  std::vector<int32_t> eos;
  if (!o.synthetic_config.empty()) {
    DS_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(o.synthetic_config));
    if (o.served_model_name.empty()) m->name = "synthetic-" + fs::path(o.synthetic_config).stem().string();
    DS_ASSIGN_OR_RETURN(m->tokenizer, synthetic_tokenizer(cfg.vocab_size));
    DS_ASSIGN_OR_RETURN(m->ops, make_backend(o.device, largest_step_scratch(o, cfg)));
    DS_ASSIGN_OR_RETURN(ActInt8Layers a8, parse_act_int8_layers(o.w4a8));
    DS_ASSIGN_OR_RETURN(m->model, Qwen35Model::synthetic(cfg, *m->ops, /*with_mtp=*/false, o.synthetic_w4a16, 1, a8));
    eos.assign(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
  } else {
    DS_RETURN_IF_ERROR(load_folder(o, *m, eos));
  }
  const ModelConfig& cfg = m->model->config();
  std::sort(eos.begin(), eos.end());
  eos.erase(std::unique(eos.begin(), eos.end()), eos.end());

  int max_len = o.max_model_len > 0 ? o.max_model_len : std::min(cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 4096, 4096);
  RunnerOptions ro;
  ro.block_size = o.block_size;
  ro.n_slots = o.max_num_seqs;
  const int blocks_per_ctx = (max_len + o.block_size - 1) / o.block_size;
  ro.n_blocks = o.kv_blocks > 0 ? o.kv_blocks : std::max(blocks_per_ctx, o.max_num_seqs * blocks_per_ctx / 4);
  if (o.gpu_memory_gib > 0 && o.kv_blocks > 0) return invalid_argument("give --gpu-memory or --kv-blocks, not both");
  DS_ASSIGN_OR_RETURN(MemoryPlan plan, plan_memory(*m->ops, m->model->cache_geometry(ro.n_blocks, ro.block_size, ro.n_slots),
                                                   o.gpu_memory_gib * 1024.0 * 1024.0 * 1024.0, blocks_per_ctx));
  ro.n_blocks = plan.geometry.n_blocks;
  DS_LOG_INFO("serve", "%s", plan.report().c_str());
  if (ro.n_blocks < blocks_per_ctx)
    return invalid_argument("--kv-blocks " + std::to_string(ro.n_blocks) + " cannot hold one context of " +
                            std::to_string(max_len) + " tokens (" + std::to_string(blocks_per_ctx) + " blocks)");
  m->runner = std::make_unique<Runner>(*m->model, *m->ops, ro);
  EngineOptions eo;
  eo.max_num_seqs = o.max_num_seqs;
  eo.max_step_tokens = o.max_step_tokens;
  eo.max_waiting = o.max_waiting;
  eo.max_model_len = max_len;
  eo.eos_ids = eos;
  m->engine = std::make_unique<Engine>(*m->runner, eo);
  m->engine->start();
  DS_LOG_INFO("serve", "model '%s' on %s: context %d, %d KV blocks of %d tokens, %d state slots", m->name.c_str(),
              m->ops->name(), max_len, ro.n_blocks, ro.block_size, ro.n_slots);
  return m;
}

}  // namespace ds::server
