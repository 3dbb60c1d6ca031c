// Text of a generation as the client sees it: incremental detokenization, stop strings (never
// emitted, found across token boundaries by holding back a possible prefix), and for chat the
// split into reasoning (<think>…</think>), content and Qwen tool calls (<tool_call> blocks in
// JSON or in the XML <function=NAME><parameter=K>V</parameter> form). No HTTP here.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace ds::server {

// Detokenizes token by token and cuts the text at the first stop string.
class StopTextStream {
 public:
  StopTextStream(const tok::Tokenizer& tok, std::vector<std::string> stops);
  // Text made final by this token (possibly empty). After a stop string matched, nothing more.
  std::string push(int32_t token);
  std::string finish();  // what was held back (none after a stop)
  bool stopped() const { return stopped_; }

 private:
  std::string release(bool final);
  tok::StreamDecoder dec_;
  std::vector<std::string> stops_;
  std::string pending_;  // decoded, not yet emitted: may be the start of a stop string
  bool stopped_ = false;
};

struct ToolCall {
  std::string id;         // "call_<hex>"
  std::string name;
  std::string arguments;  // a JSON object, serialized
};

// Parses the text from the first <tool_call> on. False (and `calls` untouched) when any block
// is malformed: the caller then keeps the text as content. `tools`: the request's tools array
// (its parameter types decide whether an XML value is a string or JSON).
bool parse_tool_calls(const std::string& text, const nlohmann::json& tools, std::vector<ToolCall>& calls);

// Splits chat output into reasoning, content and a tool-call tail as text arrives.
class ChatSplitter {
 public:
  // starts_in_reasoning: the prompt ended inside <think> (the template opened it).
  // tools_enabled: <tool_call> starts the tool tail (else it is plain content).
  ChatSplitter(bool starts_in_reasoning, bool tools_enabled);
  struct Piece {
    std::string reasoning;
    std::string content;
  };
  Piece push(const std::string& text);
  Piece finish();  // flushes held-back text
  const std::string& tool_text() const { return tool_text_; }  // from "<tool_call>" on, never streamed

 private:
  Piece drain(bool final);
  enum class Mode { kStart, kReasoning, kContent, kTools } mode_;
  bool tools_enabled_;
  bool content_started_ = false;
  std::string buf_;
  std::string tool_text_;
};

}  // namespace ds::server
