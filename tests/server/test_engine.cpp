// Engine tests on the CPU backend with a committed fixture: sampler semantics, scheduler
// pool accounting with a fake pool, and the engine's exactness under batching, preemption,
// cancellation and deadlines.
#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/fixture.h"

namespace ds {
namespace {

using namespace std::chrono_literals;

//
// sampler
//
std::vector<float> random_logits(int V, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> x(V);
  for (float& v : x) v = d(g);
  return x;
}

TEST(Sampler, GreedyIsArgmaxAndTopK1IsGreedy) {
  auto x = random_logits(300, 1);
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, 0);
  EXPECT_EQ(s.sample(x, {}, {}).token, argmax(x.data(), 300));
  SamplingParams k1;
  k1.temperature = 0.9f;
  k1.top_k = 1;
  Sampler s1(k1, 5);
  EXPECT_EQ(s1.sample(x, {}, {}).token, argmax(x.data(), 300));
}

TEST(Sampler, SeedIsDeterministicAndSeedsDiffer) {
  auto x = random_logits(300, 2);
  SamplingParams p;
  p.temperature = 1.0f;
  p.has_seed = true;
  p.seed = 42;
  std::vector<int32_t> a, b, c;
  Sampler sa(p, 0), sb(p, 999);
  p.seed = 43;
  Sampler sc(p, 0);
  for (int i = 0; i < 50; ++i) {
    a.push_back(sa.sample(x, {}, a).token);
    b.push_back(sb.sample(x, {}, b).token);
    c.push_back(sc.sample(x, {}, c).token);
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Sampler, TruncationKeepsOnlyTheSupport) {
  auto x = random_logits(300, 3);
  std::vector<int32_t> order(300);
  for (int i = 0; i < 300; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b]; });
  SamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 3;
  p.has_seed = true;
  Sampler s(p, 0);
  for (int i = 0; i < 200; ++i) {
    int32_t t = s.sample(x, {}, {}).token;
    EXPECT_TRUE(t == order[0] || t == order[1] || t == order[2]);
  }
  SamplingParams q;
  q.top_p = 1e-6f;  // only the most likely token
  Sampler sq(q, 7);
  SamplingParams m;
  m.min_p = 1.0f;  // only tokens as likely as the best
  Sampler sm(m, 7);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(sq.sample(x, {}, {}).token, order[0]);
    EXPECT_EQ(sm.sample(x, {}, {}).token, order[0]);
  }
}

TEST(Sampler, PenaltiesAndBiasAndLogprobs) {
  std::vector<float> x = {1.0f, 3.0f, 2.9f, -1.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.n_logprobs = 2;
  Sampler s(p, 0);
  SampleOutput o = s.sample(x, {}, {});
  EXPECT_EQ(o.token, 1);
  ASSERT_EQ(o.top.size(), 2u);
  EXPECT_EQ(o.top[0].token, 1);
  EXPECT_EQ(o.top[1].token, 2);
  double z = 0;
  for (float v : x) z += std::exp(v);
  EXPECT_NEAR(o.logprob, 3.0 - std::log(z), 1e-5);
  std::vector<int32_t> gen = {1};
  SamplingParams pr = p;
  pr.presence_penalty = 0.5f;
  EXPECT_EQ(Sampler(pr, 0).sample(x, {}, gen).token, 2);
  SamplingParams rp = p;
  rp.repetition_penalty = 1.2f;  // 3.0 / 1.2 = 2.5 < 2.9
  std::vector<int32_t> prompt = {1};
  EXPECT_EQ(Sampler(rp, 0).sample(x, prompt, {}).token, 2);
  SamplingParams lb = p;
  lb.logit_bias = {{3, 10.0f}};
  EXPECT_EQ(Sampler(lb, 0).sample(x, {}, {}).token, 3);
}

//
// scheduler with a fake pool
//
class FakePools : public SeqPools {
 public:
  FakePools(int blocks, int slots, int bs) : bs_(bs), nb_(blocks), ns_(slots), free_b_(blocks), free_s_(slots) {}
  int block_size() const override { return bs_; }
  int n_blocks() const override { return nb_; }
  int n_free_blocks() const override { return free_b_; }
  int n_slots() const override { return ns_; }
  int n_free_slots() const override { return free_s_; }
  Status admit(Sequence& s) override {
    if (!free_s_) return Status(ErrorCode::kResourceExhausted, "no slot");
    --free_s_;
    s.state_slot = 0;
    s.n_cached = 0;
    return Status();
  }
  void release(Sequence& s) override {
    if (s.state_slot >= 0) ++free_s_;
    s.state_slot = -1;
    free_b_ += static_cast<int>(s.blocks.size());
    s.blocks.clear();
    s.n_cached = 0;
  }
  // what Runner::step does to the sequences
  void run(const ScheduleOutput& o) {
    for (const SeqWork& w : o.work) {
      int need = (w.seq->n_cached + w.n_tokens + bs_ - 1) / bs_ - static_cast<int>(w.seq->blocks.size());
      ASSERT_LE(need, free_b_);
      for (int i = 0; i < need; ++i) w.seq->blocks.push_back(0);
      free_b_ -= std::max(need, 0);
      w.seq->n_cached += w.n_tokens;
    }
  }

 private:
  int bs_, nb_, ns_, free_b_, free_s_;
};

TEST(Scheduler, BudgetDecodeFirstAndPreemptionByRecompute) {
  FakePools pools(/*blocks=*/8, /*slots=*/4, /*bs=*/4);
  Scheduler sched(pools, SchedulerOptions{4, 10});
  std::vector<SchedSeq> seqs(3);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].seq.tokens.assign(8, 1);
    seqs[i].arrival = i;
    sched.add(&seqs[i]);
  }
  ScheduleOutput o = sched.schedule();  // budget 10: 8 of seq 0, 2 of seq 1
  ASSERT_EQ(o.work.size(), 2u);
  EXPECT_EQ(o.work[0].n_tokens, 8);
  EXPECT_EQ(o.work[1].n_tokens, 2);
  pools.run(o);
  seqs[0].seq.tokens.push_back(2);  // seq 0 sampled a token
  o = sched.schedule();             // decode of 0 first, then 6 of seq 1, then seq 2 waits (budget 3 left)
  ASSERT_GE(o.work.size(), 2u);
  EXPECT_EQ(o.seqs[0], &seqs[0]);
  EXPECT_EQ(o.work[0].n_tokens, 1);
  EXPECT_EQ(o.work[1].n_tokens, 6);
  pools.run(o);
  // grow every running sequence until the 8 blocks run dry: the newest must be preempted
  int preempted = o.n_preempted;
  for (int step = 0; step < 40 && preempted == 0; ++step) {
    for (SchedSeq* s : o.seqs)
      if (s->seq.n_cached == static_cast<int>(s->seq.tokens.size())) s->seq.tokens.push_back(3);
    o = sched.schedule();
    preempted += o.n_preempted;
    pools.run(o);
  }
  EXPECT_GT(preempted, 0);
  EXPECT_GT(seqs[2].n_preemptions + seqs[1].n_preemptions, 0);
  EXPECT_EQ(seqs[0].n_preemptions, 0);  // the oldest keeps its place
  for (auto& s : seqs) sched.remove(&s);
  EXPECT_EQ(pools.n_free_blocks(), 8);
  EXPECT_EQ(pools.n_free_slots(), 4);
}

//
// engine on the fixture
//
struct Served {
  test::Engine e;
  std::unique_ptr<Engine> engine;
  Served(int n_slots, int n_blocks, int step_tokens, int block_size = 16, int max_waiting = 256) {
    e = test::make_engine("tiny_wrapper_long", n_slots, n_blocks, block_size);
    EngineOptions o;
    o.max_num_seqs = n_slots;
    o.max_waiting = max_waiting;
    o.max_step_tokens = step_tokens;
    o.max_model_len = n_blocks * block_size;
    engine = std::make_unique<Engine>(*e.runner, o);
    engine->start();
  }
};

struct Output {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
};

Output drain(RequestStream& s) {
  Output o;
  Delta d;
  while (d.finish == FinishReason::kNone) s.wait(d, 100ms);
  for (auto& t : d.tokens) o.tokens.push_back(t.token);
  o.finish = d.finish;
  return o;
}

GenerationRequest greedy(std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest g;
  g.prompt = std::move(prompt);
  g.sampling.temperature = 0.0f;
  g.max_tokens = max_tokens;
  g.ignore_eos = true;
  return g;
}

std::vector<int32_t> prompt_of(int i) {
  std::mt19937 g(1000 + i);
  std::vector<int32_t> p(5 + (i * 7) % 60);
  for (auto& t : p) t = static_cast<int32_t>(g() % 352);
  return p;
}

TEST(Engine, MatchesRunnerGreedy) {
  Served s(4, 64, 32);
  auto ref = test::load_reference("tiny_wrapper_long");
  auto st = s.engine->submit(greedy(ref.prompt_ids, 8));
  ASSERT_TRUE(st.ok()) << st.status().message();
  Output o = drain(*st.value());
  EXPECT_EQ(o.finish, FinishReason::kLength);
  auto direct = s.e.runner->generate_greedy(ref.prompt_ids, 8, 0, {});
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(o.tokens, direct.value());
}

TEST(Engine, ThirtyTwoConcurrentGreedyEqualAlone) {
  constexpr int kN = 32, kNew = 12;
  std::vector<std::vector<int32_t>> alone(kN);
  {
    Served s(1, 16, 64);
    for (int i = 0; i < kN; ++i) {
      auto st = s.engine->submit(greedy(prompt_of(i), kNew));
      ASSERT_TRUE(st.ok());
      alone[i] = drain(*st.value()).tokens;
      ASSERT_EQ(alone[i].size(), size_t(kNew));
    }
  }
  Served s(32, 256, 128);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < kN; ++i) {
    auto st = s.engine->submit(greedy(prompt_of(i), kNew));
    ASSERT_TRUE(st.ok());
    streams.push_back(st.value());
  }
  for (int i = 0; i < kN; ++i) EXPECT_EQ(drain(*streams[i]).tokens, alone[i]) << "request " << i;
  EngineMetrics m = s.engine->metrics();
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.state_slots_used, 0);
  EXPECT_EQ(m.generation_tokens_total, uint64_t(kN * kNew));
  EXPECT_GE(m.steps_total, uint64_t(kNew));
  EXPECT_GT(m.forward_seconds_total, 0.0);
  EXPECT_LE(m.forward_seconds_total, m.step_seconds_total);
}

TEST(Engine, PreemptedRequestsProduceTheirUnpreemptedOutput) {
  constexpr int kN = 6, kNew = 40;
  std::vector<std::vector<int32_t>> alone(kN);
  {
    Served s(1, 16, 64);
    for (int i = 0; i < kN; ++i) {
      auto st = s.engine->submit(greedy(prompt_of(i + 3), kNew));
      ASSERT_TRUE(st.ok());
      alone[i] = drain(*st.value()).tokens;
    }
  }
  // 16 blocks of 8 tokens = 128 tokens for six sequences of 66-101 tokens each: they must take turns
  Served s(kN, 16, 64, 8);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < kN; ++i) {
    auto st = s.engine->submit(greedy(prompt_of(i + 3), kNew));
    ASSERT_TRUE(st.ok()) << st.status().message();
    streams.push_back(st.value());
  }
  for (int i = 0; i < kN; ++i) EXPECT_EQ(drain(*streams[i]).tokens, alone[i]) << "request " << i;
  EngineMetrics m = s.engine->metrics();
  EXPECT_GT(m.preemptions_total, 0u);
  EXPECT_EQ(m.kv_blocks_used, 0);
}

TEST(Engine, SeededSamplingIsReproducible) {
  Served s(4, 64, 64);
  auto run = [&](uint64_t seed) {
    GenerationRequest g = greedy(prompt_of(1), 20);
    g.sampling.temperature = 1.0f;
    g.sampling.top_p = 0.9f;
    g.sampling.has_seed = true;
    g.sampling.seed = seed;
    return drain(*s.engine->submit(g).value()).tokens;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(Engine, CancelFreesTheSlotAndDeadlineEndsTheRequest) {
  Served s(2, 64, 64);
  auto st = s.engine->submit(greedy(prompt_of(2), 900));
  ASSERT_TRUE(st.ok());
  Delta d;
  while (d.tokens.size() < 3) st.value()->wait(d, 100ms);
  EXPECT_EQ(s.engine->metrics().state_slots_used, 1);
  st.value()->cancel();
  EXPECT_EQ(drain(*st.value()).finish, FinishReason::kCancelled);
  EXPECT_EQ(s.engine->metrics().state_slots_used, 0);
  EXPECT_EQ(s.engine->metrics().kv_blocks_used, 0);

  GenerationRequest g = greedy(prompt_of(2), 900);
  g.deadline = std::chrono::steady_clock::now() + 20ms;
  Output o = drain(*s.engine->submit(g).value());
  EXPECT_EQ(o.finish, FinishReason::kTimeout);
  EXPECT_LT(o.tokens.size(), 900u);
}

TEST(Engine, RejectsBadRequests) {
  Served s(1, 8, 64);
  EXPECT_EQ(s.engine->submit(greedy({}, 4)).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.engine->submit(greedy({400}, 4)).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.engine->submit(greedy({1, 2, 3}, 200)).status().code(), ErrorCode::kOutOfRange);
}

// One seat and one waiting place: the second request is held however far the engine thread has
// got with the first (queued, scheduled or running), the third is turned away, and a place
// opens again once a request ends.
TEST(Engine, OverloadCountsHeldRequestsBeyondTheSeats) {
  Served s(1, 64, 64, 16, /*max_waiting=*/1);
  auto a = s.engine->submit(greedy({1, 2, 3}, 1000));  // long enough to outlast the submits below
  auto b = s.engine->submit(greedy({4, 5, 6}, 100));
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  auto c = s.engine->submit(greedy({7, 8}, 4));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kResourceExhausted);
  a.value()->cancel();
  EXPECT_EQ(drain(*a.value()).finish, FinishReason::kCancelled);
  auto d = s.engine->submit(greedy({7, 8}, 4));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(drain(*b.value()).tokens.size(), 100u);
  EXPECT_EQ(drain(*d.value()).tokens.size(), 4u);
}

}  // namespace
}  // namespace ds
