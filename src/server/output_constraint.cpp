// OutputConstraint: phase changes and the per-token checks.
#include "server/output_constraint.h"

namespace ds::server {

namespace {
const std::string kCloseThink = "</think>";
}

OutputConstraint::OutputConstraint(std::shared_ptr<const tok::Tokenizer> tok, bool after_think, std::vector<int32_t> forced,
                                   std::vector<std::string> choices, std::optional<JsonAutomaton> json)
    : tok_(std::move(tok)),
      phase_(Phase::kThinking),
      forced_(std::move(forced)),
      choices_(std::move(choices)),
      json_(std::move(json)) {
  if (!after_think) next_phase();
}

void OutputConstraint::next_phase() {
  if (n_forced_ < forced_.size()) phase_ = Phase::kForced;
  else if (!choices_.empty()) phase_ = Phase::kChoice;
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
    case Phase::kChoice: {  // the text so far plus this token's must still begin some choice
      const std::string_view t = text(token);
      if (t.empty() || tok_->is_special(token)) return false;
      for (const std::string& c : choices_)
        if (c.size() >= chosen_.size() + t.size() && c.compare(chosen_.size(), t.size(), t) == 0 &&
            c.compare(0, chosen_.size(), chosen_) == 0)
          return true;
      return false;
    }
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
    case Phase::kChoice:
      chosen_ += text(token);
      for (const std::string& c : choices_)
        if (c == chosen_) {
          choices_.clear();
          return next_phase();
        }
      return;
    case Phase::kJson: json_->push(text(token)); return;
    case Phase::kFree: return;
  }
}

int32_t OutputConstraint::only() const { return phase_ == Phase::kForced ? forced_[n_forced_] : -1; }

bool OutputConstraint::done() const { return phase_ == Phase::kJson && json_->complete(); }

}  // namespace ds::server
