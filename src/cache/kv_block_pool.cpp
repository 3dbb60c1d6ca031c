// KvBlockPool: a free stack with a double-release check.
#include "cache/kv_block_pool.h"

#include "core/check.h"

namespace ds {

KvBlockPool::KvBlockPool(int n_blocks) : n_blocks_(n_blocks), used_(n_blocks, false) {
  for (int i = n_blocks - 1; i >= 0; --i) free_.push_back(i);
}

bool KvBlockPool::allocate(int n, std::vector<int32_t>& blocks) {
  if (n > n_free()) return false;
  for (int i = 0; i < n; ++i) {
    int32_t b = free_.back();
    free_.pop_back();
    used_[b] = true;
    blocks.push_back(b);
  }
  return true;
}

void KvBlockPool::release(std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    DS_ASSERT(b >= 0 && b < n_blocks_ && used_[b], "releasing block %d that is not in use", b);
    used_[b] = false;
    free_.push_back(b);
  }
  blocks.clear();
}

}  // namespace ds
