// SeqPools: the view of the KV block pool and GDN state slots that the scheduler plans
// against (counts, admit, release). The Runner implements it; tests may fake it.
#pragma once

#include "core/status.h"

namespace ds {

struct Sequence;

class SeqPools {
 public:
  virtual ~SeqPools() = default;
  virtual int block_size() const = 0;
  virtual int n_blocks() const = 0;
  virtual int n_free_blocks() const = 0;
  virtual int n_slots() const = 0;
  virtual int n_free_slots() const = 0;
  virtual Status admit(Sequence& seq) = 0;  // takes a state slot; n_cached = 0
  virtual void release(Sequence& seq) = 0;  // frees its slot and blocks; n_cached = 0
};

}  // namespace ds
