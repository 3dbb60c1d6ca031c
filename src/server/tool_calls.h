// ToolCallStream: parses Qwen <tool_call> blocks as the text arrives and says what to send as
// OpenAI `delta.tool_calls`: a call's index, id and name as soon as the name is known, then
// fragments of its arguments JSON. Two forms:
//   XML  <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>
//        arguments are built as compact JSON, one `"K":V` member per finished parameter (V is a
//        string when the tool's schema says so, else parsed as JSON when it parses);
//   JSON <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
//        the arguments' raw text streams as it comes (a JsonAutomaton finds its end).
// Non-streaming responses run the same parser over the whole text, so both give the same calls.
// Text that does not form a call is handed back as content.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/json_automaton.h"

namespace ds::server {

struct ToolCall {
  std::string id;         // "call_<hex>"
  std::string name;
  std::string arguments;  // JSON text (an object, unless the model wrote something else)
};

struct ToolCallDelta {
  size_t index = 0;
  std::string id, name;   // set on a call's first delta only
  std::string arguments;  // the next fragment of the arguments text (may be empty)
};

class ToolCallStream {
 public:
  // tools: the request's tools array (parameter types decide how XML values are read).
  explicit ToolCallStream(nlohmann::json tools);

  // text: the next piece of the tool tail, which starts at the first "<tool_call>".
  std::vector<ToolCallDelta> push(const std::string& text);
  // The output ended: closes an open call (its arguments as far as they came) and hands an
  // unfinished block that never named a function to take_leftover().
  std::vector<ToolCallDelta> finish();

  const std::vector<ToolCall>& calls() const { return calls_; }
  // Text found not to be a tool call (from the malformed block on), once; then "".
  std::string take_leftover();

 private:
  enum class State { kOpen, kBody, kJsonHead, kJsonArgs, kXmlParams, kTail, kBad };
  bool step(bool final, std::vector<ToolCallDelta>& out);  // false: needs more text
  void begin_call(const std::string& name, std::vector<ToolCallDelta>& out);
  void add_args(const std::string& fragment, std::vector<ToolCallDelta>& out);
  void consume(size_t n);  // drops n bytes of buf_, remembering them as the block's text
  void fail();             // the rest is not a call: to the leftover

  nlohmann::json tools_;
  State state_ = State::kOpen;
  std::string buf_;         // unparsed text
  std::string block_;       // text consumed since the current block's "<tool_call>"
  std::string leftover_;
  std::vector<ToolCall> calls_;
  int n_params_ = 0;        // XML: parameters written into the open call
  JsonAutomaton args_;      // JSON form: the arguments value read so far
  bool args_started_ = false;
  bool args_string_ = false;  // JSON form: arguments given as a JSON string (sent whole, decoded)
  std::string args_text_;     // ... its text
};

}  // namespace ds::server
