// The deltaserve binary end to end: `generate` prints the greedy ids as JSON on the last line
// of stdout, `logits` writes a .npy that matches transformers, bad input exits non-zero with
// a message on stderr and nothing on stdout.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/fixture.h"

namespace ds::test {
namespace {

struct CliRun {
  int code;
  std::string out, err;
};

CliRun run_cli(const std::string& args) {
  const std::string err_path = std::filesystem::temp_directory_path() / ("ds_cli_err_" + std::to_string(getpid()));
  const std::string cmd = std::string(DS_BINARY) + " " + args + " 2>" + err_path;
  CliRun r{};
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  FILE* e = fopen(err_path.c_str(), "r");
  while (e && (n = fread(buf.data(), 1, buf.size(), e)) > 0) r.err.append(buf.data(), n);
  if (e) fclose(e);
  std::filesystem::remove(err_path);
  return r;
}

std::string ids_arg(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

TEST(Cli, GenerateMatchesTransformersGreedy) {
  Reference ref = load_reference("tiny_wrapper_long");
  CliRun r = run_cli("generate --device cpu --model " + fixture_dir("tiny_wrapper_long") + " --ids " + ids_arg(ref.prompt_ids) +
              " --max-tokens 24 --chunk 50");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string last = r.out.substr(r.out.rfind('[', r.out.size()));
  auto ids = nlohmann::json::parse(last).get<std::vector<int32_t>>();
  EXPECT_EQ(ids, ref.greedy_ids);  // this fixture's smallest margin is above 0.03 and the tie rule is not hit
}

TEST(Cli, LogitsWritesNpy) {
  Reference ref = load_reference("tiny_causal_sharded");
  const std::string out = std::filesystem::temp_directory_path() / ("ds_cli_logits_" + std::to_string(getpid()) + ".npy");
  CliRun r = run_cli("logits --device cpu --model " + fixture_dir("tiny_causal_sharded") + " --ids " +
              ids_arg(ref.prompt_ids) + " --out " + out + " --chunk 16");
  ASSERT_EQ(r.code, 0) << r.err;
  auto a = read_npy_f32(out);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a.value().shape, ref.logits.shape);
  EXPECT_LE(max_err_over_std(a.value().data, ref.logits.data), 1e-4);
  std::filesystem::remove(out);
}

TEST(Cli, BadInputGivesClearErrors) {
  const std::string model = " --model " + fixture_dir("tiny_wrapper_mtp");
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"generate --device cpu" + model + " --ids 1,x,3", "'x' is not a non-negative integer"},
      {"generate --device cpu" + model + " --ids 1,-2", "'-2' is not a non-negative integer"},
      {"generate --device cpu" + model + " --ids 1,5000", "token id 5000 is outside the vocabulary"},
      {"logits --device cpu" + model + " --ids 1,5000 --out /tmp/x.npy", "token id 5000 is outside the vocabulary"},
      {"generate --device cpu --model /nonexistent --ids 1", "does not exist"},
      {"generate --device tpu" + model + " --ids 1", "unknown --device 'tpu'"},
      {"generate --device cpu" + model, "--ids is required"},
      {"serve --device cpu" + model + " --block-size 12", "--block-size must be a power of two, at least 2 (got 12)"},
      {"serve --device cpu" + model + " --block-size 0", "--block-size must be a power of two, at least 2 (got 0)"},
  };
  for (const auto& c : cases) {
    CliRun r = run_cli(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_EQ(r.out, "") << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\nstderr: " << r.err;
  }
}

}  // namespace
}  // namespace ds::test
