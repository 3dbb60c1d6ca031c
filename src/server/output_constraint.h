// OutputConstraint: the TokenConstraint the chat/completions API hands the engine for
// tool_choice "required"/named and response_format json_object/json_schema. Phases, in order:
// thinking (free until "</think>", only when the prompt ends inside <think>), forced tokens
// (a tool-call opening, token by token), a choice (the text must become exactly one of a few
// strings: the tools' names), then either JSON (JsonAutomaton over the tokens' bytes; done once
// the value is whole) or free text.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/token_constraint.h"
#include "server/json_automaton.h"
#include "tokenizer/tokenizer.h"

namespace ds::server {

class OutputConstraint final : public TokenConstraint {
 public:
  // after_think: the output starts as reasoning; nothing is constrained until "</think>".
  // forced: i32 [n] tokens that must come next (after the reasoning). choices: then text equal
  // to one of these (none: skipped). json: then a JSON value.
  OutputConstraint(std::shared_ptr<const tok::Tokenizer> tok, bool after_think, std::vector<int32_t> forced,
                   std::vector<std::string> choices, std::optional<JsonAutomaton> json);

  bool allows(int32_t token) const override;
  void accept(int32_t token) override;
  bool done() const override;
  int32_t only() const override;

 private:
  enum class Phase { kThinking, kForced, kChoice, kJson, kFree };
  void next_phase();  // after thinking or forcing: the first phase with work left
  std::string_view text(int32_t token) const;

  std::shared_ptr<const tok::Tokenizer> tok_;
  Phase phase_;
  std::vector<int32_t> forced_;
  size_t n_forced_ = 0;
  std::vector<std::string> choices_;
  std::string chosen_;      // choice text so far
  std::optional<JsonAutomaton> json_;
  std::string think_tail_;  // last bytes of the reasoning, to find "</think>" across tokens
};

}  // namespace ds::server
