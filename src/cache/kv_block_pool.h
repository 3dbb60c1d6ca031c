// KvBlockPool: which KV cache blocks are free. Block ids only; the memory is the backend's.
#pragma once

#include <cstdint>
#include <vector>

namespace ds {

class KvBlockPool {
 public:
  explicit KvBlockPool(int n_blocks);
  int n_blocks() const { return n_blocks_; }
  int n_free() const { return static_cast<int>(free_.size()); }
  // Appends n new block ids to `blocks`; false (and nothing taken) if fewer are free.
  bool allocate(int n, std::vector<int32_t>& blocks);
  void release(std::vector<int32_t>& blocks);  // returns every id and clears the list

 private:
  int n_blocks_;
  std::vector<int32_t> free_;  // stack: lowest ids handed out first
  std::vector<bool> used_;
};

}  // namespace ds
