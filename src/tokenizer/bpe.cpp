// Byte-level BPE: ranks merges and applies them lowest rank first, leftmost on ties, which is
// what Hugging Face's BPE does (no dropout, no byte fallback, no continuing-subword prefix).
#include "tokenizer/bpe.h"

#include <array>
#include <climits>

namespace ds::tok {
namespace {

struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::unordered_map<uint32_t, uint8_t> from_cp;
  ByteMap() {
    // Printable bytes stand for themselves; the rest map to 256, 257, ... in byte order.
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      to_unicode[b] = s;
      from_cp[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }

bool unicode_to_bytes(std::string_view token, std::string* out) {
  const auto& m = byte_map();
  out->clear();
  for (size_t i = 0; i < token.size();) {
    unsigned char c = static_cast<unsigned char>(token[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;  // every mapped code point is below U+0800
    }
    auto it = m.from_cp.find(cp);
    if (it == m.from_cp.end()) return false;
    out->push_back(static_cast<char>(it->second));
  }
  return true;
}

BpeModel::BpeModel(BpeModel&& o) noexcept
    : id_to_bytes_(std::move(o.id_to_bytes_)),
      bytes_to_id_(std::move(o.bytes_to_id_)),
      merges_(std::move(o.merges_)),
      ignore_merges_(o.ignore_merges_) {
  std::copy(std::begin(o.byte_id_), std::end(o.byte_id_), byte_id_);
}

BpeModel& BpeModel::operator=(BpeModel&& o) noexcept {
  id_to_bytes_ = std::move(o.id_to_bytes_);
  bytes_to_id_ = std::move(o.bytes_to_id_);
  merges_ = std::move(o.merges_);
  ignore_merges_ = o.ignore_merges_;
  std::copy(std::begin(o.byte_id_), std::end(o.byte_id_), byte_id_);
  cache_.clear();
  return *this;
}

Result<BpeModel> BpeModel::build(const std::vector<std::pair<std::string, int32_t>>& vocab,
                                 const std::vector<std::pair<std::string, std::string>>& merges,
                                 bool ignore_merges) {
  BpeModel m;
  m.ignore_merges_ = ignore_merges;
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab) {
    if (id < 0) return invalid_argument("model.vocab: negative id " + std::to_string(id) + " for '" + tok + "'");
    max_id = std::max(max_id, id);
  }
  m.id_to_bytes_.resize(static_cast<size_t>(max_id + 1));
  m.bytes_to_id_.reserve(vocab.size());
  std::string bytes;
  for (const auto& [tok, id] : vocab) {
    if (!unicode_to_bytes(tok, &bytes))
      return invalid_argument("model.vocab: token '" + tok + "' (id " + std::to_string(id) +
                              ") is not ByteLevel-encoded text");
    if (!m.id_to_bytes_[id].empty()) return invalid_argument("model.vocab: id " + std::to_string(id) + " used twice");
    m.id_to_bytes_[id] = bytes;
    m.bytes_to_id_.emplace(bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = m.bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    if (it == m.bytes_to_id_.end())
      return invalid_argument("model.vocab lacks the single-byte token for byte " + std::to_string(b) +
                              " (byte-level BPE needs all 256)");
    m.byte_id_[b] = it->second;
  }
  m.merges_.reserve(merges.size());
  std::string a, b;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [ta, tb] = merges[r];
    auto ia = m.bytes_to_id_.end(), ib = ia, im = ia;
    if (unicode_to_bytes(ta, &a) && unicode_to_bytes(tb, &b)) {
      ia = m.bytes_to_id_.find(a);
      ib = m.bytes_to_id_.find(b);
      im = m.bytes_to_id_.find(a + b);
    }
    if (ia == m.bytes_to_id_.end() || ib == m.bytes_to_id_.end() || im == m.bytes_to_id_.end())
      return invalid_argument("model.merges[" + std::to_string(r) + "] ('" + ta + "', '" + tb +
                              "') refers to a token missing from model.vocab");
    uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    m.merges_.emplace(key, Merge{static_cast<int32_t>(r), im->second});  // first (lowest) rank wins
  }
  return m;
}

const std::string& BpeModel::id_bytes(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && id < size() ? id_to_bytes_[id] : kEmpty;
}

int32_t BpeModel::find(std::string_view bytes) const {
  auto it = bytes_to_id_.find(std::string(bytes));
  return it == bytes_to_id_.end() ? -1 : it->second;
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& syms) const {
  syms.clear();
  for (char c : word) syms.push_back(byte_id_[static_cast<uint8_t>(c)]);
  // Ranks of each adjacent pair, recomputed only next to a merge: O(n) per merge.
  std::vector<int32_t> rank(syms.size(), INT_MAX), merged(syms.size(), -1);
  auto score = [&](size_t i) {
    auto it = merges_.find((static_cast<uint64_t>(syms[i]) << 32) | static_cast<uint32_t>(syms[i + 1]));
    if (it == merges_.end()) {
      rank[i] = INT_MAX;
    } else {
      rank[i] = it->second.rank;
      merged[i] = it->second.merged;
    }
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) score(i);
  while (syms.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < syms.size(); ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == INT_MAX) break;
    syms[best] = merged[best];
    syms.erase(syms.begin() + static_cast<ptrdiff_t>(best) + 1);
    rank.erase(rank.begin() + static_cast<ptrdiff_t>(best) + 1);
    merged.erase(merged.begin() + static_cast<ptrdiff_t>(best) + 1);
    rank.back() = INT_MAX;
    if (best + 1 < syms.size()) score(best);
    else rank[best] = INT_MAX;
    if (best > 0) score(best - 1);
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    out.push_back(byte_id_[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    auto it = bytes_to_id_.find(std::string(word));
    if (it != bytes_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  bool cacheable = word.size() <= kCacheWordMax;
  std::string key;
  if (cacheable) {
    key.assign(word);
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<int32_t> syms;
  merge_word(word, syms);
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheMax) cache_.clear();
    cache_.emplace(std::move(key), syms);
  }
}

}  // namespace ds::tok
