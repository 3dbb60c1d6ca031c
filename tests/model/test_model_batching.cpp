// Step-shape invariance of the CPU reference: one-piece prefill == any chunking == token by
// token; chunked GDN == recurrent GDN end to end; a varlen step of several sequences == each
// sequence alone; state slots are reused cleanly.
#include <gtest/gtest.h>

#include <random>

#include "model/fixture.h"

namespace ds::test {
namespace {

constexpr double kTol = 1e-5;  // relative RMS of the logits

class Batching : public ::testing::TestWithParam<std::string> {};

TEST_P(Batching, ChunkedPrefillEqualsOnePiece) {
  Reference ref = load_reference(GetParam());
  const std::vector<int32_t>& ids = ref.prompt_ids;
  Engine e = make_engine(GetParam());
  std::vector<float> whole = prefill_logits(e, ids, {static_cast<int>(ids.size())});
  for (std::vector<int> chunks : std::vector<std::vector<int>>{{1}, {7, 13}, {64}, {63, 2}, {3, 1, 65}}) {
    std::vector<float> chunked = prefill_logits(e, ids, chunks);
    EXPECT_LE(rel_rms(chunked, whole), kTol) << GetParam() << " chunks " << chunks[0];
  }
}

TEST_P(Batching, ChunkedGdnEqualsRecurrentGdn) {
  Reference ref = load_reference(GetParam());
  Engine e = make_engine(GetParam());
  const int n = static_cast<int>(ref.prompt_ids.size());
  e.ops->set_gdn_mode(GdnMode::kRecurrent);
  std::vector<float> recurrent = prefill_logits(e, ref.prompt_ids, {n});
  e.ops->set_gdn_mode(GdnMode::kChunked);
  std::vector<float> chunked = prefill_logits(e, ref.prompt_ids, {n});
  std::vector<float> chunked_by_5 = prefill_logits(e, ref.prompt_ids, {5});  // chunked form on short pieces
  EXPECT_LE(rel_rms(chunked, recurrent), kTol);
  EXPECT_LE(rel_rms(chunked_by_5, recurrent), kTol);
}

TEST_P(Batching, VarlenStepEqualsEachSequenceAlone) {
  Reference ref = load_reference(GetParam());
  Engine e = make_engine(GetParam());
  const int V = e.model->config().vocab_size;
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {5, 37, 70}) {
    std::vector<int32_t> p(len);
    for (auto& t : p) t = static_cast<int32_t>(rng() % V);
    prompts.push_back(p);
  }
  // Alone: each prompt prefilled, then two greedy decode steps.
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) {
    Sequence s;
    s.tokens = p;
    ASSERT_TRUE(e.runner->admit(s).ok());
    auto r = e.runner->step({SeqWork{&s, static_cast<int>(p.size()), true}});
    ASSERT_TRUE(r.ok());
    std::vector<float> all = r.value()[0];
    for (int k = 0; k < 2; ++k) {
      s.tokens.push_back(argmax(all.data() + all.size() - V, V));
      auto d = e.runner->step({SeqWork{&s, 1, true}});
      ASSERT_TRUE(d.ok());
      all.insert(all.end(), d.value()[0].begin(), d.value()[0].end());
    }
    alone.push_back(all);
    e.runner->release(s);
  }
  // Together: first step has the three prompts in pieces of unequal size, later steps mix
  // prefill chunks with decode tokens.
  std::vector<Sequence> seqs(3);
  std::vector<std::vector<float>> together(3);
  for (int i = 0; i < 3; ++i) {
    seqs[i].tokens = prompts[i];
    ASSERT_TRUE(e.runner->admit(seqs[i]).ok());
  }
  int decoded[3] = {0, 0, 0};
  while (decoded[0] < 2 || decoded[1] < 2 || decoded[2] < 2) {
    std::vector<SeqWork> work;
    std::vector<int> who;
    for (int i = 0; i < 3; ++i) {
      Sequence& s = seqs[i];
      const int pending = static_cast<int>(s.tokens.size()) - s.n_cached;
      if (pending == 0 && decoded[i] < 2) {  // prefill done: append the greedy token
        const auto& l = together[i];
        s.tokens.push_back(argmax(l.data() + l.size() - V, V));
        ++decoded[i];
        work.push_back(SeqWork{&s, 1, true});
        who.push_back(i);
      } else if (pending > 0) {
        work.push_back(SeqWork{&s, std::min(pending, 29), true});
        who.push_back(i);
      }
    }
    auto r = e.runner->step(work);
    ASSERT_TRUE(r.ok()) << r.status().message();
    for (size_t w = 0; w < work.size(); ++w)
      together[who[w]].insert(together[who[w]].end(), r.value()[w].begin(), r.value()[w].end());
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(together[i].size(), alone[i].size()) << "sequence " << i;
    EXPECT_LE(rel_rms(together[i], alone[i]), kTol) << "sequence " << i;
  }
}

TEST_P(Batching, ReusedSlotStartsFresh) {
  Reference ref = load_reference(GetParam());
  Engine e = make_engine(GetParam(), /*n_slots=*/1);
  const int n = static_cast<int>(ref.prompt_ids.size());
  std::vector<float> first = prefill_logits(e, ref.prompt_ids, {n});
  std::vector<int32_t> other(ref.prompt_ids.rbegin(), ref.prompt_ids.rend());
  prefill_logits(e, other, {n});  // dirties the only slot and the blocks
  std::vector<float> again = prefill_logits(e, ref.prompt_ids, {9});
  EXPECT_LE(rel_rms(again, first), kTol);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Batching, ::testing::ValuesIn(fixture_names()));

TEST(Runner, ReportsFullPoolsAndContext) {
  Engine e = make_engine("tiny_wrapper_mtp", /*n_slots=*/1, /*n_blocks=*/2, /*block_size=*/16);
  Sequence a, b;
  a.tokens.assign(40, 1);
  ASSERT_TRUE(e.runner->admit(a).ok());
  EXPECT_EQ(e.runner->admit(b).code(), ErrorCode::kResourceExhausted);
  auto r = e.runner->step({SeqWork{&a, 40, false}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(r.status().message().find("exceeds the context of 32"), std::string::npos) << r.status().message();
  auto g = e.runner->generate_greedy({1, 2, 3}, 40, 0, {});
  EXPECT_FALSE(g.ok());
  e.runner->release(a);
  auto bad = e.runner->generate_greedy({1, 999}, 2, 0, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("token id 999"), std::string::npos);
}

}  // namespace
}  // namespace ds::test
