// Incremental detokenizer for streaming: feeds ids one at a time and returns only text that is
// final, holding back a UTF-8 sequence split across tokens. The concatenation of every push()
// and finish() equals Tokenizer::decode of all the ids.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace ds::tok {

class StreamDecoder {
 public:
  // `tok` must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = false)
      : tok_(tok), skip_special_(skip_special_tokens) {}
  // Text made final by `id` (possibly empty). Unknown ids fail and change nothing.
  Result<std::string> push(int32_t id);
  // Whatever is held back, with a truncated sequence replaced by U+FFFD; resets the decoder.
  std::string finish();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence (at most 3)
};

}  // namespace ds::tok
