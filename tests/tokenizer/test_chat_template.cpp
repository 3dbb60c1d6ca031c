// Chat-template parity with transformers 5.17 apply_chat_template (tests/data/tokenizer/
// renders.json): the Qwen3 template from the npm tokenizer and the Qwen3.8-style template in
// tests/data/tokenizer/, plus language features and errors with line and column.
#include <gtest/gtest.h>

#include "tok_test_util.h"
#include "tokenizer/chat_template.h"

namespace ds::tok::test {
namespace {

using ojson = nlohmann::ordered_json;

Result<std::string> render_src(const std::string& src, const ojson& ctx) {
  DS_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::parse(src));
  return t.render(ctx);
}

std::string must_render(const std::string& src, const ojson& ctx = ojson::object()) {
  auto r = render_src(src, ctx);
  EXPECT_TRUE(r.ok()) << r.status().message() << "\nsource: " << src;
  return r.ok() ? r.value() : "<error>";
}

std::string error_of(const std::string& src, const ojson& ctx = ojson::object()) {
  auto r = render_src(src, ctx);
  EXPECT_FALSE(r.ok()) << "expected an error for: " << src;
  return r.ok() ? "" : r.status().message();
}

TEST(ChatTemplateParity, RendersMatchTransformers) {
  auto data = ojson::parse(read_all(std::string(DS_TEST_DATA_DIR) + "/tokenizer/renders.json"));
  std::map<std::string, std::string> sources;
  sources["qwen3_8_style"] = read_all(std::string(DS_TEST_DATA_DIR) + "/tokenizer/qwen3_8_style_template.jinja");
  if (have_qwen3()) sources["qwen3"] = qwen3()->chat_template();
  size_t n = 0, n_ok = 0, n_skipped = 0;
  for (const auto& r : data["renders"]) {
    std::string name = r["template"];
    if (!sources.count(name)) { ++n_skipped; continue; }
    auto tmpl = ChatTemplate::parse(sources[name]);
    ASSERT_TRUE(tmpl.ok()) << name << ": " << tmpl.status().message();
    ChatRequest req;
    req.messages = r["messages"];
    req.tools = r["tools"];
    req.add_generation_prompt = r["add_generation_prompt"];
    req.kwargs = r["kwargs"];
    auto got = tmpl->render(req);
    ++n;
    if (r["error"].is_null()) {
      bool ok = got.ok() && got.value() == r["render"].get<std::string>();
      n_ok += ok;
      EXPECT_TRUE(ok) << name << " " << r.dump() << "\n got: " << (got.ok() ? got.value() : got.status().message());
    } else {
      bool ok = !got.ok() && got.status().message().find(r["error"].get<std::string>()) != std::string::npos;
      n_ok += ok;
      EXPECT_TRUE(ok) << name << " expected error '" << r["error"] << "' for " << r.dump();
    }
  }
  std::printf("[parity] renders: %zu / %zu identical (%.2f%%), %zu skipped\n", n_ok, n,
              100.0 * n_ok / std::max<size_t>(n, 1), n_skipped);
  EXPECT_EQ(n_ok, n);
  if (n_skipped) GTEST_SKIP() << "Qwen3 template renders skipped: run tools/fetch_test_data.sh (needs npm)";
}

TEST(ChatTemplate, WhitespaceControl) {
  // transformers renders with trim_blocks and lstrip_blocks.
  EXPECT_EQ(must_render("{% if true %}\nA\n{% endif %}\nB"), "A\nB");
  EXPECT_EQ(must_render("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(must_render("a  {%- if true -%}  b  {%- endif %}"), "ab");
  EXPECT_EQ(must_render("{{ 'a' }}\n{{- 'b' }}"), "ab");
  EXPECT_EQ(must_render("x {# note #}\ny"), "x y");
  EXPECT_EQ(must_render("{{ 1 }}\n"), "1\n");
}

TEST(ChatTemplate, LoopsAndScopes) {
  EXPECT_EQ(must_render("{% for x in [1,2,3] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}"), "11,22,33");
  EXPECT_EQ(must_render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(must_render("{% set y = 1 %}{% for x in [5] %}{% set y = x %}{% endfor %}{{ y }}"), "1");
  EXPECT_EQ(must_render("{% set ns = namespace(y=1) %}{% for x in [5] %}{% set ns.y = x %}{% endfor %}{{ ns.y }}"), "5");
  EXPECT_EQ(must_render("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"b", 1}, {"a", 2}}}}), "b=1;a=2;");
  EXPECT_EQ(must_render("{% for x in [1,2,3,4] if x is even %}{{ loop.index }}:{{ x }} {% endfor %}"), "1:2 2:4 ");
  EXPECT_EQ(must_render("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"), "02");
  EXPECT_EQ(must_render("{% for x in 'ab' %}{{ loop.revindex0 }}{{ loop.previtem }}{% endfor %}"), "10a");  // previtem is undefined on the first item: prints nothing
}

TEST(ChatTemplate, MacrosFiltersMethods) {
  EXPECT_EQ(must_render("{% macro m(a, b='z') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b='y') }}"), "[1z][2y]");
  EXPECT_EQ(must_render("{{ 'a,b,,c'.split(',') | length }}|{{ ' x '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi'.lstrip('\\n') }}"), "4|x|hi|hi");
  EXPECT_EQ(must_render("{{ 'héllo'[::-1] }}|{{ [1,2,3][1:] }}|{{ 'abc'[-1] }}|{{ [1,2,3][::-1] | join(',') }}"), "olléh|[2, 3]|c|3,2,1");
  EXPECT_EQ(must_render("{{ x | tojson }}", {{"x", {{"a", 1.5}, {"b", {true, nullptr, "é\n"}}, {"c", 1e-5}, {"d", 2.0}}}}),
            "{\"a\": 1.5, \"b\": [true, null, \"é\\n\"], \"c\": 1e-05, \"d\": 2.0}");
  EXPECT_EQ(must_render("{{ x | tojson(indent=2) }}", {{"x", {{"a", {1}}}}}), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(must_render("{{ none }}|{{ true }}|{{ [1,'a'] }}|{{ {'k': none} }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 / 2 }}|{{ 2 ** 10 }}"),
            "None|True|[1, 'a']|{'k': None}|3|-4|3.5|1024");
  EXPECT_EQ(must_render("{{ 'ab' in 'cabd' }}{{ 3 in [1,2] }}{{ 'k' in {'k': 1} }}{{ 'x' not in 'abc' }}"), "TrueFalseTrueTrue");
  EXPECT_EQ(must_render("{{ u is defined }}{{ u is not defined }}{{ n is none }}{{ 's' is string }}{{ {} is mapping }}", {{"n", nullptr}}),
            "FalseTrueTrueTrueTrue");
  EXPECT_EQ(must_render("{{ 'a' if false else 'b' }}{{ 'c' if true }}{{ x | default('d') }}{{ 'A~' ~ 1 }}"), "bcdA~1");
  EXPECT_EQ(must_render("{{ d.get('a') }}{{ d.get('z', 0) }}{{ d.keys() | list | length }}", {{"d", {{"a", 1}}}}), "101");
  EXPECT_EQ(must_render("{{ ('<a>'.startswith(('<', 'x'))) }}{{ 'abc'.endswith('bc') }}{{ 'a  b'.split() }}"), "TrueTrue['a', 'b']");
}

TEST(ChatTemplate, ErrorsNameLineAndColumn) {
  EXPECT_NE(error_of("hello\n  {{ raise_exception('boom') }}").find("template line 2 col 6: raise_exception: boom"), std::string::npos);
  EXPECT_NE(error_of("a\n{% if x %}\nb").find("template line 2 col 4: {% if %} is never closed with {% endif %}"), std::string::npos);  // never closed
  EXPECT_NE(error_of("{% frobnicate %}").find("line 1 col 4: unsupported or unexpected tag"), std::string::npos);
  EXPECT_NE(error_of("x\n\n   {{ y | frob }}").find("line 3 col 11: unsupported filter 'frob'"), std::string::npos);
  EXPECT_NE(error_of("{{ y is frob }}").find("unsupported test"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a'.zap() }}").find("unsupported method string.zap()"), std::string::npos);
  EXPECT_NE(error_of("{{ u.x }}").find("'u' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 + }}").find("line 1 col 8: expression expected"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc }}").find("string literal is never closed"), std::string::npos);
  EXPECT_NE(error_of("{{ x ").find("never closed"), std::string::npos);
  EXPECT_NE(error_of("{% set x %}a{% endset %}").find("not supported"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("cannot add string and int"), std::string::npos);
  EXPECT_NE(error_of("{% for x in none %}{% endfor %}").find("cannot iterate"), std::string::npos);
  EXPECT_NE(error_of("{{ f() }}").find("unknown function 'f'"), std::string::npos);
}

}  // namespace
}  // namespace ds::tok::test
