// ToolCallStream: a small state machine over the buffered tool tail; each step consumes one
// recognisable piece (a tag, a parameter, argument bytes) or waits for more text.
#include "server/tool_calls.h"

#include <random>
#include <string_view>

namespace ds::server {

using json = nlohmann::json;

namespace {

const std::string kOpenTag = "<tool_call>", kCloseTag = "</tool_call>", kFunction = "<function=",
                  kFunctionEnd = "</function>", kParam = "<parameter=", kParamEnd = "</parameter>";

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string call_id() {
  static thread_local std::mt19937_64 g(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += hex[g() % 16];
  return id;
}

// s starts with `tag`: yes; s is a proper prefix of it: maybe (more text could make it so).
enum class Match { kNo, kMaybe, kYes };
Match starts_with(std::string_view s, std::string_view tag) {
  const size_t n = std::min(s.size(), tag.size());
  if (s.substr(0, n) != tag.substr(0, n)) return Match::kNo;
  return n == tag.size() ? Match::kYes : Match::kMaybe;
}

// Matches `{"name": "<string>", "arguments":` (or "parameters", any whitespace) at the start of
// s; on kYes sets the name and the offset just past the colon.
Match match_json_head(const std::string& s, std::string& name, size_t& end) {
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && is_ws(s[i])) ++i;
  };
  auto lit = [&](std::string_view t) {
    Match m = starts_with(std::string_view(s).substr(i), t);
    if (m == Match::kYes) i += t.size();
    return m;
  };
  Match m;
  for (std::string_view t : {"{", "\"name\"", ":"}) {
    ws();
    if ((m = lit(t)) != Match::kYes) return m;
  }
  ws();
  if (i == s.size()) return Match::kMaybe;
  if (s[i] != '"') return Match::kNo;
  size_t q = i + 1;
  while (q < s.size() && s[q] != '"') q += s[q] == '\\' ? 2 : 1;
  if (q >= s.size()) return Match::kMaybe;
  json n = json::parse(s.substr(i, q + 1 - i), nullptr, false);
  if (n.is_discarded() || !n.is_string()) return Match::kNo;
  i = q + 1;
  ws();
  if ((m = lit(",")) != Match::kYes) return m;
  ws();
  m = lit("\"arguments\"");
  if (m == Match::kNo) m = lit("\"parameters\"");
  if (m != Match::kYes) return m;
  ws();
  if ((m = lit(":")) != Match::kYes) return m;
  name = n.get<std::string>();
  end = i;
  return Match::kYes;
}

// The JSON type a tool's schema gives parameter `key` of function `fn` ("" if unknown).
std::string param_type(const json& tools, const std::string& fn, const std::string& key) {
  if (!tools.is_array()) return "";
  for (const auto& t : tools) {
    const json& f = t.contains("function") ? t["function"] : t;
    if (!f.is_object() || f.value("name", "") != fn || !f.contains("parameters")) continue;
    const json& p = f["parameters"];
    if (p.is_object() && p.contains("properties") && p["properties"].is_object() && p["properties"].contains(key) &&
        p["properties"][key].is_object())
      return p["properties"][key].value("type", "");
  }
  return "";
}

}  // namespace

ToolCallStream::ToolCallStream(json tools) : tools_(std::move(tools)) {}

std::vector<ToolCallDelta> ToolCallStream::push(const std::string& text) {
  std::vector<ToolCallDelta> out;
  if (state_ == State::kBad) {
    leftover_ += text;
    return out;
  }
  buf_ += text;
  while (step(false, out)) {
  }
  return out;
}

std::vector<ToolCallDelta> ToolCallStream::finish() {
  std::vector<ToolCallDelta> out;
  while (step(true, out)) {
  }
  switch (state_) {
    case State::kBody:
    case State::kJsonHead: fail(); break;  // a block that never named a function
    case State::kXmlParams: add_args(n_params_ ? "}" : "{}", out); break;
    case State::kOpen:
      if (!trim(buf_).empty()) fail();
      break;
    default: break;  // JSON arguments cut short stay as they came
  }
  buf_.clear();
  return out;
}

std::string ToolCallStream::take_leftover() { return std::exchange(leftover_, ""); }

void ToolCallStream::consume(size_t n) {
  block_ += buf_.substr(0, n);
  buf_.erase(0, n);
}

void ToolCallStream::fail() {
  leftover_ += block_ + buf_;
  block_.clear();
  buf_.clear();
  state_ = State::kBad;
}

void ToolCallStream::begin_call(const std::string& name, std::vector<ToolCallDelta>& out) {
  calls_.push_back(ToolCall{call_id(), name, ""});
  out.push_back(ToolCallDelta{calls_.size() - 1, calls_.back().id, name, ""});
}

void ToolCallStream::add_args(const std::string& fragment, std::vector<ToolCallDelta>& out) {
  calls_.back().arguments += fragment;
  if (!out.empty() && out.back().index == calls_.size() - 1) out.back().arguments += fragment;
  else out.push_back(ToolCallDelta{calls_.size() - 1, "", "", fragment});
}

bool ToolCallStream::step(bool final, std::vector<ToolCallDelta>& out) {
  switch (state_) {
    case State::kBad: return false;
    case State::kOpen: {  // between blocks: whitespace, then "<tool_call>"
      const size_t lead = buf_.find_first_not_of(" \t\r\n");
      if (lead == std::string::npos) return false;
      const Match m = starts_with(std::string_view(buf_).substr(lead), kOpenTag);
      if (m == Match::kMaybe) return false;
      if (m == Match::kNo) {
        fail();
        return false;
      }
      block_.clear();
      consume(lead + kOpenTag.size());
      state_ = State::kBody;
      return true;
    }
    case State::kBody: {  // "{" (JSON form) or "<function=NAME>"
      const size_t lead = buf_.find_first_not_of(" \t\r\n");
      if (lead == std::string::npos) return false;
      if (buf_[lead] == '{') {
        consume(lead);
        state_ = State::kJsonHead;
        return true;
      }
      const std::string_view rest = std::string_view(buf_).substr(lead);
      const Match m = starts_with(rest, kFunction);
      const size_t close = buf_.find('>', lead);
      if (m == Match::kNo || (m == Match::kYes && close == std::string::npos && final)) {
        fail();
        return false;
      }
      if (m == Match::kMaybe || close == std::string::npos) return false;
      const std::string name = trim(buf_.substr(lead + kFunction.size(), close - lead - kFunction.size()));
      if (name.empty()) {
        fail();
        return false;
      }
      consume(close + 1);
      begin_call(name, out);
      n_params_ = 0;
      state_ = State::kXmlParams;
      return true;
    }
    case State::kJsonHead: {
      std::string name;
      size_t end = 0;
      const Match m = match_json_head(buf_, name, end);
      if (m == Match::kMaybe) return false;
      if (m == Match::kNo) {
        fail();
        return false;
      }
      consume(end);
      begin_call(name, out);
      args_ = JsonAutomaton();
      args_started_ = args_string_ = false;
      args_text_.clear();
      state_ = State::kJsonArgs;
      return true;
    }
    case State::kJsonArgs: {  // raw argument bytes, as far as they keep the value valid
      std::string fragment;
      size_t i = 0;
      for (; i < buf_.size() && !args_.complete(); ++i) {
        const char c = buf_[i];
        if (!args_started_ && is_ws(c)) continue;
        if (!args_.push(std::string_view(&c, 1))) break;
        if (!args_started_) args_string_ = c == '"';
        args_started_ = true;
        (args_string_ ? args_text_ : fragment) += c;
      }
      consume(i);
      if (!fragment.empty()) add_args(fragment, out);
      if (args_.complete()) {
        if (args_string_) {  // "arguments": "{\"k\": 1}": send the decoded text
          json s = json::parse(args_text_, nullptr, false);
          add_args(s.is_string() ? s.get<std::string>() : args_text_, out);
        }
        state_ = State::kTail;  // the call object's "}" and the close tag remain
        return true;
      }
      if (!buf_.empty()) {  // a byte the value cannot take: the arguments end as they are
        state_ = State::kTail;
        return true;
      }
      return false;
    }
    case State::kTail: {  // the rest of a block whose call is complete: up to "</tool_call>"
      const size_t e = buf_.find(kCloseTag);
      if (e == std::string::npos) return false;
      buf_.erase(0, e + kCloseTag.size());
      block_.clear();
      state_ = State::kOpen;
      return true;
    }
    case State::kXmlParams: {
      const size_t lead = buf_.find_first_not_of(" \t\r\n");
      if (lead == std::string::npos) return false;
      const std::string_view rest = std::string_view(buf_).substr(lead);
      Match m = starts_with(rest, kParam);
      if (m == Match::kYes) {
        const size_t gt = buf_.find('>', lead);
        if (gt == std::string::npos) return false;
        // the value runs to the first tag that can end it
        size_t end = std::string::npos;
        for (const std::string& tag : {kParamEnd, kParam, kFunctionEnd, kCloseTag}) end = std::min(end, buf_.find(tag, gt + 1));
        if (end == std::string::npos && !final) return false;
        if (end == std::string::npos) end = buf_.size();
        const std::string key = trim(buf_.substr(lead + kParam.size(), gt - lead - kParam.size()));
        std::string value = buf_.substr(gt + 1, end - gt - 1);
        if (!value.empty() && value.front() == '\n') value.erase(0, 1);
        if (!value.empty() && value.back() == '\n') value.pop_back();
        json v = value;
        if (param_type(tools_, calls_.back().name, key) != "string") {
          json parsed = json::parse(value, nullptr, false);
          if (!parsed.is_discarded()) v = parsed;
        }
        add_args((n_params_++ ? "," : "{") + dump(json(key)) + ":" + dump(v), out);
        consume(buf_.compare(end, kParamEnd.size(), kParamEnd) == 0 ? end + kParamEnd.size() : end);
        return true;
      }
      const bool fn_end = starts_with(rest, kFunctionEnd) == Match::kYes, call_end = starts_with(rest, kCloseTag) == Match::kYes;
      if (fn_end || call_end) {
        add_args(n_params_ ? "}" : "{}", out);
        consume(lead + (fn_end ? kFunctionEnd.size() : 0));
        state_ = State::kTail;
        return true;
      }
      if (m == Match::kMaybe || starts_with(rest, kFunctionEnd) == Match::kMaybe || starts_with(rest, kCloseTag) == Match::kMaybe)
        return false;
      add_args(n_params_ ? "}" : "{}", out);  // stray text inside the function: the call ends here
      buf_.erase(0, lead);
      block_.clear();
      fail();
      return false;
    }
  }
  return false;
}

}  // namespace ds::server
