// The Split pre-tokenizer (behaviour "Isolated"): a PCRE2 regex compiled with UTF and Unicode
// properties (\p{L}, \s, case folding) and JIT, cutting text into matches and the gaps between.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace ds::tok {

class RegexSplit {
 public:
  // `pattern` is the Split pre-tokenizer's Regex exactly as written in tokenizer.json.
  static Result<std::shared_ptr<RegexSplit>> compile(const std::string& pattern);
  ~RegexSplit();
  RegexSplit(const RegexSplit&) = delete;
  RegexSplit& operator=(const RegexSplit&) = delete;

  // Appends the pieces of `text` (valid UTF-8) to `out`; concatenated they equal `text`.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  RegexSplit() = default;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace ds::tok
