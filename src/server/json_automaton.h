// JsonAutomaton: an incremental JSON validator, a byte-level pushdown automaton that says
// whether a text is a valid prefix of one JSON value (RFC 8259, UTF-8) and when that value is
// complete, optionally also a prefix of a value its JsonSchema allows. Used by constrained
// decoding (response_format) to test candidate tokens' text and
// by the tool-call stream to find where an arguments value ends. Knows nothing of tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/json_schema.h"

namespace ds::server {

class JsonAutomaton {
 public:
  struct Options {
    int max_depth = 64;           // deepest [ / { nesting accepted
    int max_whitespace_run = 32;  // consecutive whitespace bytes outside strings (a model can loop on newlines)
    char top_level = 0;           // '{' / '[': the top-level value must be an object / an array
    // The value must also satisfy this schema (JsonSchema's subset): types, declared and
    // required keys, items, string enums. Every accepted prefix can still be completed.
    std::shared_ptr<const JsonSchema> schema;
  };
  JsonAutomaton() : JsonAutomaton(Options{}) {}
  explicit JsonAutomaton(Options o);

  // Appends the bytes if they keep the text a valid prefix; otherwise returns false and leaves
  // the state as it was. After the value is complete only whitespace is accepted.
  bool push(std::string_view bytes);
  bool accepts(std::string_view bytes) const;  // push() on a copy

  // The value is whole and cannot go on. A top-level number is whole only once a byte after it
  // (whitespace) ends it: "12" could still become "123".
  bool complete() const;
  int depth() const { return static_cast<int>(stack_.size()); }

 private:
  enum class S : uint8_t {
    kValue,          // a value must start (after '[' ',' ':' or at the top)
    kArrayFirst,     // after '[': a value or ']'
    kObjectFirst,    // after '{': a key or '}'
    kKey,            // after ',' in an object: a key
    kColon,          // after a key
    kAfterValue,     // after a value inside a container: ',' or the closer
    kDone,           // the top-level value is complete
    kString,         // inside a string
    kEscape,         // after '\'
    kUnicode,        // inside \uXXXX
    kLowBackslash,   // after a high surrogate: '\' of the low one must follow
    kLowU,           // ... then 'u'
    kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp,
    kLiteral,        // inside true / false / null
  };
  bool step(uint8_t c);
  bool start_value(uint8_t c);
  void end_value();  // a value just ended: back to the container (or done)
  void close_container();  // '}' or ']' accepted
  bool after_number(uint8_t c);
  // Schema checks (no-ops without a schema).
  const JsonSchema::Node* node(int i) const { return i >= 0 && o_.schema ? &o_.schema->nodes[i] : nullptr; }
  bool string_ok(bool closing) const;  // str_ (+ the closing quote) fits the key / enum rules
  bool object_may_close() const;       // every required key of the open object is set
  bool object_may_continue() const;    // another key can still be added

  Options o_;
  std::vector<char> stack_;  // '{' or '[' per open container
  S s_ = S::kValue;
  bool in_key_ = false;      // the open string is an object key
  int ws_run_ = 0;
  int hex_left_ = 0;         // hex digits still due in \uXXXX
  uint32_t code_ = 0;        // the \u value read so far
  bool want_low_ = false;    // the \u being read must be a low surrogate
  int utf8_left_ = 0;        // continuation bytes still due in a string
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // allowed range of the next continuation byte
  const char* literal_ = nullptr;  // rest of true/false/null
  // schema state: the node of each open container (-1: unconstrained), the declared keys set
  // so far in each open object, the node of the value about to start, the current string's
  // bytes (keys and enum values), the property a key named, and integer-only numbers
  std::vector<int> nodes_;
  std::vector<std::vector<uint8_t>> seen_;
  int value_node_ = -1;
  std::string str_;
  int key_prop_ = -1;
  bool int_only_ = false;
};

}  // namespace ds::server
