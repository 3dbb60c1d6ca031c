// Parity with Hugging Face tokenizers 0.23 on the committed corpus (tests/data/tokenizer/
// corpus_ids.json, from tools/make_tokenizer_reference.py): ids for the file's own regex and
// for the Qwen3.5 regex, decodes, round trips and streaming.
#include <gtest/gtest.h>

#include <random>

#include "tok_test_util.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/unicode_text.h"

namespace ds::tok::test {
namespace {

const char* kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const nlohmann::json& cases() {
  static nlohmann::json c = read_json(std::string(DS_TEST_DATA_DIR) + "/tokenizer/corpus_ids.json")["cases"];
  return c;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += std::to_string(x) + ",";
  return s;
}

void check_ids(const Tokenizer& t, const char* field) {
  size_t n_ok = 0, n_shown = 0;
  for (const auto& c : cases()) {
    std::string text = c["text"];
    auto ids = t.encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    auto want = c[field].get<std::vector<int32_t>>();
    if (*ids == want) {
      ++n_ok;
    } else if (n_shown++ < 5) {
      ADD_FAILURE() << "text " << nlohmann::json(text).dump() << "\n got  " << show(*ids) << "\n want " << show(want);
    }
  }
  std::printf("[parity] %s: %zu / %zu identical (%.2f%%)\n", field, n_ok, cases().size(), 100.0 * n_ok / cases().size());
  EXPECT_EQ(n_ok, cases().size());
}

TEST(TokenizerParity, CorpusIdsMatchHf) {
  DS_REQUIRE_QWEN3();
  ASSERT_GT(cases().size(), 800u);
  check_ids(*qwen3(), "ids");
}

TEST(TokenizerParity, CorpusIdsMatchHfWithQwen35Regex) {
  DS_REQUIRE_QWEN3();
  auto j = read_json(qwen3_dir() + "/tokenizer.json");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kQwen35Regex;
  auto t = Tokenizer::from_json(j.dump(), read_all(qwen3_dir() + "/tokenizer_config.json"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  check_ids(*t.value(), "ids_qwen3_5_regex");
}

TEST(TokenizerParity, DecodeMatchesHf) {
  DS_REQUIRE_QWEN3();
  size_t n_ok = 0;
  for (const auto& c : cases()) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    auto full = qwen3()->decode(ids, false);
    auto skip = qwen3()->decode(ids, true);
    ASSERT_TRUE(full.ok() && skip.ok());
    EXPECT_EQ(*full, c["decoded"].get<std::string>());
    EXPECT_EQ(*skip, c["decoded_skip"].get<std::string>());
    n_ok += *full == c["decoded"].get<std::string>() && *skip == c["decoded_skip"].get<std::string>();
  }
  EXPECT_EQ(n_ok, cases().size());
}

TEST(TokenizerParity, DecodeOfEncodeIsNfc) {
  DS_REQUIRE_QWEN3();
  for (const auto& c : cases()) {
    std::string text = c["text"];
    auto ids = qwen3()->encode(text);
    ASSERT_TRUE(ids.ok());
    auto back = qwen3()->decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, nfc(text)) << nlohmann::json(text).dump();
  }
}

std::string stream_all(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
  StreamDecoder sd(t, skip);
  std::string out;
  for (int32_t id : ids) {
    auto piece = sd.push(id);
    EXPECT_TRUE(piece.ok());
    // Every emitted piece must itself be complete UTF-8.
    EXPECT_TRUE(is_valid_utf8(*piece));
    out += *piece;
  }
  return out + sd.finish();
}

TEST(TokenizerParity, StreamingEqualsFullDecode) {
  DS_REQUIRE_QWEN3();
  for (const auto& c : cases()) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    for (bool skip : {false, true}) EXPECT_EQ(stream_all(*qwen3(), ids, skip), *qwen3()->decode(ids, skip));
  }
}

TEST(TokenizerParity, StreamingRandomIdsNeverSplitsUtf8) {
  DS_REQUIRE_QWEN3();
  // Random ids include lone continuation bytes and partial sequences: the streamed text must
  // still equal the lossy full decode, piece by piece valid.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> any(0, qwen3()->vocab_size() - 1), byte_tok(0, 255);
  for (int rep = 0; rep < 300; ++rep) {
    std::vector<int32_t> ids;
    int n = 1 + static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) ids.push_back(rng() % 2 ? byte_tok(rng) : any(rng));
    EXPECT_EQ(stream_all(*qwen3(), ids, false), *qwen3()->decode(ids));
  }
}

TEST(TokenizerParity, ConfigFacts) {
  DS_REQUIRE_QWEN3();
  const auto& t = *qwen3();
  EXPECT_EQ(t.eos_id().value_or(-1), 151645);
  EXPECT_EQ(t.pad_id().value_or(-1), 151643);
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_NE(t.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_TRUE(t.is_special(151644));
  EXPECT_FALSE(t.is_special(151667));  // <think> is added but not special
  EXPECT_EQ(t.token_id("<think>").value_or(-1), 151667);
  EXPECT_EQ(t.vocab_size(), 151669);
}

}  // namespace
}  // namespace ds::tok::test
