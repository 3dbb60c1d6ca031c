// plan_memory: per-slot and per-block costs from the backend's own cache accounting.
#include "engine/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ds {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}

std::string MemoryPlan::report() const {
  const CacheGeometry& g = geometry;
  char line[512];
  std::snprintf(line, sizeof line,
                "memory: budget %s | weights + scratch + runtime %.2f GiB | reserve %.2f GiB | GDN state %d slots x %.1f MiB = %.2f GiB | "
                "KV pool %d blocks x %d = %lld tokens, %.2f GiB | total %.2f GiB",
                budget_bytes > 0 ? (std::to_string(budget_bytes / kGiB).substr(0, 5) + " GiB").c_str() : "none",
                held_bytes / kGiB, reserve_bytes / kGiB, g.n_slots, slot_bytes / (1024.0 * 1024.0), g.n_slots * slot_bytes / kGiB,
                g.n_blocks, g.block_size, static_cast<long long>(g.n_blocks) * g.block_size,
                g.n_blocks * block_bytes / kGiB, (held_bytes + reserve_bytes + g.n_slots * slot_bytes + g.n_blocks * block_bytes) / kGiB);
  return line;
}

Result<MemoryPlan> plan_memory(const Ops& ops, CacheGeometry geometry, double budget_bytes, int min_blocks) {
  MemoryPlan p;
  p.budget_bytes = budget_bytes;
  p.held_bytes = static_cast<double>(std::max(ops.bytes_in_use(), ops.device_bytes_used()));
  p.reserve_bytes = static_cast<double>(ops.runtime_reserve_bytes());
  CacheGeometry one = geometry;
  one.n_blocks = 0;
  one.n_slots = 1;
  p.slot_bytes = static_cast<double>(ops.cache_bytes_for(one));
  one.n_blocks = 1;
  one.n_slots = 0;
  p.block_bytes = static_cast<double>(ops.cache_bytes_for(one));
  if (budget_bytes > 0) {
    const double left = budget_bytes - p.held_bytes - p.reserve_bytes - geometry.n_slots * p.slot_bytes;
    const int blocks = p.block_bytes > 0 ? static_cast<int>(std::floor(std::max(0.0, left) / p.block_bytes)) : 0;
    geometry.n_blocks = blocks;
    p.geometry = geometry;
    if (blocks < min_blocks)
      return Status(ErrorCode::kResourceExhausted,
                    "--gpu-memory is too small: after weights, scratch, the runtime reserve and " + std::to_string(geometry.n_slots) +
                        " state slots it leaves room for " + std::to_string(blocks) + " KV blocks, and one context needs " +
                        std::to_string(min_blocks) + " (" + p.report() + ")");
  }
  p.geometry = geometry;
  return p;
}

}  // namespace ds
