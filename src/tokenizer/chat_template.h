// Chat templates: renders a checkpoint's own Jinja chat_template (the subset Qwen3/3.5/3.8
// templates use) from messages, tools and extra keyword arguments, byte-for-byte as
// transformers' apply_chat_template(tokenize=False). Unsupported constructs are errors with
// line and column, never a silently different prompt.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "tokenizer/template_ast.h"

namespace ds::tok {

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;                                  // null: no tools
  bool add_generation_prompt = false;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // enable_thinking, reasoning_effort, ...
  std::string bos_token, eos_token, pad_token;                   // exposed to the template by name
};

class ChatTemplate {
 public:
  // Parses once; render() may then run concurrently from several threads.
  static Result<ChatTemplate> parse(const std::string& source);
  // Renders with an arbitrary JSON object as the context (its keys become variables).
  Result<std::string> render(const nlohmann::ordered_json& context) const;
  Result<std::string> render(const ChatRequest& req) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace ds::tok
