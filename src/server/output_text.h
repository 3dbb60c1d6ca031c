// Text of a generation as the client sees it: incremental detokenization, stop strings (never
// emitted, found across token boundaries by holding back a possible prefix), and for chat the
// split into reasoning (<think>…</think>), content and the tool-call tail (from the first
// <tool_call> on; tool_calls.h parses it). No HTTP here.
#pragma once

#include <cstdint>
#include <memory>
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

// Splits chat output into reasoning, content and a tool-call tail as text arrives.
class ChatSplitter {
 public:
  // starts_in_reasoning: the prompt ended inside <think> (the template opened it).
  // tools_enabled: <tool_call> starts the tool tail (else it is plain content).
  ChatSplitter(bool starts_in_reasoning, bool tools_enabled);
  struct Piece {
    std::string reasoning;
    std::string content;
    std::string tools;  // more of the tool tail, which starts at "<tool_call>"
  };
  Piece push(const std::string& text);
  Piece finish();  // flushes held-back text

 private:
  Piece drain(bool final);
  enum class Mode { kStart, kReasoning, kContent, kTools } mode_;
  bool tools_enabled_;
  bool content_started_ = false;
  std::string buf_;
};

}  // namespace ds::server
