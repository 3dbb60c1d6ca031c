// Stop strings, reasoning split and Qwen tool-call parsing.
#include "server/output_text.h"

#include <algorithm>
#include <random>

namespace ds::server {

using json = nlohmann::json;

namespace {

// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_suffix(const std::string& s, const std::string& tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.compare(s.size() - n, n, tag, 0, n) == 0) return n;
  return 0;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string call_id() {
  static thread_local std::mt19937_64 g(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += hex[g() % 16];
  return id;
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
// tool calls
//
namespace {

const json* find_tool_params(const json& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const auto& t : tools) {
    const json& fn = t.contains("function") ? t["function"] : t;
    if (fn.is_object() && fn.value("name", "") == name && fn.contains("parameters")) return &fn["parameters"];
  }
  return nullptr;
}

bool parse_one(const std::string& body, const json& tools, ToolCall& call) {
  std::string b = trim(body);
  if (!b.empty() && b[0] == '{') {  // {"name": ..., "arguments": {...}}
    json j = json::parse(b, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
    call.name = j["name"].get<std::string>();
    json args = j.contains("arguments") ? j["arguments"] : (j.contains("parameters") ? j["parameters"] : json::object());
    if (args.is_string()) {
      json parsed = json::parse(args.get<std::string>(), nullptr, false);
      if (!parsed.is_discarded()) args = parsed;
    }
    call.arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
    return true;
  }
  // <function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>
  const std::string fopen = "<function=";
  size_t f = b.find(fopen);
  if (f == std::string::npos) return false;
  size_t fe = b.find('>', f);
  if (fe == std::string::npos) return false;
  call.name = trim(b.substr(f + fopen.size(), fe - f - fopen.size()));
  if (call.name.empty()) return false;
  const json* params = find_tool_params(tools, call.name);
  json args = json::object();
  size_t pos = fe + 1;
  const std::string popen = "<parameter=", pclose = "</parameter>";
  for (;;) {
    size_t p = b.find(popen, pos);
    if (p == std::string::npos) break;
    size_t pe = b.find('>', p);
    if (pe == std::string::npos) return false;
    std::string key = trim(b.substr(p + popen.size(), pe - p - popen.size()));
    size_t close = b.find(pclose, pe);
    size_t next = b.find(popen, pe);
    size_t end = close;
    if (end == std::string::npos || (next != std::string::npos && next < end)) end = next;
    if (end == std::string::npos) end = b.find("</function>", pe);
    if (end == std::string::npos) end = b.size();
    std::string value = b.substr(pe + 1, end - pe - 1);
    if (!value.empty() && value.front() == '\n') value.erase(0, 1);
    if (!value.empty() && value.back() == '\n') value.pop_back();
    std::string type;
    if (params && params->is_object() && params->contains("properties") && (*params)["properties"].contains(key) &&
        (*params)["properties"][key].is_object())
      type = (*params)["properties"][key].value("type", "");
    json v = value;
    if (type != "string") {
      json parsed = json::parse(value, nullptr, false);
      if (!parsed.is_discarded()) v = parsed;
    }
    args[key] = v;
    pos = end == close && close != std::string::npos ? close + pclose.size() : end;
  }
  call.arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
  return true;
}

}  // namespace

bool parse_tool_calls(const std::string& text, const json& tools, std::vector<ToolCall>& calls) {
  const std::string open = "<tool_call>", close = "</tool_call>";
  std::vector<ToolCall> out;
  size_t pos = text.find(open);
  if (pos == std::string::npos) return false;
  while (pos != std::string::npos) {
    size_t start = pos + open.size();
    size_t end = text.find(close, start);
    std::string body = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    ToolCall c;
    if (!parse_one(body, tools, c)) return false;
    c.id = call_id();
    out.push_back(std::move(c));
    if (end == std::string::npos) break;
    pos = text.find(open, end + close.size());
    // only whitespace may sit between calls
    if (trim(text.substr(end + close.size(), pos == std::string::npos ? std::string::npos : pos - end - close.size())) != "")
      return false;
  }
  calls = std::move(out);
  return true;
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
        tool_text_ = buf_.substr(t);
        buf_.clear();
        mode_ = Mode::kTools;
        return out;
      }
      size_t hold = (final || !tools_enabled_) ? 0 : partial_suffix(buf_, kToolOpen);
      emit_content(buf_.substr(0, buf_.size() - hold));
      buf_.erase(0, buf_.size() - hold);
      return out;
    }
    tool_text_ += buf_;  // kTools
    buf_.clear();
    return out;
  }
}

}  // namespace ds::server
