// TokenConstraint: a per-request rule on which tokens may come next (structured output, forced
// tool-call openings). The engine samples such requests on the CPU: the sampler draws a token,
// and while the constraint refuses it, masks it and draws again. Implementations live with the
// caller (the server knows the text of tokens); the engine only sees token ids.
#pragma once

#include <cstdint>

namespace ds {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // May `token` come next? Called on the engine thread, possibly for many candidates.
  virtual bool allows(int32_t token) const = 0;
  // `token` was sampled (always an allowed one).
  virtual void accept(int32_t token) = 0;
  // The output is complete: the engine ends the request now (finish reason "stop").
  virtual bool done() const = 0;
  // The one token allowed next, when there is exactly one (saves the sampler its redraws); else -1.
  virtual int32_t only() const { return -1; }
};

}  // namespace ds
