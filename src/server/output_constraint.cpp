// OutputConstraint: phase changes and the per-token checks.
#include "server/output_constraint.h"

namespace ds::server {

namespace {
const std::string kCloseThink = "</think>";
}

OutputConstraint::OutputConstraint(std::shared_ptr<const tok::Tokenizer> tok, bool after_think, std::vector<int32_t> forced,
                                   std::optional<JsonAutomaton> json)
    : tok_(std::move(tok)), phase_(Phase::kThinking), forced_(std::move(forced)), json_(std::move(json)) {
  if (!after_think) next_phase();
}

void OutputConstraint::next_phase() {
  if (n_forced_ < forced_.size()) phase_ = Phase::kForced;
  else phase_ = json_ ? Phase::kJson : Phase::kFree;
}

std::string_view OutputConstraint::text(int32_t token) const {
  const std::string* b = tok_->token_bytes(token);
  return b ? std::string_view(*b) : std::string_view();
}

bool OutputConstraint::allows(int32_t token) const {
  switch (phase_) {
    case Phase::kThinking:
    case Phase::kFree: return true;
    case Phase::kForced: return token == forced_[n_forced_];
    case Phase::kJson:
      // special tokens (EOS among them) never belong to the value; the engine ends the request
      // itself once the value is complete
      return !tok_->is_special(token) && json_->accepts(text(token));
  }
  return false;
}

void OutputConstraint::accept(int32_t token) {
  switch (phase_) {
    case Phase::kThinking:
      think_tail_ += text(token);
      if (think_tail_.find(kCloseThink) != std::string::npos) return next_phase();
      if (think_tail_.size() > kCloseThink.size()) think_tail_.erase(0, think_tail_.size() - kCloseThink.size());
      return;
    case Phase::kForced:
      if (++n_forced_ == forced_.size()) next_phase();
      return;
    case Phase::kJson: json_->push(text(token)); return;
    case Phase::kFree: return;
  }
}

bool OutputConstraint::done() const { return phase_ == Phase::kJson && json_->complete(); }

}  // namespace ds::server
