// MemoryPlan: one byte budget (--gpu-memory) split into what is already held (weights, scratch,
// the GPU runtime), a reserve for what serving allocates later,
// GDN state slots for every sequence, and as many KV blocks as the rest holds. Reported at start.
#pragma once

#include <string>

#include "core/status.h"
#include "ops/ops.h"

namespace ds {

struct MemoryPlan {
  double budget_bytes = 0;     // 0: no budget (pools sized by the caller)
  double held_bytes = 0;       // in use before the caches: weights, scratch and, on a GPU, the
                               // runtime's context (the device's own count when it is larger)
  double reserve_bytes = 0;    // headroom for what serving allocates later (graphs, sampler)
  double slot_bytes = 0;       // conv + recurrent state of one sequence, all GDN layers
  double block_bytes = 0;      // K + V of one block, all attention layers
  CacheGeometry geometry;      // the pools to allocate
  std::string report() const;  // one line: budget, weights, state slots, KV pool in tokens
};

// Sizes the pools of `geometry` (its n_slots is kept; its n_blocks becomes what fits, at
// least min_blocks) within budget_bytes on `ops`. budget_bytes <= 0 keeps geometry.n_blocks.
Result<MemoryPlan> plan_memory(const Ops& ops, CacheGeometry geometry, double budget_bytes, int min_blocks);

}  // namespace ds
