// Streaming detokenization: bytes are released up to the last point that more bytes cannot
// change (see utf8_stable_prefix), so no split UTF-8 sequence is ever emitted.
#include "tokenizer/stream_decoder.h"

#include "tokenizer/unicode_text.h"

namespace ds::tok {

Result<std::string> StreamDecoder::push(int32_t id) {
  const std::string* b = tok_.token_bytes(id);
  if (!b) return out_of_range("token id " + std::to_string(id) + " is not in the vocabulary");
  if (skip_special_ && tok_.is_special(id)) return std::string();
  pending_ += *b;
  size_t n = utf8_stable_prefix(pending_);
  std::string out;
  append_utf8_lossy(std::string_view(pending_).substr(0, n), out);
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  append_utf8_lossy(pending_, out);
  pending_.clear();
  return out;
}

}  // namespace ds::tok
