// StateSlots: lowest free slot first.
#include "cache/state_slots.h"

#include "core/check.h"

namespace ds {

StateSlots::StateSlots(int n_slots) : used_(n_slots, false), n_free_(n_slots) {}

int StateSlots::allocate() {
  for (int i = 0; i < n_slots(); ++i)
    if (!used_[i]) {
      used_[i] = true;
      --n_free_;
      return i;
    }
  return -1;
}

void StateSlots::release(int slot) {
  DS_ASSERT(slot >= 0 && slot < n_slots() && used_[slot], "releasing state slot %d that is not in use", slot);
  used_[slot] = false;
  ++n_free_;
}

}  // namespace ds
