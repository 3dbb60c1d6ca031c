// Output rules: the JSON automaton (valid and invalid prefixes, escapes, numbers, depth), the
// streaming tool-call parser (byte-by-byte equals whole, both Qwen forms, malformed text back
// as content), OutputConstraint phases, and the sampler's constrained draw.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "server/json_automaton.h"
#include "server/json_schema.h"
#include "server/output_constraint.h"
#include "server/tool_calls.h"
#include "tok_test_util.h"

namespace ds::server {
namespace {

using json = nlohmann::json;

// Pushes byte by byte; true if every byte was accepted.
bool prefix_ok(const std::string& s, JsonAutomaton::Options o = {}) {
  JsonAutomaton a(o);
  for (char c : s)
    if (!a.push(std::string_view(&c, 1))) return false;
  return true;
}
bool whole(const std::string& s, JsonAutomaton::Options o = {}) {
  JsonAutomaton a(o);
  return a.push(s) && a.complete();
}

TEST(JsonAutomaton, ValidDocumentsAreCompleteAndEveryPrefixIsAccepted) {
  for (const std::string doc : {R"({})", R"([])", R"({"a": [1, -2.5e+3, 0, 0.25, true, false, null], "b": {"c": ""}})",
                                R"("x\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00")", R"([[[]], {}])", "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"",
                                " {\"k\" :\n1 } ", "true", "-0", "12 "}) {
    EXPECT_TRUE(prefix_ok(doc)) << doc;
    for (size_t n = 0; n <= doc.size(); ++n) EXPECT_TRUE(prefix_ok(doc.substr(0, n))) << doc.substr(0, n);
    const bool bare_number = doc == "-0";
    EXPECT_EQ(whole(doc), !bare_number) << doc;  // "-0" could still grow: whole only after a delimiter
  }
}

TEST(JsonAutomaton, InvalidPrefixesAreRefusedAndLeaveTheStateAlone) {
  for (const std::string bad : {"}", "{]", "[1,]", "{\"a\" 1}", "{\"a\":1,}", "{1:2}", "01", "1.e5", "--1", "+1", ".5",
                                "tru e", "\"\\x\"", "\"\\u12G4\"", "\"a\nb\"", "[1 2]", "{} {}", "'a'", "\"\\uDE00\"",
                                "\"\\uD83D\\u0041\"", "\"\\uD83Dx\"", "\"\xc3\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"",
                                "\"\xf5\x80\x80\x80\""})
    EXPECT_FALSE(prefix_ok(bad)) << bad;
  for (const std::string open : {"1.", "-", "1e", "nul", "{\"a\":", "[", "\"\\u00"}) {  // fine so far, not whole
    EXPECT_TRUE(prefix_ok(open)) << open;
    EXPECT_FALSE(whole(open)) << open;
  }
  JsonAutomaton a;
  ASSERT_TRUE(a.push("{\"a\":"));
  EXPECT_FALSE(a.push("}"));       // refused ...
  EXPECT_TRUE(a.push("[1]}"));     // ... and the state is still after the colon
  EXPECT_TRUE(a.complete());
  EXPECT_FALSE(a.push("x"));       // nothing but whitespace after the value
  EXPECT_TRUE(a.push(" \n"));
}

TEST(JsonAutomaton, EveryAcceptedPrefixCanStillBeCompleted) {
  // the lone surrogate and leading-zero cases are refused at the first byte that rules them out
  EXPECT_FALSE(prefix_ok("\"\\uDC"));
  EXPECT_FALSE(prefix_ok("\"\\uD800\\u00"));
  EXPECT_FALSE(prefix_ok("\"\\uD800\\uE"));
  EXPECT_TRUE(prefix_ok("\"\\uD800\\uDF"));
  EXPECT_FALSE(prefix_ok("00"));
  EXPECT_FALSE(prefix_ok("-01"));
}

TEST(JsonAutomaton, NumbersEndOnlyAtADelimiter) {
  JsonAutomaton a;
  ASSERT_TRUE(a.push("[12"));
  EXPECT_TRUE(a.accepts("3"));
  EXPECT_TRUE(a.accepts(".5e-7]"));
  EXPECT_FALSE(a.accepts(".]"));
  ASSERT_TRUE(a.push("]"));
  EXPECT_TRUE(a.complete());
  JsonAutomaton top;
  ASSERT_TRUE(top.push("42"));
  EXPECT_FALSE(top.complete());
  ASSERT_TRUE(top.push("\n"));
  EXPECT_TRUE(top.complete());
}

JsonAutomaton::Options with_schema(const char* schema) {
  auto compiled = JsonSchema::compile(json::parse(schema));
  EXPECT_TRUE(compiled.ok()) << compiled.status().message();
  JsonAutomaton::Options o;
  o.schema = compiled.value();
  return o;
}

TEST(JsonSchema, ObjectsKeepToDeclaredRequiredAndTypedProperties) {
  const auto o = with_schema(R"({"type": "object", "additionalProperties": false, "required": ["city"],
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                     "unit": {"enum": ["C", "F"]}, "tags": {"type": "array", "items": {"type": "string"}}}})");
  for (const std::string doc : {R"({"city": "Oslo"})", R"({"days": 3, "city": "Oslo", "unit": "F"})",
                                R"({"city": "x", "tags": ["a", "b"], "days": -12})"}) {
    EXPECT_TRUE(whole(doc, o)) << doc;
    for (size_t n = 0; n <= doc.size(); ++n) EXPECT_TRUE(prefix_ok(doc.substr(0, n), o)) << doc.substr(0, n);
  }
  for (const std::string bad : {R"({})", R"({"days": 3})", R"({"town")", R"({"city": 5)", R"({"city": "a", "city")",
                                R"({"days": 1.5)", R"({"days": 1e3)", R"({"unit": "K")", R"({"unit": "CF")",
                                R"({"tags": [1)", R"([)", R"("x")"})
    EXPECT_FALSE(prefix_ok(bad, o)) << bad;
  // every declared key used: no comma can follow
  EXPECT_FALSE(prefix_ok(R"({"city": "a", "days": 1, "unit": "C", "tags": [],)", o));
  // the open object cannot close before "city"
  JsonAutomaton a(o);
  ASSERT_TRUE(a.push(R"({"days": 2)"));
  EXPECT_FALSE(a.accepts("}"));
  EXPECT_TRUE(a.accepts(R"(, "city": "")" "}"));
}

TEST(JsonSchema, UndeclaredKeysFollowAdditionalPropertiesAndTypesCanBeLists) {
  const auto open = with_schema(R"({"properties": {"a": {"type": ["integer", "null"]}}})");
  EXPECT_TRUE(whole(R"({"a": null, "zz": [1, {"q": true}]})", open));
  EXPECT_TRUE(whole(R"({"a": 7})", open));
  EXPECT_FALSE(prefix_ok(R"({"a": "s")", open));
  EXPECT_FALSE(prefix_ok(R"({"a": 1, "a")", open));  // a declared key once only
  EXPECT_TRUE(whole("[1, \"x\"]", with_schema("{}")));  // no constraint at all
  const auto str = with_schema(R"({"const": "a\"b"})");
  EXPECT_TRUE(whole(R"("a\"b")", str));
  EXPECT_FALSE(prefix_ok(R"("a")", str));
  const auto none = with_schema(R"({"type": "object", "additionalProperties": false})");
  EXPECT_TRUE(whole("{}", none));
  EXPECT_FALSE(prefix_ok("{\"", none));
}

TEST(JsonSchema, UnenforcedKeywordsAreErrorsNamingThem) {
  for (const auto& [schema, word] : std::vector<std::pair<const char*, const char*>>{
           {R"({"anyOf": []})", "'anyOf'"}, {R"({"properties": {"a": {"minimum": 1}}})", "properties.a."},
           {R"({"items": {"$ref": "#/x"}})", "'$ref'"}, {R"({"enum": [1, 2]})", "string values"},
           {R"({"type": "str"})", "not a JSON Schema type"}, {R"({"additionalProperties": {}})", "true or false"},
           {R"({"type": "integer", "enum": ["a"]})", "contradict"}}) {
    auto r = JsonSchema::compile(json::parse(schema));
    ASSERT_FALSE(r.ok()) << schema;
    EXPECT_NE(r.status().message().find(word), std::string::npos) << r.status().message();
  }
  EXPECT_TRUE(JsonSchema::compile(json::parse(R"({"title": "t", "description": "d", "default": 1, "strict": true})")).ok());
}

TEST(JsonAutomaton, DepthWhitespaceAndTopLevelLimits) {
  JsonAutomaton::Options o;
  o.max_depth = 3;
  EXPECT_TRUE(whole("[[[1]]]", o));
  EXPECT_FALSE(prefix_ok("[[[[", o));
  EXPECT_TRUE(prefix_ok("[{\"a\":[", o));
  EXPECT_FALSE(prefix_ok("[{\"a\":[{", o));
  EXPECT_TRUE(prefix_ok(std::string(64, '[')));   // default depth 64
  EXPECT_FALSE(prefix_ok(std::string(65, '[')));
  o = {};
  o.max_whitespace_run = 4;
  EXPECT_TRUE(whole("{    \"a\"    :    1    }", o));
  EXPECT_FALSE(prefix_ok("{     ", o));
  EXPECT_TRUE(whole("\"      \"", o));  // inside a string whitespace is content
  o = {};
  o.top_level = '{';
  EXPECT_FALSE(prefix_ok("[", o));
  EXPECT_FALSE(prefix_ok("\"", o));
  EXPECT_TRUE(whole(" {\"a\": [1]}", o));
}

const json kTools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
    "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])");

struct Parsed {
  std::vector<ToolCall> calls;  // as accumulated from the deltas
  std::vector<ToolCall> final;  // calls()
  std::string leftover;
  size_t n_deltas = 0;
};

// Feeds `text` in pieces of `step` bytes (0: all at once) and accumulates the deltas the way a
// client does.
Parsed run_stream(const std::string& text, size_t step) {
  ToolCallStream ts(kTools);
  Parsed p;
  auto take = [&](const std::vector<ToolCallDelta>& ds) {
    for (const auto& d : ds) {
      ++p.n_deltas;
      if (d.index == p.calls.size()) p.calls.push_back(ToolCall{d.id, d.name, ""});
      p.calls[d.index].arguments += d.arguments;
    }
    p.leftover += ts.take_leftover();
  };
  if (step == 0) step = text.size();
  for (size_t i = 0; i < text.size(); i += step) take(ts.push(text.substr(i, step)));
  take(ts.finish());
  p.final = ts.calls();
  return p;
}

void expect_same(const Parsed& a, const Parsed& b) {
  ASSERT_EQ(a.calls.size(), b.calls.size());
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name);
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments);
    EXPECT_EQ(a.calls[i].arguments, a.final[i].arguments);
    EXPECT_EQ(a.calls[i].id, a.final[i].id);
  }
  EXPECT_EQ(a.leftover, b.leftover);
}

TEST(ToolCallStream, XmlFormStreamsParameterByParameterAndEqualsWhole) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
      "</tool_call>";
  Parsed w = run_stream(text, 0);
  ASSERT_EQ(w.calls.size(), 2u);
  EXPECT_EQ(w.calls[0].name, "get_weather");
  EXPECT_EQ(w.calls[0].arguments, R"({"city":"123","days":3})");  // string by schema, int parsed
  EXPECT_EQ(w.calls[1].arguments, R"({"city":"Oslo"})");
  EXPECT_NE(w.final[0].id, w.final[1].id);
  EXPECT_EQ(w.leftover, "");
  Parsed b = run_stream(text, 1);
  expect_same(b, w);
  EXPECT_GT(b.n_deltas, 4u);  // header, each parameter and the close arrive separately
}

TEST(ToolCallStream, JsonFormStreamsTheRawArguments) {
  const std::string text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa}ris\", \"n\": [1, {}]}}\n</tool_call>";
  Parsed w = run_stream(text, 0);
  ASSERT_EQ(w.calls.size(), 1u);
  EXPECT_EQ(w.calls[0].name, "get_weather");
  EXPECT_EQ(w.calls[0].arguments, R"({"city": "Pa}ris", "n": [1, {}]})");
  for (size_t step : {1, 3, 7}) expect_same(run_stream(text, step), w);
  Parsed s = run_stream("<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}</tool_call>", 1);
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, R"({"a": 1})");  // arguments sent as a JSON string: decoded
}

TEST(ToolCallStream, MalformedTextComesBackAsContent) {
  for (size_t step : {0, 1}) {
    Parsed a = run_stream("<tool_call>\nnot a call\n</tool_call>", step);
    EXPECT_TRUE(a.calls.empty());
    EXPECT_EQ(a.leftover, "<tool_call>\nnot a call\n</tool_call>");
    Parsed b = run_stream("<tool_call>\n<function=f>\n</function>\n</tool_call> and then text", step);
    ASSERT_EQ(b.calls.size(), 1u);
    EXPECT_EQ(b.calls[0].arguments, "{}");
    EXPECT_EQ(b.leftover, " and then text");
    Parsed c = run_stream("<tool_call>\n<function=f>\n<parameter=x>\n1", step);  // cut short: closed as far as it came
    ASSERT_EQ(c.calls.size(), 1u);
    EXPECT_EQ(c.calls[0].arguments, R"({"x":1})");
    Parsed d = run_stream("<tool_call>\n<functi", step);
    EXPECT_TRUE(d.calls.empty());
    EXPECT_EQ(d.leftover, "<tool_call>\n<functi");
  }
}

// Byte tokens plus "</think>" and a special "<|im_end|>", as added tokens.
std::shared_ptr<tok::Tokenizer> tiny_tok() {
  json j = tok::test::tiny_tokenizer_json();
  for (auto [id, content, special] : {std::tuple{256, "</think>", false}, std::tuple{257, "<|im_end|>", true}}) {
    j["model"]["vocab"][content] = id;
    j["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                                 {"normalized", false}, {"special", special}});
  }
  auto t = tok::Tokenizer::from_json(j.dump(), "");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.value();
}

int32_t id_of(const tok::Tokenizer& t, const std::string& s) {
  auto ids = t.encode(s, false).value();
  EXPECT_EQ(ids.size(), 1u) << s;
  return ids[0];
}

TEST(OutputConstraint, ThinkingIsFreeThenForcedTokensThenAChoiceThenJson) {
  auto tok = tiny_tok();
  ASSERT_TRUE(tok->token_id("</think>"));
  const int32_t close = *tok->token_id("</think>");
  JsonAutomaton::Options o;
  o.top_level = '{';
  OutputConstraint c(tok, /*after_think=*/true, {id_of(*tok, "x"), id_of(*tok, "y")}, {"ab", "ac"}, JsonAutomaton(o));
  EXPECT_TRUE(c.allows(id_of(*tok, "}")));  // thinking: anything
  c.accept(id_of(*tok, "z"));
  c.accept(close);
  EXPECT_FALSE(c.allows(id_of(*tok, "y")));
  EXPECT_TRUE(c.allows(id_of(*tok, "x")));
  EXPECT_EQ(c.only(), id_of(*tok, "x"));
  c.accept(id_of(*tok, "x"));
  c.accept(id_of(*tok, "y"));
  EXPECT_TRUE(c.allows(id_of(*tok, "a")));  // one of the choices
  EXPECT_FALSE(c.allows(id_of(*tok, "b")));
  c.accept(id_of(*tok, "a"));
  EXPECT_TRUE(c.allows(id_of(*tok, "c")));
  EXPECT_FALSE(c.allows(id_of(*tok, "a")));
  c.accept(id_of(*tok, "c"));
  EXPECT_FALSE(c.allows(id_of(*tok, "[")));  // top level must be an object
  EXPECT_TRUE(c.allows(id_of(*tok, " ")));
  for (char ch : std::string("{\"k\":1")) c.accept(id_of(*tok, std::string(1, ch)));
  EXPECT_FALSE(c.done());
  EXPECT_FALSE(c.allows(*tok->token_id("<|im_end|>")));  // special tokens never enter the value
  c.accept(id_of(*tok, "}"));
  EXPECT_TRUE(c.done());
}

struct AllowSet : TokenConstraint {
  std::vector<int32_t> ok;
  bool allows(int32_t t) const override { return std::find(ok.begin(), ok.end(), t) != ok.end(); }
  void accept(int32_t) override {}
  bool done() const override { return false; }
};

TEST(Sampler, ConstrainedDrawsOnlyAllowedTokens) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i);  // 49 is best
  AllowSet allow;
  allow.ok = {3, 7};
  SamplingParams greedy;
  greedy.temperature = 0;
  Sampler g(greedy, 1);
  EXPECT_EQ(g.sample(logits, {}, {}, &allow).token, 7);  // the best allowed token
  SamplingParams hot;
  hot.temperature = 5;
  Sampler s(hot, 1);
  for (int i = 0; i < 50; ++i) {
    const int32_t t = s.sample(logits, {}, {}, &allow).token;
    EXPECT_TRUE(t == 3 || t == 7) << t;
  }
  allow.ok.clear();
  EXPECT_EQ(s.sample(logits, {}, {}, &allow).token, -1);
  EXPECT_EQ(g.sample(logits, {}, {}, &allow).token, -1);
}

}  // namespace
}  // namespace ds::server
