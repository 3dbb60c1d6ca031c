// check_step_plan: the invariants every backend relies on, checked once per step.
#include "ops/step_plan.h"

#include "core/check.h"

namespace ds {

void check_step_plan(const StepPlan& plan) {
  const int n_seqs = plan.n_seqs();
  DS_ASSERT(n_seqs >= 1 && plan.cu_seqlens[0] == 0 && plan.cu_seqlens[n_seqs] == plan.n_tokens(), "bad cu_seqlens");
  DS_ASSERT(static_cast<int>(plan.positions.size()) == plan.n_tokens(), "positions size");
  DS_ASSERT(static_cast<int>(plan.n_past.size()) == n_seqs && static_cast<int>(plan.state_slots.size()) == n_seqs,
            "per-sequence arrays size");
  DS_ASSERT(plan.max_blocks >= 1 && static_cast<int>(plan.block_tables.size()) == n_seqs * plan.max_blocks,
            "block table size");
  for (int s = 0; s < n_seqs; ++s) DS_ASSERT(plan.cu_seqlens[s] <= plan.cu_seqlens[s + 1], "cu_seqlens not sorted");
  for (int r : plan.logit_rows) DS_ASSERT(r >= 0 && r < plan.n_tokens(), "logit row %d", r);
}

}  // namespace ds
