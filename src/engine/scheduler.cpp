// Scheduler: step planning with block accounting done before the Runner allocates, so a
// planned step never fails for lack of blocks.
#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"
#include "core/log.h"

namespace ds {

Scheduler::Scheduler(SeqPools& pools, const SchedulerOptions& options) : pools_(pools), options_(options) {
  DS_ASSERT(options_.max_num_seqs >= 1 && options_.max_step_tokens >= 1, "bad scheduler options");
  options_.max_num_seqs = std::min(options_.max_num_seqs, pools_.n_slots());
}

void Scheduler::insert_waiting(SchedSeq* s) {
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), s,
                             [](const SchedSeq* a, const SchedSeq* b) { return a->arrival < b->arrival; });
  waiting_.insert(it, s);
}

void Scheduler::add(SchedSeq* s) {
  DS_ASSERT(!s->running && s->seq.state_slot < 0, "adding a running sequence");
  insert_waiting(s);
}

void Scheduler::remove(SchedSeq* s) {
  if (s->running) {
    running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
    pools_.release(s->seq);
    s->running = false;
  } else {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
  }
}

void Scheduler::preempt(SchedSeq* s) {
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  pools_.release(s->seq);  // recompute: the cache restarts from token 0
  s->running = false;
  ++s->n_preemptions;
  insert_waiting(s);
  DS_LOG_DEBUG("sched", "preempted a sequence of %zu tokens (%d free blocks)", s->seq.tokens.size(),
               pools_.n_free_blocks());
}

int Scheduler::blocks_needed(const SchedSeq& s, int n_tokens) const {
  const int bs = pools_.block_size();
  const int n_ctx = s.seq.n_cached + n_tokens;
  return std::max(0, (n_ctx + bs - 1) / bs - static_cast<int>(s.seq.blocks.size()));
}

ScheduleOutput Scheduler::schedule() {
  ScheduleOutput out;
  int budget = options_.max_step_tokens;
  int reserved = 0;  // blocks this step will take

  auto remaining = [](const SchedSeq* s) { return static_cast<int>(s->seq.tokens.size()) - s->seq.n_cached; };
  auto scheduled = [&](const SchedSeq* s) { return std::find(out.seqs.begin(), out.seqs.end(), s) != out.seqs.end(); };
  auto unschedule = [&](SchedSeq* s) {
    for (size_t i = 0; i < out.seqs.size(); ++i)
      if (out.seqs[i] == s) {
        reserved -= blocks_needed(*s, out.work[i].n_tokens);
        budget += out.work[i].n_tokens;
        out.seqs.erase(out.seqs.begin() + static_cast<long>(i));
        out.work.erase(out.work.begin() + static_cast<long>(i));
        return;
      }
  };
  // Tries to place n tokens of running sequence s, preempting the newest running sequences
  // while blocks are short. False if s itself was preempted.
  auto place = [&](SchedSeq* s, int n) {
    while (blocks_needed(*s, n) > pools_.n_free_blocks() - reserved) {
      SchedSeq* victim = running_.back();
      unschedule(victim);
      preempt(victim);
      ++out.n_preempted;
      if (victim == s) return false;
    }
    reserved += blocks_needed(*s, n);
    budget -= n;
    out.seqs.push_back(s);
    out.work.push_back(SeqWork{&s->seq, n, false});
    return true;
  };

  // 1. decodes of running sequences (one token each), oldest first
  std::vector<SchedSeq*> snapshot = running_;
  for (SchedSeq* s : snapshot) {
    if (budget <= 0) break;
    if (!s->running || remaining(s) != 1 || scheduled(s)) continue;
    place(s, 1);
  }
  // 2. prefill chunks of running sequences
  snapshot = running_;
  for (SchedSeq* s : snapshot) {
    if (budget <= 0) break;
    if (!s->running || remaining(s) <= 1 || scheduled(s)) continue;
    place(s, std::min(remaining(s), budget));
  }
  // 3. admissions, oldest first, not in a step that had to preempt
  while (out.n_preempted == 0 && budget > 0 && !waiting_.empty() &&
         static_cast<int>(running_.size()) < options_.max_num_seqs && pools_.n_free_slots() > 0) {
    SchedSeq* s = waiting_.front();
    const int n = std::min(remaining(s), budget);
    if (blocks_needed(*s, n) > pools_.n_free_blocks() - reserved) break;
    if (!pools_.admit(s->seq).ok()) break;
    waiting_.pop_front();
    s->running = true;
    running_.insert(std::upper_bound(running_.begin(), running_.end(), s,
                                     [](const SchedSeq* a, const SchedSeq* b) { return a->arrival < b->arrival; }),
                    s);
    reserved += blocks_needed(*s, n);
    budget -= n;
    out.seqs.push_back(s);
    out.work.push_back(SeqWork{&s->seq, n, false});
  }
  return out;
}

}  // namespace ds
