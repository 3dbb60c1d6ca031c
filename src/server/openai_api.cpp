// Request validation for /v1/chat/completions and /v1/completions: types, ranges, the chat
// template, tokenization and the context limit, each failure a clear 4xx; tool_choice and
// response_format become a forced tool-call opening and an OutputConstraint for the engine.
#include "server/openai_api.h"

#include "server/json_schema.h"
#include "server/output_constraint.h"
#include <algorithm>
#include <chrono>
#include <variant>

namespace ds::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

json ApiError::body() const {
  return json{{"error",
               {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

namespace {

ApiError bad(const std::string& param, const std::string& message) { return ApiError{400, message, "invalid_request_error", param, ""}; }

// A field's value, checked: absent/null → nullopt; wrong type → error.
struct Fields {
  const json& j;
  std::optional<ApiError> err;

  bool present(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  template <class T>
  std::optional<T> num(const char* k, double lo, double hi) {
    if (!present(k) || err) return std::nullopt;
    const json& v = j[k];
    if (!v.is_number() || (std::is_integral_v<T> && !v.is_number_integer())) {
      err = bad(k, std::string("'") + k + "' must be " + (std::is_integral_v<T> ? "an integer" : "a number"));
      return std::nullopt;
    }
    double d = v.get<double>();
    if (!(d >= lo && d <= hi)) {
      err = bad(k, std::string("'") + k + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
      return std::nullopt;
    }
    return static_cast<T>(d);
  }
  std::optional<bool> boolean(const char* k) {
    if (!present(k) || err) return std::nullopt;
    if (!j[k].is_boolean()) {
      err = bad(k, std::string("'") + k + "' must be a boolean");
      return std::nullopt;
    }
    return j[k].get<bool>();
  }
};

// response_format: "text" (nothing to do), "json_object" (any JSON object), "json_schema" (a JSON
// value the schema allows, within JsonSchema's subset; see docs/api.md).
std::optional<ApiError> parse_response_format(const json& rf, ParsedRequest& r) {
  const char* kParam = "response_format";
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return bad(kParam, "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
  const std::string type = rf["type"].get<std::string>();
  JsonAutomaton::Options o;
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    o.top_level = '{';
  } else if (type == "json_schema") {
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
      return bad(kParam, "'response_format.json_schema' must be an object with a 'schema'");
    const json& js = rf["json_schema"];
    const json schema = js.contains("schema") ? js["schema"] : json::object();
    if (!schema.is_object()) return bad(kParam, "'response_format.json_schema.schema' must be an object");
    auto compiled = JsonSchema::compile(schema);
    if (!compiled.ok())
      return bad(kParam, "response_format json_schema: " + compiled.status().message() +
                             " (enforced: type, properties, required, additionalProperties, items, enum/const of "
                             "strings; see docs/api.md)");
    o.schema = std::move(compiled.value());
  } else {
    return bad(kParam, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"" + type + "\"");
  }
  r.json_output.emplace(o);
  return std::nullopt;
}

std::optional<ApiError> parse_common(const json& j, const ServedModel& m, ParsedRequest& r) {
  if (!j.contains("model") || !j["model"].is_string()) return bad("model", "'model' must be a string naming the served model");
  if (j["model"].get<std::string>() != m.name)
    return ApiError{404, "The model '" + j["model"].get<std::string>() + "' does not exist; this server serves '" + m.name + "'",
                    "invalid_request_error", "model", "model_not_found"};
  Fields f{j, std::nullopt};
  if (auto n = f.num<int>("n", 1, 1e9); n && *n != 1) return bad("n", "'n' must be 1: several choices per request are not supported yet");
  if (f.err) return f.err;
  if (f.present("response_format")) {
    auto e = parse_response_format(j["response_format"], r);
    if (e) return e;
  }
  r.timeout_s = f.num<double>("timeout", 1e-3, 1e9);
  SamplingParams& s = r.gen.sampling;
  s.temperature = f.num<float>("temperature", 0, 2).value_or(m.defaults.temperature.value_or(1.0f));
  s.top_p = f.num<float>("top_p", 1e-9, 1).value_or(m.defaults.top_p.value_or(1.0f));
  s.top_k = f.num<int>("top_k", -1, 1e9).value_or(m.defaults.top_k.value_or(0));
  s.min_p = f.num<float>("min_p", 0, 1).value_or(m.defaults.min_p.value_or(0.0f));
  s.presence_penalty = f.num<float>("presence_penalty", -2, 2).value_or(0.0f);
  s.frequency_penalty = f.num<float>("frequency_penalty", -2, 2).value_or(0.0f);
  s.repetition_penalty = f.num<float>("repetition_penalty", 1e-6, 100).value_or(m.defaults.repetition_penalty.value_or(1.0f));
  if (auto seed = f.num<int64_t>("seed", -9.2e18, 9.2e18)) {
    s.has_seed = true;
    s.seed = static_cast<uint64_t>(*seed);
  }
  r.gen.ignore_eos = f.boolean("ignore_eos").value_or(false);
  r.gen.min_tokens = f.num<int>("min_tokens", 0, 1e9).value_or(0);
  r.stream = f.boolean("stream").value_or(false);
  std::optional<int> max_tokens = f.num<int>("max_completion_tokens", 1, 1e9);
  if (!max_tokens) max_tokens = f.num<int>("max_tokens", 1, 1e9);
  if (f.err) return f.err;
  if (f.present("stream_options")) {
    const json& so = j["stream_options"];
    if (!so.is_object()) return bad("stream_options", "'stream_options' must be an object");
    if (so.contains("include_usage") && !so["include_usage"].is_null()) {
      if (!so["include_usage"].is_boolean()) return bad("stream_options", "'stream_options.include_usage' must be a boolean");
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (f.present("stop")) {
    const json& st = j["stop"];
    if (st.is_string()) {
      r.stop_strings.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      for (const auto& x : st) {
        if (!x.is_string()) return bad("stop", "'stop' must be a string or an array of strings");
        r.stop_strings.push_back(x.get<std::string>());
      }
    } else {
      return bad("stop", "'stop' must be a string or an array of strings");
    }
  }
  if (f.present("stop_token_ids")) {
    const json& st = j["stop_token_ids"];
    if (!st.is_array()) return bad("stop_token_ids", "'stop_token_ids' must be an array of integers");
    for (const auto& x : st) {
      if (!x.is_number_integer()) return bad("stop_token_ids", "'stop_token_ids' must be an array of integers");
      r.gen.stop_ids.push_back(x.get<int32_t>());
    }
  }
  if (f.present("logit_bias")) {
    const json& lb = j["logit_bias"];
    if (!lb.is_object()) return bad("logit_bias", "'logit_bias' must map token ids to numbers");
    for (auto it = lb.begin(); it != lb.end(); ++it) {
      int id = -1;
      try {
        size_t used = 0;
        id = std::stoi(it.key(), &used);
        if (used != it.key().size()) id = -1;
      } catch (...) {
      }
      if (id < 0 || !it.value().is_number()) return bad("logit_bias", "'logit_bias' must map token ids to numbers");
      s.logit_bias.emplace_back(id, std::clamp(it.value().get<float>(), -100.0f, 100.0f));
    }
  }
  // the context: prompt + max_tokens must fit
  const int max_len = m.engine->options().max_model_len;
  const int n_prompt = static_cast<int>(r.gen.prompt.size());
  if (n_prompt == 0) return bad("prompt", "the prompt is empty");
  for (int32_t id : r.gen.prompt)
    if (id < 0 || id >= m.engine->vocab_size())
      return bad("prompt", "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(m.engine->vocab_size()) + ")");
  if (n_prompt >= max_len)
    return ApiError{400, "The prompt has " + std::to_string(n_prompt) + " tokens, but this model's context is " + std::to_string(max_len) +
                             " tokens (the prompt must leave room for at least one new token)",
                    "invalid_request_error", "messages", "context_length_exceeded"};
  if (max_tokens && *max_tokens > max_len - n_prompt)
    return ApiError{400, "max_tokens is " + std::to_string(*max_tokens) + " but the prompt has " + std::to_string(n_prompt) +
                             " tokens and the context is " + std::to_string(max_len) + ": at most " +
                             std::to_string(max_len - n_prompt) + " new tokens fit",
                    "invalid_request_error", "max_tokens", "context_length_exceeded"};
  r.gen.max_tokens = max_tokens.value_or(max_len - n_prompt);
  return std::nullopt;
}

// OpenAI content: a string, or an array of {"type": "text", "text": ...} parts.
std::optional<ApiError> flatten_content(ojson& msg, size_t i) {
  if (!msg.contains("content")) return std::nullopt;
  ojson& c = msg["content"];
  if (c.is_null() || c.is_string()) return std::nullopt;
  if (!c.is_array()) return bad("messages", "messages[" + std::to_string(i) + "].content must be a string or an array of text parts");
  std::string text;
  for (const auto& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      return bad("messages", "messages[" + std::to_string(i) + "].content: only parts of type 'text' are supported");
    text += part["text"].get<std::string>();
  }
  c = text;
  return std::nullopt;
}

// Deepest [ / { nesting outside strings. Copying or rendering a JSON value recurses, so a
// body nested thousands deep would overflow the stack: it is refused before parsing.
int json_depth(const std::string& body) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

constexpr int kMaxJsonDepth = 64;

json parse_json(const std::string& body, std::optional<ApiError>& err) {
  if (json_depth(body) > kMaxJsonDepth) {
    err = bad("", "The request body nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return json();
  }
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded())
    err = bad("", "The request body is not valid JSON (or not valid UTF-8)");
  else if (!j.is_object())
    err = bad("", "The request body must be a JSON object");
  return j;
}

}  // namespace

std::variant<ParsedRequest, ApiError> parse_chat_request(const std::string& body, const ServedModel& m) {
  std::optional<ApiError> err;
  json j = parse_json(body, err);
  if (err) return *err;
  ParsedRequest r;
  r.chat = true;
  if (!m.chat_template) return bad("messages", "this model has no chat template; use /v1/completions");
  ojson oj = ojson::parse(body, nullptr, false);
  if (!oj.contains("messages") || !oj["messages"].is_array()) return bad("messages", "'messages' must be an array of messages");
  if (oj["messages"].empty()) return bad("messages", "'messages' must not be empty");
  tok::ChatRequest cr;
  cr.messages = oj["messages"];
  for (size_t i = 0; i < cr.messages.size(); ++i) {
    ojson& msg = cr.messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string())
      return bad("messages", at + " must be an object with a string 'role'");
    const std::string role = msg["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      return bad("messages", at + ".role '" + role + "' is not one of system, user, assistant, tool");
    if (role == "developer") msg["role"] = "system";
    if (auto e = flatten_content(msg, i)) return *e;
    if (role != "assistant" && !(msg.contains("content") && msg["content"].is_string()))
      return bad("messages", at + ".content must be a string");
    if (msg.contains("tool_calls") && !msg["tool_calls"].is_null()) {
      if (!msg["tool_calls"].is_array()) return bad("messages", at + ".tool_calls must be an array");
      for (auto& call : msg["tool_calls"]) {  // arguments arrive as a JSON string; templates want an object
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          return bad("messages", at + ".tool_calls[] must have a 'function' object");
        ojson& fn = call["function"];
        if (fn.contains("arguments") && fn["arguments"].is_string()) {
          ojson a = ojson::parse(fn["arguments"].get<std::string>(), nullptr, false);
          if (!a.is_discarded() && a.is_object()) fn["arguments"] = a;
        }
      }
    }
  }
  if (oj.contains("tools") && !oj["tools"].is_null()) {
    if (!oj["tools"].is_array()) return bad("tools", "'tools' must be an array");
    for (const auto& t : oj["tools"])
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
          !t["function"]["name"].is_string())
        return bad("tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}");
    if (!oj["tools"].empty()) cr.tools = oj["tools"];
  }
  // tool_choice: "none" hides the tools from the template; "required" and a named function
  // force the output to open a tool call (and name the function), see below.
  std::string tool_choice = "auto", forced_name;
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    const json& tc = j["tool_choice"];
    const std::string shape = "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";
    if (tc.is_string()) {
      tool_choice = tc.get<std::string>();
      if (tool_choice != "auto" && tool_choice != "none" && tool_choice != "required") return bad("tool_choice", shape);
    } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      tool_choice = "function";
      forced_name = tc["function"]["name"].get<std::string>();
    } else {
      return bad("tool_choice", shape);
    }
    if ((tool_choice == "required" || tool_choice == "function") && cr.tools.is_null())
      return bad("tool_choice", "'tool_choice' \"" + tool_choice + "\" needs a non-empty 'tools' array");
    if (tool_choice == "function") {
      bool known = false;
      for (const auto& t : cr.tools) known = known || t["function"]["name"] == forced_name;
      if (!known) return bad("tool_choice", "'tool_choice' names the function '" + forced_name + "', which is not in 'tools'");
    }
    for (const auto& t : cr.tools) {  // the names a forced call may write
      const std::string name = t["function"]["name"].get<std::string>();
      const bool forced = tool_choice == "required" || (tool_choice == "function" && name == forced_name);
      if (forced && (name.empty() || name.find_first_of("<>\n") != std::string::npos))
        return bad("tools", "the function name '" + name + "' cannot be forced by tool_choice (empty, or it contains '<', '>' or a newline)");
    }
  }
  if (tool_choice == "none") cr.tools = nullptr;
  r.tool_required = tool_choice == "required" || tool_choice == "function";
  r.tools_enabled = !cr.tools.is_null();
  r.tools = r.tools_enabled ? json::parse(cr.tools.dump()) : json();
  if (oj.contains("chat_template_kwargs") && !oj["chat_template_kwargs"].is_null()) {
    if (!oj["chat_template_kwargs"].is_object()) return bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    cr.kwargs = oj["chat_template_kwargs"];
  }
  cr.add_generation_prompt = true;
  cr.bos_token = m.tokenizer->bos_token();
  cr.eos_token = m.tokenizer->eos_token();
  auto text = m.chat_template->render(cr);
  if (!text.ok()) return bad("messages", "the chat template failed: " + text.status().message());
  auto ids = m.tokenizer->encode(text.value(), /*add_special_tokens=*/false);
  if (!ids.ok()) return bad("messages", ids.status().message());
  r.gen.prompt = std::move(ids.value());
  const std::string& p = text.value();
  const std::string open = "<think>", close = "</think>";
  size_t o = p.rfind(open);
  r.starts_in_reasoning = o != std::string::npos && p.find(close, o) == std::string::npos;
  // A forced tool call opens with the template's own syntax. Without reasoning it is appended
  // to the prompt (prefilled, and re-added to the output text before parsing); with reasoning
  // open it must follow the model's thinking, so the engine forces it token by token right
  // after "</think>" (with the "\n\n" the template puts there).
  // "required" forces "<function=" and then one of the tools' names.
  std::vector<int32_t> forced;
  std::vector<std::string> names;
  if (tool_choice == "required")
    for (const auto& t : cr.tools) names.push_back(t["function"]["name"].get<std::string>() + ">\n");
  if (r.tool_required) {
    const std::string opening = "<tool_call>\n<function=" + (forced_name.empty() ? "" : forced_name + ">\n");
    auto ids = m.tokenizer->encode(r.starts_in_reasoning ? "\n\n" + opening : opening, /*add_special_tokens=*/false);
    if (!ids.ok()) return bad("tool_choice", ids.status().message());
    if (r.starts_in_reasoning) {
      forced = std::move(ids.value());
    } else {
      r.gen.prompt.insert(r.gen.prompt.end(), ids.value().begin(), ids.value().end());
      r.output_prefix = opening;
    }
  }

  Fields f{j, std::nullopt};
  r.logprobs = f.boolean("logprobs").value_or(false);
  r.top_logprobs = f.num<int>("top_logprobs", 0, 20).value_or(0);
  if (f.err) return *f.err;
  if (r.top_logprobs > 0 && !r.logprobs) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  r.gen.sampling.n_logprobs = r.logprobs ? r.top_logprobs : -1;
  if (auto e = parse_common(j, m, r)) return *e;
  if (r.tool_required && r.json_output)
    return bad("response_format", "'response_format' JSON cannot be combined with a forced tool call ('tool_choice')");
  if (r.json_output || !forced.empty() || !names.empty())
    r.gen.constraint = std::make_shared<OutputConstraint>(m.tokenizer, r.starts_in_reasoning, std::move(forced), std::move(names), r.json_output);
  return r;
}

std::variant<ParsedRequest, ApiError> parse_completion_request(const std::string& body, const ServedModel& m) {
  std::optional<ApiError> err;
  json j = parse_json(body, err);
  if (err) return *err;
  ParsedRequest r;
  if (!j.contains("prompt")) return bad("prompt", "'prompt' is required: a string or an array of token ids");
  json p = j["prompt"];
  if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = p[0];  // a batch of one
  if (p.is_string()) {
    auto ids = m.tokenizer->encode(p.get<std::string>(), /*add_special_tokens=*/true);
    if (!ids.ok()) return bad("prompt", ids.status().message());
    r.gen.prompt = std::move(ids.value());
  } else if (p.is_array()) {
    for (const auto& x : p) {
      if (!x.is_number_integer())
        return bad("prompt", p.size() > 1 && (x.is_string() || x.is_array()) ? "only one prompt per request is supported"
                                                                           : "'prompt' must be a string or an array of token ids");
      r.gen.prompt.push_back(x.get<int32_t>());
    }
  } else {
    return bad("prompt", "'prompt' must be a string or an array of token ids");
  }
  Fields f{j, std::nullopt};
  if (f.boolean("echo").value_or(false)) return bad("echo", "'echo' is not supported yet");
  if (f.err) return *f.err;
  if (f.present("suffix")) return bad("suffix", "'suffix' is not supported");
  if (auto lp = f.num<int>("logprobs", 0, 20)) {
    r.logprobs = true;
    r.top_logprobs = *lp;
  }
  if (f.err) return *f.err;
  r.gen.sampling.n_logprobs = r.logprobs ? r.top_logprobs : -1;
  if (auto e = parse_common(j, m, r)) return *e;
  if (r.json_output)
    r.gen.constraint = std::make_shared<OutputConstraint>(m.tokenizer, false, std::vector<int32_t>{}, std::vector<std::string>{}, r.json_output);
  return r;
}

}  // namespace ds::server
