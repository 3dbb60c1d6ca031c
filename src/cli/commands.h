// Subcommand registration: each group of `deltaserve` subcommands adds itself to the app.
// stdout carries only a command's result; logs and errors go to stderr.
#pragma once

#include <CLI/CLI.hpp>

namespace ds {
// logits, generate
void register_model_commands(CLI::App& app);
// tokenize, detokenize, chat-template
void register_tokenizer_commands(CLI::App& app);
// serve
void register_serve_commands(CLI::App& app);
// bench serve
void register_bench_commands(CLI::App& app);
// bench model (added to the `bench` group)
void register_bench_model_command(CLI::App& bench);
}  // namespace ds
