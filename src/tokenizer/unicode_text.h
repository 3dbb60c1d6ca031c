// UTF-8 helpers for the tokenizer: validation, NFC (via utf8proc), lossy decoding with U+FFFD
// and the length of a complete UTF-8 prefix. No Unicode tables live here.
#pragma once

#include <string>
#include <string_view>

namespace ds::tok {

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, at most U+10FFFF).
bool is_valid_utf8(std::string_view s);
// NFC of well-formed UTF-8. ASCII input is returned unchanged without calling utf8proc.
std::string nfc(std::string_view s);
// Appends `bytes` to `out`, replacing each maximal invalid subpart with U+FFFD (the same
// policy as Rust's String::from_utf8_lossy, which Hugging Face tokenizers uses).
void append_utf8_lossy(std::string_view bytes, std::string& out);
// Length of the longest prefix of `bytes` that cannot change when more bytes are appended: the
// whole input unless it ends in a truncated but so-far valid multi-byte sequence.
size_t utf8_stable_prefix(std::string_view bytes);

}  // namespace ds::tok
