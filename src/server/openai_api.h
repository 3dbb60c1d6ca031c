// OpenAI API mapping: JSON request bodies → a validated GenerationRequest plus the output
// options the HTTP layer needs; error bodies. The only place request JSON is interpreted.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/json_automaton.h"
#include "server/served_model.h"

namespace ds::server {

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
  nlohmann::json body() const;
};

struct ParsedRequest {
  bool chat = false;
  GenerationRequest gen;
  std::vector<std::string> stop_strings;
  bool stream = false;
  bool include_usage = false;        // stream_options.include_usage
  bool logprobs = false;             // chat: logprobs; completions: logprobs is not null
  int top_logprobs = 0;
  bool tools_enabled = false;        // chat: tools given and tool_choice != "none"
  nlohmann::json tools;              // chat: the request's tools (null if none)
  bool tool_required = false;        // chat: tool_choice "required" or a named function
  bool starts_in_reasoning = false;  // chat: the rendered prompt ends inside <think>
  std::string output_prefix;         // chat: forced output already appended to the prompt (a tool-call opening)
  std::optional<JsonAutomaton> json_output;  // response_format json_object / json_schema
  std::optional<double> timeout_s;   // the request's "timeout" in seconds (the server caps it)
};

// Both return the parsed request or the error to send. `body` is the raw request body.
std::variant<ParsedRequest, ApiError> parse_chat_request(const std::string& body, const ServedModel& m);
std::variant<ParsedRequest, ApiError> parse_completion_request(const std::string& body, const ServedModel& m);

}  // namespace ds::server
