// Byte-level BPE model: vocabulary held as raw bytes (the ByteLevel byte<->unicode map is
// undone at load), merges by rank, and a bounded per-word cache. Knows nothing of added tokens.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace ds::tok {

// GPT-2's ByteLevel map: byte -> the UTF-8 of the printable code point standing for it.
const std::string& byte_to_unicode(uint8_t b);
// Inverse map over a whole token string; fails on a character outside the map.
bool unicode_to_bytes(std::string_view token, std::string* out);

class BpeModel {
 public:
  // `vocab`: token (ByteLevel-mapped text) -> id; `merges`: pairs in rank order.
  static Result<BpeModel> build(const std::vector<std::pair<std::string, int32_t>>& vocab,
                                const std::vector<std::pair<std::string, std::string>>& merges,
                                bool ignore_merges);
  BpeModel() = default;
  BpeModel(BpeModel&& o) noexcept;
  BpeModel& operator=(BpeModel&& o) noexcept;

  // Appends the ids of one pre-tokenized word (raw bytes) to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // Raw bytes of a vocabulary id; empty for ids the model does not define.
  const std::string& id_bytes(int32_t id) const;
  int32_t size() const { return static_cast<int32_t>(id_to_bytes_.size()); }
  // Id of the exact byte string, -1 if none.
  int32_t find(std::string_view bytes) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  void merge_word(std::string_view word, std::vector<int32_t>& syms) const;

  std::vector<std::string> id_to_bytes_;
  std::unordered_map<std::string, int32_t> bytes_to_id_;
  std::unordered_map<uint64_t, Merge> merges_;  // key: left id << 32 | right id
  int32_t byte_id_[256] = {};
  bool ignore_merges_ = false;

  // Per-word cache; cleared when it reaches kCacheMax entries to bound memory.
  static constexpr size_t kCacheMax = 200000;
  static constexpr size_t kCacheWordMax = 256;  // longer words are not cached
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace ds::tok
