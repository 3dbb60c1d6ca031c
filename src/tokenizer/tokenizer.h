// Tokenizer: loads a Hugging Face tokenizer.json (+ tokenizer_config.json) for byte-level BPE
// and runs the whole pipeline: added tokens -> NFC -> regex split -> BPE; decode back to text.
// Knows nothing of models or chat turns (chat_template.h renders those).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/bpe.h"
#include "tokenizer/regex_split.h"

namespace ds::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool lstrip = false;      // the match swallows whitespace on its left
  bool rstrip = false;      // ... and on its right
  bool normalized = false;  // matched on NFC text rather than raw text
  bool special = false;     // dropped by decode(skip_special_tokens=true)
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static Result<std::shared_ptr<Tokenizer>> load_dir(const std::string& dir);
  // `config_json` may be empty (no tokenizer_config.json). `origin` names the source in errors.
  static Result<std::shared_ptr<Tokenizer>> from_json(std::string_view tokenizer_json, std::string_view config_json,
                                                      const std::string& origin = "tokenizer.json");

  // Token ids of `text` (UTF-8). Added tokens written in the text are recognized. With
  // add_special_tokens, BOS/EOS are added as tokenizer_config.json asks. Invalid UTF-8 fails.
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens = true) const;
  // Text of `ids`: bytes joined, invalid UTF-8 replaced by U+FFFD. Unknown ids fail.
  Result<std::string> decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // Raw bytes of one id (may be part of a UTF-8 sequence); nullptr for an unknown id.
  const std::string* token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(id_bytes_.size()); }
  std::optional<int32_t> token_id(std::string_view token_text) const;  // added tokens first, then vocab
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  std::optional<int32_t> pad_id() const { return pad_id_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // The checkpoint's chat_template from tokenizer_config.json ("" if none).
  const std::string& chat_template() const { return chat_template_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  Tokenizer() = default;
  // Splits `text` at added tokens (those with normalized == `normalized`): pieces with id -1
  // are plain text, the others are added-token matches.
  void split_added(std::string_view text, bool normalized, std::vector<std::pair<std::string_view, int32_t>>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const;

  BpeModel bpe_;
  std::shared_ptr<RegexSplit> split_;  // null: no Split pre-tokenizer (whole text is one word)
  bool nfc_ = false;
  std::vector<AddedToken> added_;
  std::vector<std::string> id_bytes_;  // decode bytes for every id, added tokens included
  std::vector<uint8_t> special_;       // [vocab_size] 1 if special
  bool first_byte_[2][256] = {};       // [normalized] bytes that can start an added token
  std::optional<int32_t> bos_id_, eos_id_, pad_id_;
  std::string bos_token_, eos_token_;
  bool add_bos_ = false, add_eos_ = false;
  std::string chat_template_;
};

}  // namespace ds::tok
