// plan_memory: the KV pool is what a byte budget leaves after weights, scratch and state slots.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_ops.h"
#include "engine/memory_plan.h"
#include "io/checkpoint.h"
#include "model/qwen3_5.h"

namespace ds {
namespace {

TEST(MemoryPlan, KvPoolIsWhatTheBudgetLeaves) {
  auto ck = Checkpoint::open(std::string(DS_TEST_DATA_DIR) + "/tiny_wrapper_mtp");
  ASSERT_TRUE(ck.ok());
  CpuOps ops;
  auto model = Qwen35Model::load(*ck.value(), ops);
  ASSERT_TRUE(model.ok());
  const CacheGeometry g = model.value()->cache_geometry(/*n_blocks=*/7, /*block_size=*/16, /*n_slots=*/3);

  auto none = plan_memory(ops, g, 0, 1);  // no budget: the caller's pools, reported
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none.value().geometry.n_blocks, 7);
  EXPECT_NE(none.value().report().find("budget none"), std::string::npos) << none.value().report();
  const MemoryPlan& p = none.value();
  EXPECT_GT(p.held_bytes, 0);
  EXPECT_GT(p.slot_bytes, 0);
  EXPECT_GT(p.block_bytes, 0);
  // The plan's costs are the backend's: 3 slots + 7 blocks is what alloc_caches takes.
  EXPECT_EQ(3 * p.slot_bytes + 7 * p.block_bytes, static_cast<double>(ops.cache_bytes_for(g)));

  const double budget = p.held_bytes + 3 * p.slot_bytes + 10.5 * p.block_bytes;
  auto fit = plan_memory(ops, g, budget, 4);
  ASSERT_TRUE(fit.ok()) << fit.status().message();
  EXPECT_EQ(fit.value().geometry.n_blocks, 10);
  EXPECT_EQ(fit.value().geometry.n_slots, 3);
  EXPECT_NE(fit.value().report().find("160 tokens"), std::string::npos) << fit.value().report();

  auto small = plan_memory(ops, g, p.held_bytes + 3 * p.slot_bytes + 2 * p.block_bytes, 4);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(small.status().message().find("--gpu-memory is too small"), std::string::npos) << small.status().message();
  EXPECT_NE(small.status().message().find("room for 2 KV blocks"), std::string::npos) << small.status().message();
}

}  // namespace
}  // namespace ds
