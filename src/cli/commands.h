// Subcommand registration: each group of `deltaserve` subcommands adds itself to the app.
// stdout carries only a command's result; logs and errors go to stderr.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ds {
// Prints "error: message" on stderr and ends the subcommand with exit code 1.
[[noreturn]] void cli_fail(const std::string& message);
// "1,2,3" -> ids ("" -> none); anything else fails naming the bad entry.
std::vector<int32_t> cli_parse_ids(const std::string& text);
// The help of --w4a8 (parse_act_int8_layers), on serve and bench model.
inline constexpr const char* kW4A8Help =
    "layer classes whose W4A16 linears read int8 inputs (W4A8): none, all, or a list of mlp, linear_attn, self_attn";

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
