// StateSlots: which GDN conv/recurrent state slots are free. Slot ids only.
#pragma once

#include <vector>

namespace ds {

class StateSlots {
 public:
  explicit StateSlots(int n_slots);
  int n_slots() const { return static_cast<int>(used_.size()); }
  int n_free() const { return n_free_; }
  int allocate();  // -1 when none is free
  void release(int slot);

 private:
  std::vector<bool> used_;
  int n_free_;
};

}  // namespace ds
