// The tokenize / detokenize / chat-template subcommands of the deltaserve binary, run on the
// npm-fetched Qwen3 tokenizer folder (tokenizer files only, no weights).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <sys/wait.h>

#include "tok_test_util.h"

namespace ds::tok::test {
namespace {

struct CmdResult {
  int rc;
  std::string out;
};

CmdResult run(const std::string& args) {
  std::string cmd = std::string(DS_BINARY) + " " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

void write(const std::string& path, const std::string& text) {
  FILE* f = fopen(path.c_str(), "wb");
  fwrite(text.data(), 1, text.size(), f);
  fclose(f);
}

TEST(TokenizerCli, TokenizeDetokenizeChatTemplate) {
  DS_REQUIRE_QWEN3();
  const std::string m = "--model " + qwen3_dir();
  CmdResult r = run("tokenize " + m + " --text 'Hello <|im_end|> world'");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "[9707,220,151645,1879]\n");
  r = run("detokenize " + m + " --ids 9707,220,151645");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "Hello <|im_end|>");
  r = run("detokenize " + m + " --skip-special-tokens --ids 9707,220,151645");
  EXPECT_EQ(r.out, "Hello ");
  std::string dir = ::testing::TempDir();
  write(dir + "/msgs.json", R"([{"role": "user", "content": "hi"}])");
  write(dir + "/kw.json", R"({"enable_thinking": false})");
  write(dir + "/text.txt", "a\nb");
  r = run("tokenize " + m + " --file " + dir + "/text.txt");
  EXPECT_EQ(r.out, "[64,198,65]\n");
  r = run("chat-template " + m + " --messages " + dir + "/msgs.json --kwargs " + dir + "/kw.json --add-generation-prompt");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Errors: nonzero exit, nothing on stdout.
  r = run("detokenize " + m + " --ids 1,x");
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(r.out, "");
  r = run("tokenize --model /nonexistent --text hi");
  EXPECT_NE(r.rc, 0);
  r = run("chat-template " + m + " --messages /nonexistent.json");
  EXPECT_NE(r.rc, 0);
}

}  // namespace
}  // namespace ds::tok::test
