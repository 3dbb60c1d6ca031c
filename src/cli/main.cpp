// deltaserve: one binary, one subcommand per job. A failing subcommand reports on stderr and
// throws CLI::RuntimeError(exit_code), which CLI11 turns into the process exit code.
#include <CLI/CLI.hpp>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"deltaserve: a native inference server for the qwen3_5 model family"};
  app.require_subcommand(1);
  ds::register_model_commands(app);
  ds::register_tokenizer_commands(app);
  ds::register_serve_commands(app);
  ds::register_bench_commands(app);
  ds::register_bench_model_command(*app.get_subcommand("bench"));
  CLI11_PARSE(app, argc, argv);
  return 0;
}
