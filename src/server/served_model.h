// ServedModel: everything `serve` loads from a model folder: checkpoint, backend, model,
// runner, engine, tokenizer, chat template and generation_config.json defaults.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace ds::server {

struct ServeOptions {
  std::string model_dir;
  std::string synthetic_config;   // non-empty: random weights of this config.json's shapes, no folder
  bool synthetic_w4a16 = false;   // synthetic linears as W4A16 (GPU backends)
  std::string w4a8 = "none";      // layer classes whose W4A16 linears read int8 inputs (parse_act_int8_layers)
  std::string served_model_name;  // default: the folder's name
  std::string device = "auto";
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;            // empty: no auth
  int max_num_seqs = 64;
  int max_step_tokens = kDefaultMaxStepTokens;  // token budget of one step (engine/scheduler.h)
  int max_model_len = 0;          // 0: min(max_position_embeddings, 4096)
  int kv_blocks = 0;              // 0: max_num_seqs * max_model_len / 4 tokens' worth, at least one full context
  double gpu_memory_gib = 0;      // > 0: one byte budget for weights, scratch, state slots and KV (sizes the KV pool)
  int block_size = 16;
  int max_waiting = 64;           // requests held beyond max_num_seqs before 429
  size_t max_body_bytes = 8u << 20;
  double request_timeout_s = 600; // per-request deadline
};

// Sampling defaults from generation_config.json (absent fields keep the OpenAI defaults).
struct GenerationDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
};

struct ServedModel {
  std::string name;
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<Qwen35Model> model;
  std::unique_ptr<Runner> runner;
  std::unique_ptr<Engine> engine;
  std::shared_ptr<tok::Tokenizer> tokenizer;
  std::optional<tok::ChatTemplate> chat_template;
  GenerationDefaults defaults;
  int64_t created = 0;  // unix seconds at load

  // Loads (or, with synthetic_config, draws random weights) and starts the engine thread.
  // A synthetic model has a stand-in tokenizer: ids below 256 are bytes, id N above is the
  // text "<tN>"; it has no chat template (clients send token-id prompts).
  static Result<std::unique_ptr<ServedModel>> load(const ServeOptions& o);
  ~ServedModel();
};

}  // namespace ds::server
