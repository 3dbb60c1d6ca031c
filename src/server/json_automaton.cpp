// JsonAutomaton: one transition per byte; containers on a stack, everything else in `s_`; the
// optional schema adds checks at value starts, keys, string bytes, commas and closers.
#include "server/json_automaton.h"

namespace ds::server {

namespace {

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

JsonAutomaton::JsonAutomaton(Options o) : o_(std::move(o)) { value_node_ = o_.schema ? 0 : -1; }

bool JsonAutomaton::string_ok(bool closing) const {
  const JsonSchema::Node* n = in_key_ ? node(nodes_.empty() ? -1 : nodes_.back()) : node(value_node_);
  if (!n) return true;
  auto fits = [&](const std::string& option) {
    return closing ? option == str_ : option.compare(0, str_.size(), str_) == 0 && option.size() >= str_.size();
  };
  if (!in_key_) {  // an enum value
    if (n->enum_strings.empty()) return true;
    for (const std::string& e : n->enum_strings)
      if (fits(e)) return true;
    return false;
  }
  const std::vector<uint8_t>& seen = seen_.back();
  for (size_t i = 0; i < n->prop_names.size(); ++i) {
    if (n->prop_names[i] == str_ && closing) return !seen[i];  // declared: once only
    if (!seen[i] && fits(n->prop_names[i])) return true;
  }
  return n->additional;
}

bool JsonAutomaton::object_may_close() const {
  const JsonSchema::Node* n = node(nodes_.back());
  if (!n) return true;
  for (size_t i = 0; i < n->prop_names.size(); ++i)
    if (n->prop_required[i] && !seen_.back()[i]) return false;
  return true;
}

bool JsonAutomaton::object_may_continue() const {
  const JsonSchema::Node* n = node(nodes_.back());
  if (!n || n->additional) return true;
  for (uint8_t set : seen_.back())
    if (!set) return true;
  return false;
}

bool JsonAutomaton::push(std::string_view bytes) {
  JsonAutomaton next = *this;
  for (char c : bytes)
    if (!next.step(static_cast<uint8_t>(c))) return false;
  *this = std::move(next);
  return true;
}

bool JsonAutomaton::accepts(std::string_view bytes) const {
  JsonAutomaton copy = *this;
  return copy.push(bytes);
}

bool JsonAutomaton::complete() const { return s_ == S::kDone; }

void JsonAutomaton::close_container() {
  stack_.pop_back();
  nodes_.pop_back();
  seen_.pop_back();
  end_value();
}

void JsonAutomaton::end_value() {
  s_ = stack_.empty() ? S::kDone : S::kAfterValue;
  ws_run_ = 0;
}

bool JsonAutomaton::start_value(uint8_t c) {
  const bool top = stack_.empty();
  if (top && o_.top_level != 0 && c != static_cast<uint8_t>(o_.top_level)) return false;
  if (const JsonSchema::Node* n = node(value_node_)) {
    const uint8_t need = c == '{' ? JsonSchema::kObject : c == '[' ? JsonSchema::kArray : c == '"' ? JsonSchema::kString
                         : (c == 't' || c == 'f') ? JsonSchema::kBoolean : c == 'n' ? JsonSchema::kNull
                         : (c == '-' || is_digit(c)) ? uint8_t(JsonSchema::kNumber | JsonSchema::kInteger) : 0;
    if (!(n->types & need)) return false;
    int_only_ = !(n->types & JsonSchema::kNumber);
  } else {
    int_only_ = false;
  }
  switch (c) {
    case '{':
    case '[': {
      if (depth() >= o_.max_depth) return false;
      stack_.push_back(static_cast<char>(c));
      const JsonSchema::Node* n = node(value_node_);
      nodes_.push_back(n ? value_node_ : -1);
      seen_.emplace_back(c == '{' && n ? n->prop_names.size() : 0, 0);
      if (c == '[') value_node_ = n ? n->items : -1;
      s_ = c == '{' ? S::kObjectFirst : S::kArrayFirst;
      return true;
    }
    case '"':
      s_ = S::kString;
      in_key_ = false;
      str_.clear();
      return true;
    case '-': s_ = S::kNumMinus; return true;
    case '0': s_ = S::kNumZero; return true;
    case 't': literal_ = "rue"; s_ = S::kLiteral; return true;
    case 'f': literal_ = "alse"; s_ = S::kLiteral; return true;
    case 'n': literal_ = "ull"; s_ = S::kLiteral; return true;
    default:
      if (c >= '1' && c <= '9') {
        s_ = S::kNumInt;
        return true;
      }
      return false;
  }
}

// A number ends at the first byte that cannot continue it; that byte then acts on the container.
bool JsonAutomaton::after_number(uint8_t c) {
  end_value();
  return step(c);
}

bool JsonAutomaton::step(uint8_t c) {
  // whitespace between tokens (never inside strings, numbers or literals)
  const bool between = s_ == S::kValue || s_ == S::kArrayFirst || s_ == S::kObjectFirst || s_ == S::kKey ||
                       s_ == S::kColon || s_ == S::kAfterValue || s_ == S::kDone;
  if (between && is_ws(c)) {
    if (++ws_run_ > o_.max_whitespace_run) return false;
    return true;
  }
  if (between) ws_run_ = 0;
  // Inside a string, every byte but the closing quote (escapes included) must keep a declared
  // key or an enum value possible.
  const bool in_string = s_ == S::kString || s_ == S::kEscape || s_ == S::kUnicode || s_ == S::kLowBackslash ||
                         s_ == S::kLowU;
  const bool closing_quote = s_ == S::kString && c == '"' && utf8_left_ == 0;
  if (o_.schema && in_string && !closing_quote) {
    str_.push_back(static_cast<char>(c));
    if (!string_ok(/*closing=*/false)) return false;
  }
  switch (s_) {
    case S::kValue: return start_value(c);
    case S::kArrayFirst:
      if (c == ']') {
        close_container();
        return true;
      }
      return start_value(c);
    case S::kObjectFirst:
      if (c == '}') {
        if (!object_may_close()) return false;
        close_container();
        return true;
      }
      if (c == '"' && !object_may_continue()) return false;  // additionalProperties false, nothing declared
      [[fallthrough]];
    case S::kKey:
      if (c != '"') return false;
      s_ = S::kString;
      in_key_ = true;
      str_.clear();
      return true;
    case S::kColon:
      if (c != ':') return false;
      s_ = S::kValue;
      if (const JsonSchema::Node* n = node(nodes_.back())) value_node_ = key_prop_ >= 0 ? n->prop_nodes[key_prop_] : -1;
      else value_node_ = -1;
      return true;
    case S::kAfterValue:
      if (c == ',') {
        if (stack_.back() == '{') {
          if (!object_may_continue()) return false;
          s_ = S::kKey;
        } else {
          const JsonSchema::Node* n = node(nodes_.back());
          value_node_ = n ? n->items : -1;
          s_ = S::kValue;
        }
        return true;
      }
      if (c == '}' && stack_.back() == '{') {
        if (!object_may_close()) return false;
        close_container();
        return true;
      }
      if (c == ']' && stack_.back() == '[') {
        close_container();
        return true;
      }
      return false;
    case S::kDone: return false;
    case S::kString:
      if (closing_quote) {
        if (!string_ok(/*closing=*/true)) return false;
        if (in_key_) {
          key_prop_ = -1;
          if (const JsonSchema::Node* n = node(nodes_.back()))
            for (size_t i = 0; i < n->prop_names.size(); ++i)
              if (n->prop_names[i] == str_) {
                key_prop_ = static_cast<int>(i);
                seen_.back()[i] = 1;
              }
          s_ = S::kColon;
          in_key_ = false;
        } else {
          end_value();
        }
        return true;
      }
      if (utf8_left_ > 0) {
        if (c < utf8_lo_ || c > utf8_hi_) return false;
        --utf8_left_;
        utf8_lo_ = 0x80;
        utf8_hi_ = 0xBF;
        return true;
      }
      if (c == '\\') {
        s_ = S::kEscape;
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      if (c < 0x80) return true;
      // UTF-8: the lead byte fixes the count and the range of the first continuation byte
      if (c >= 0xC2 && c <= 0xDF) utf8_left_ = 1;
      else if (c == 0xE0) utf8_left_ = 2, utf8_lo_ = 0xA0;
      else if (c == 0xED) utf8_left_ = 2, utf8_hi_ = 0x9F;  // no UTF-16 surrogates
      else if (c >= 0xE1 && c <= 0xEF) utf8_left_ = 2;
      else if (c == 0xF0) utf8_left_ = 3, utf8_lo_ = 0x90;
      else if (c >= 0xF1 && c <= 0xF3) utf8_left_ = 3;
      else if (c == 0xF4) utf8_left_ = 3, utf8_hi_ = 0x8F;
      else return false;
      return true;
    case S::kEscape:
      if (c == 'u') {
        s_ = S::kUnicode;
        hex_left_ = 4;
        code_ = 0;
        return true;
      }
      switch (c) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
          s_ = S::kString;
          return true;
        default: return false;
      }
    case S::kUnicode: {
      const int h = hex_value(c);
      if (h < 0) return false;
      code_ = code_ * 16 + static_cast<uint32_t>(h);
      --hex_left_;
      // reject as soon as the digits so far rule the code out, so no accepted prefix is a dead end
      if (hex_left_ == 3 && want_low_ && code_ != 0xD) return false;
      if (hex_left_ == 2 && want_low_ != (code_ >= 0xDC && code_ <= 0xDF)) return false;
      if (hex_left_ > 0) return true;
      want_low_ = false;
      if (code_ >= 0xD800 && code_ <= 0xDBFF) {
        want_low_ = true;
        s_ = S::kLowBackslash;
      } else {
        s_ = S::kString;
      }
      return true;
    }
    case S::kLowBackslash:
      if (c != '\\') return false;
      s_ = S::kLowU;
      return true;
    case S::kLowU:
      if (c != 'u') return false;
      s_ = S::kUnicode;
      hex_left_ = 4;
      code_ = 0;
      return true;
    case S::kNumMinus:
      if (c == '0') s_ = S::kNumZero;
      else if (is_digit(c)) s_ = S::kNumInt;
      else return false;
      return true;
    case S::kNumZero:
      if (int_only_ && (c == '.' || c == 'e' || c == 'E')) return false;
      if (c == '.') s_ = S::kNumDot;
      else if (c == 'e' || c == 'E') s_ = S::kNumE;
      else if (is_digit(c)) return false;  // no leading zeros
      else return after_number(c);
      return true;
    case S::kNumInt:
      if (is_digit(c)) return true;
      if (int_only_ && (c == '.' || c == 'e' || c == 'E')) return false;
      if (c == '.') s_ = S::kNumDot;
      else if (c == 'e' || c == 'E') s_ = S::kNumE;
      else return after_number(c);
      return true;
    case S::kNumDot:
      if (!is_digit(c)) return false;
      s_ = S::kNumFrac;
      return true;
    case S::kNumFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') {
        s_ = S::kNumE;
        return true;
      }
      return after_number(c);
    case S::kNumE:
      if (c == '+' || c == '-') s_ = S::kNumESign;
      else if (is_digit(c)) s_ = S::kNumExp;
      else return false;
      return true;
    case S::kNumESign:
      if (!is_digit(c)) return false;
      s_ = S::kNumExp;
      return true;
    case S::kNumExp:
      if (is_digit(c)) return true;
      return after_number(c);
    case S::kLiteral:
      if (c != static_cast<uint8_t>(*literal_)) return false;
      if (*++literal_ == '\0') end_value();
      return true;
  }
  return false;
}

}  // namespace ds::server
