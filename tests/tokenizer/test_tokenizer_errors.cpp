// Synthetic tokenizers: added-token rules (lstrip/rstrip/normalized, leftmost-longest), BPE
// merge order, and clear errors for malformed or unsupported tokenizer.json / config.
#include <gtest/gtest.h>

#include "tok_test_util.h"
#include "tokenizer/stream_decoder.h"

namespace ds::tok::test {
namespace {

using json = nlohmann::json;

std::shared_ptr<Tokenizer> build(const json& j, const std::string& cfg = "") {
  auto t = Tokenizer::from_json(j.dump(), cfg);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? t.value() : nullptr;
}

std::string error_of(const json& j, const std::string& cfg = "") {
  auto t = Tokenizer::from_json(j.dump(), cfg);
  EXPECT_FALSE(t.ok());
  return t.ok() ? "" : t.status().message();
}

std::vector<int32_t> ids(const Tokenizer& t, const std::string& s) { return t.encode(s).value(); }

TEST(TokenizerSynthetic, MergesApplyLowestRankFirst) {
  // "ab" ranks before "bc": "abc" -> [ab, c]; with only "bc": [a, bc].
  auto t = build(tiny_tokenizer_json({{"a", "b"}, {"b", "c"}}));
  EXPECT_EQ(ids(*t, "abc"), (std::vector<int32_t>{256, 'c'}));
  auto u = build(tiny_tokenizer_json({{"b", "c"}, {"a", "b"}}));
  EXPECT_EQ(ids(*u, "abc"), (std::vector<int32_t>{'a', 256}));
  // "aaa" merges leftmost first.
  auto v = build(tiny_tokenizer_json({{"a", "a"}}));
  EXPECT_EQ(ids(*v, "aaa"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(ids(*v, "aaaa"), (std::vector<int32_t>{256, 256}));
}

TEST(TokenizerSynthetic, AddedTokensStripAndLongestMatch) {
  json j = tiny_tokenizer_json();
  j["added_tokens"] = json::array({
      {{"id", 300}, {"content", "<x>"}, {"lstrip", true}, {"rstrip", false}, {"normalized", false}, {"special", true}},
      {{"id", 301}, {"content", "<y>"}, {"lstrip", false}, {"rstrip", true}, {"normalized", false}, {"special", false}},
      {{"id", 302}, {"content", "<x>>"}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}},
      {{"id", 303}, {"content", "\u00e9!"}, {"normalized", true}, {"special", false}},
  });
  auto t = build(j);
  EXPECT_EQ(ids(*t, "a  <x>b"), (std::vector<int32_t>{'a', 300, 'b'}));    // lstrip eats the spaces
  EXPECT_EQ(ids(*t, "a<y> \n b"), (std::vector<int32_t>{'a', 301, 'b'}));  // rstrip eats space/newline
  EXPECT_EQ(ids(*t, "<x>>"), (std::vector<int32_t>{302}));                 // longest match wins
  EXPECT_EQ(ids(*t, "e\u0301!"), (std::vector<int32_t>{303}));             // normalized: matched after NFC
  EXPECT_EQ(*t->decode(std::vector<int32_t>{'a', 300, 301}, true), "a<y>");  // skip special only
  EXPECT_TRUE(t->is_special(300));
  EXPECT_FALSE(t->encode("bad \xff utf8").ok());
  EXPECT_FALSE(t->decode(std::vector<int32_t>{999}).ok());
  StreamDecoder sd(*t);
  EXPECT_FALSE(sd.push(-1).ok());
  // Stream of the bytes of "é" (C3 A9): nothing until the sequence completes.
  EXPECT_EQ(*sd.push(0xC3), "");
  EXPECT_EQ(*sd.push(0xA9), "\u00e9");
  EXPECT_EQ(*sd.push(0xE2), "");
  EXPECT_EQ(sd.finish(), "\xEF\xBF\xBD");  // a truncated tail becomes U+FFFD, as full decode does
}

TEST(TokenizerSynthetic, ConfigBosEosAndTemplate) {
  json j = tiny_tokenizer_json();
  j["added_tokens"] = json::array({{{"id", 256}, {"content", "<s>"}, {"special", true}},
                                   {{"id", 257}, {"content", "</s>"}, {"special", true}}});
  auto t = build(j, R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_bos_token": true,
                        "add_eos_token": true, "chat_template": [{"name": "default", "template": "T"}]})");
  EXPECT_EQ(ids(*t, "a"), (std::vector<int32_t>{256, 'a', 257}));
  EXPECT_EQ(t->encode("a", false).value(), (std::vector<int32_t>{'a'}));
  EXPECT_EQ(t->chat_template(), "T");
  EXPECT_NE(error_of(j, R"({"eos_token": "<nope>"})").find("eos_token '<nope>' is not a token"), std::string::npos);
  EXPECT_NE(error_of(j, "{oops").find("tokenizer_config.json: not a JSON object"), std::string::npos);
}

TEST(TokenizerSynthetic, MalformedTokenizerJsonIsAClearError) {
  EXPECT_NE(Tokenizer::from_json("{not json", "").status().message().find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(json::object()).find("missing \"model\""), std::string::npos);
  json j = tiny_tokenizer_json();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(error_of(j).find("model.type 'WordPiece' (only BPE)"), std::string::npos);
  j = tiny_tokenizer_json();
  j["model"]["merges"].push_back({"q", "zz"});
  EXPECT_NE(error_of(j).find("model.merges[0] ('q', 'zz') refers to a token missing from model.vocab"), std::string::npos);
  j = tiny_tokenizer_json();
  j["model"]["merges"].push_back(42);
  EXPECT_NE(error_of(j).find("model.merges[0] is neither"), std::string::npos);
  j = tiny_tokenizer_json();
  j["model"]["vocab"].erase(byte_to_unicode('a'));
  EXPECT_NE(error_of(j).find("lacks the single-byte token for byte 97"), std::string::npos);
  j = tiny_tokenizer_json();
  j["model"]["vocab"]["x"] = "seven";
  EXPECT_NE(error_of(j).find("model.vocab['x'] is not an integer id"), std::string::npos);
  j = tiny_tokenizer_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}+";
  EXPECT_NE(error_of(j).find("Split regex does not compile at offset"), std::string::npos);
  j = tiny_tokenizer_json();
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(error_of(j).find("normalizer 'Lowercase' (only NFC)"), std::string::npos);
  j = tiny_tokenizer_json();
  j["post_processor"] = {{"type", "TemplateProcessing"}};
  EXPECT_NE(error_of(j).find("post_processor 'TemplateProcessing'"), std::string::npos);
  j = tiny_tokenizer_json();
  j["added_tokens"] = json::array({{{"content", "<x>"}}});
  EXPECT_NE(error_of(j).find("added_tokens[0] needs an integer \"id\""), std::string::npos);
  j = tiny_tokenizer_json();
  j["added_tokens"] = json::array({{{"id", 400}, {"content", "<x>"}, {"single_word", true}}});
  EXPECT_NE(error_of(j).find("single_word = true"), std::string::npos);
  EXPECT_NE(Tokenizer::load_dir("/nonexistent-dir").status().message().find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace ds::tok::test
