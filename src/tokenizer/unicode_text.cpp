// UTF-8 validation and lossy decoding (hand-written byte rules from RFC 3629; no character
// tables) and NFC through utf8proc.
#include "tokenizer/unicode_text.h"

#include <utf8proc.h>

#include <cstdlib>

namespace ds::tok {
namespace {

// Length of the valid UTF-8 sequence at s[i], 0 if invalid or truncated. `*prefix` receives
// how many bytes form a valid (possibly incomplete) prefix — the "maximal subpart".
size_t seq_len(std::string_view s, size_t i, size_t* prefix) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  *prefix = 1;
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) return 0;
    unsigned char d = b(i + k);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (d < l || d > h) return 0;
    *prefix = k + 1;
  }
  return need;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0, prefix;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = seq_len(s, i, &prefix);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string nfc(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &out,
                                    static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);  // only reachable for invalid UTF-8, which callers reject first
  std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

void append_utf8_lossy(std::string_view bytes, std::string& out) {
  size_t i = 0, prefix;
  while (i < bytes.size()) {
    size_t n = seq_len(bytes, i, &prefix);
    if (n) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += prefix;
    }
  }
}

size_t utf8_stable_prefix(std::string_view bytes) {
  // A truncated sequence can only start in the last 3 bytes.
  size_t start = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (size_t i = start; i < bytes.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c < 0xC2 || c > 0xF4) continue;
    size_t prefix;
    size_t n = seq_len(bytes, i, &prefix);
    if (n == 0 && i + prefix == bytes.size()) return i;  // valid so far, just cut short
  }
  return bytes.size();
}

}  // namespace ds::tok
