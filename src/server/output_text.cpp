// Stop strings and the reasoning / content / tool-tail split.
#include "server/output_text.h"

#include <algorithm>

namespace ds::server {

namespace {

// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_suffix(const std::string& s, const std::string& tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.compare(s.size() - n, n, tag, 0, n) == 0) return n;
  return 0;
}

}  // namespace

//
// StopTextStream
//
StopTextStream::StopTextStream(const tok::Tokenizer& tok, std::vector<std::string> stops)
    : dec_(tok, /*skip_special_tokens=*/true), stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopTextStream::release(bool final) {
  size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, pending_.find(s));
  std::string out;
  if (cut != std::string::npos) {
    out = pending_.substr(0, cut);
    pending_.clear();
    stopped_ = true;
    return out;
  }
  size_t hold = 0;
  if (!final)
    for (const auto& s : stops_) hold = std::max(hold, partial_suffix(pending_, s));
  out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopTextStream::push(int32_t token) {
  if (stopped_) return "";
  auto piece = dec_.push(token);
  if (piece.ok()) pending_ += piece.value();
  return release(false);
}

std::string StopTextStream::finish() {
  if (stopped_) return "";
  pending_ += dec_.finish();
  return release(true);
}

//
// ChatSplitter
//
ChatSplitter::ChatSplitter(bool starts_in_reasoning, bool tools_enabled)
    : mode_(starts_in_reasoning ? Mode::kReasoning : Mode::kStart), tools_enabled_(tools_enabled) {}

ChatSplitter::Piece ChatSplitter::push(const std::string& text) {
  buf_ += text;
  return drain(false);
}

ChatSplitter::Piece ChatSplitter::finish() { return drain(true); }

ChatSplitter::Piece ChatSplitter::drain(bool final) {
  static const std::string kOpenThink = "<think>", kCloseThink = "</think>", kToolOpen = "<tool_call>";
  Piece out;
  auto emit_content = [&](std::string s) {
    if (!content_started_) {  // the template puts "\n\n" after </think>
      size_t b = s.find_first_not_of("\r\n");
      s = b == std::string::npos ? "" : s.substr(b);
      if (!s.empty()) content_started_ = true;
    }
    out.content += s;
  };
  for (;;) {
    if (mode_ == Mode::kStart) {  // an opening <think> may still come first
      size_t lead = buf_.find_first_not_of(" \r\n");
      if (lead == std::string::npos) {
        if (final) buf_.clear();
        return out;
      }
      std::string rest = buf_.substr(lead);
      if (rest.compare(0, kOpenThink.size(), kOpenThink) == 0) {
        buf_ = rest.substr(kOpenThink.size());
        mode_ = Mode::kReasoning;
        continue;
      }
      if (!final && kOpenThink.compare(0, rest.size(), rest) == 0) return out;  // maybe "<thi"
      mode_ = Mode::kContent;
      continue;
    }
    if (mode_ == Mode::kReasoning) {
      size_t e = buf_.find(kCloseThink);
      if (e != std::string::npos) {
        out.reasoning += buf_.substr(0, e);
        buf_.erase(0, e + kCloseThink.size());
        mode_ = Mode::kContent;
        continue;
      }
      size_t hold = final ? 0 : partial_suffix(buf_, kCloseThink);
      out.reasoning += buf_.substr(0, buf_.size() - hold);
      buf_.erase(0, buf_.size() - hold);
      return out;
    }
    if (mode_ == Mode::kContent) {
      size_t t = tools_enabled_ ? buf_.find(kToolOpen) : std::string::npos;
      if (t != std::string::npos) {
        emit_content(buf_.substr(0, t));
        out.tools = buf_.substr(t);
        buf_.clear();
        mode_ = Mode::kTools;
        return out;
      }
      size_t hold = (final || !tools_enabled_) ? 0 : partial_suffix(buf_, kToolOpen);
      emit_content(buf_.substr(0, buf_.size() - hold));
      buf_.erase(0, buf_.size() - hold);
      return out;
    }
    out.tools += buf_;  // kTools
    buf_.clear();
    return out;
  }
}

}  // namespace ds::server
