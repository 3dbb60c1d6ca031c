// W4A8 on the CPU (the twin of the CUDA GEMV's int8 inputs): the --w4a8 layer classes, the
// rounding of ops/act_int8.h, which linears the loader marks, and a model's logits with every
// class on against its logits without.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/fixture.h"
#include "ops/act_int8.h"

namespace ds::test {
namespace {

TEST(W4A8, LayerClassesParse) {
  EXPECT_EQ(parse_act_int8_layers("none").value(), ActInt8Layers{});
  EXPECT_EQ(parse_act_int8_layers("all").value(), (ActInt8Layers{true, true, true}));
  EXPECT_EQ(parse_act_int8_layers("mlp,self_attn").value(), (ActInt8Layers{true, false, true}));
  EXPECT_EQ(parse_act_int8_layers("linear_attn").value(), (ActInt8Layers{false, true, false}));
  auto bad = parse_act_int8_layers("mlp,attn");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'attn'"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(parse_act_int8_layers("mlp,").ok()) << "an empty class";
}

TEST(W4A8, RoundingIsPerTokenAndChunk) {
  const int T = 2, K = 2 * kActInt8Chunk;
  std::vector<float> x(T * K);
  for (int i = 0; i < T * K; ++i) x[i] = std::sin(0.37f * i) * (1 + i / 64);  // chunks of different ranges
  for (int k = 0; k < kActInt8Chunk; ++k) x[K + k] = 0.f;                     // token 1, chunk 0: all zero
  std::vector<float> r = x;
  round_act_int8(r.data(), T, K);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < K; c += kActInt8Chunk) {
      float amax = 0.f;
      for (int k = 0; k < kActInt8Chunk; ++k) amax = std::max(amax, std::fabs(x[t * K + c + k]));
      const float step = amax / 127.f;
      for (int k = 0; k < kActInt8Chunk; ++k) {
        const float v = x[t * K + c + k], got = r[t * K + c + k];
        EXPECT_LE(std::fabs(got - v), 0.5f * step * 1.0001f + 1e-7f) << t << " " << c + k;
        if (step > 0) EXPECT_NEAR(got / step, std::nearbyint(got / step), 1e-3) << "on the int8 grid";
        else EXPECT_EQ(got, 0.f);
      }
    }
}

// tiny_w4a16 publishes every linear but in_proj_b/a as W4A16: with --w4a8 mlp only the MLP's are
// marked; with all, the GDN in_proj splits into {qkv, z} (int8 inputs) and {b, a} (dense as
// published), as on the GPU.
TEST(W4A8, LoaderMarksThePublishedW4A16LinearsOfTheClasses) {
  auto ck = Checkpoint::open(fixture_dir("tiny_w4a16"));
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  CpuOps ops;
  auto mlp = load_weights(*ck.value(), ops, ActInt8Layers{true, false, false});
  ASSERT_TRUE(mlp.ok()) << mlp.status().message();
  for (const LayerWeights& L : mlp.value().layers) {
    EXPECT_TRUE(L.mlp.gate_up.groups.at(0).w.act_int8);
    EXPECT_TRUE(L.mlp.down_proj.act_int8);
    if (L.type == LayerType::kLinearAttention) {
      for (const auto& g : L.gdn.in_proj.groups) EXPECT_FALSE(g.w.act_int8);
      EXPECT_FALSE(L.gdn.out_proj.act_int8);
    } else {
      EXPECT_FALSE(L.attn.o_proj.act_int8);
    }
  }
  auto all = load_weights(*ck.value(), ops, parse_act_int8_layers("all").value());
  ASSERT_TRUE(all.ok()) << all.status().message();
  int n_gdn = 0;
  for (const LayerWeights& L : all.value().layers) {
    if (L.type != LayerType::kLinearAttention) {
      EXPECT_TRUE(L.attn.o_proj.act_int8);
      for (const auto& g : L.attn.qkv_proj.groups) EXPECT_TRUE(g.w.act_int8);
      continue;
    }
    ++n_gdn;
    ASSERT_EQ(L.gdn.in_proj.groups.size(), 2u);
    EXPECT_EQ(L.gdn.in_proj.groups[0].n_parts, 2);
    EXPECT_TRUE(L.gdn.in_proj.groups[0].w.act_int8);
    EXPECT_FALSE(L.gdn.in_proj.groups[1].w.act_int8) << "in_proj_b/a are published dense";
    EXPECT_TRUE(L.gdn.out_proj.act_int8);
  }
  EXPECT_GT(n_gdn, 0);
  EXPECT_FALSE(all.value().lm_head.act_int8);
}

TEST(W4A8, Bf16CheckpointHasNoInt8Inputs) {
  auto ck = Checkpoint::open(fixture_dir("tiny_wrapper_mtp"));
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  CpuOps ops;
  auto w = load_weights(*ck.value(), ops, parse_act_int8_layers("all").value());
  ASSERT_TRUE(w.ok()) << w.status().message();
  for (const LayerWeights& L : w.value().layers) {
    EXPECT_FALSE(L.mlp.down_proj.act_int8);
    EXPECT_FALSE(L.mlp.gate_up.groups.at(0).w.act_int8);
  }
}

// The logits with every class on differ from the plain ones by about what the inputs' rounding
// is worth: int8 steps of max / 127 a chunk against bf16's 8 bits a value, so within a few times
// the difference that bf16 activations make.
TEST(W4A8, LogitsMoveByTheRoundingOfTheInputs) {
  const std::vector<int32_t> ids = load_reference("tiny_w4a16").prompt_ids;
  const int n = static_cast<int>(ids.size());
  Engine plain = make_engine("tiny_w4a16");
  Engine bf16 = make_engine("tiny_w4a16", 4, 64, 16, /*bf16_activations=*/true);
  Engine a8 = make_engine("tiny_w4a16", 4, 64, 16, false, false, parse_act_int8_layers("all").value());
  const std::vector<float> ref = prefill_logits(plain, ids, {n});
  const double err = rel_rms(prefill_logits(a8, ids, {n}), ref);
  const double err_bf16 = rel_rms(prefill_logits(bf16, ids, {n}), ref);
  EXPECT_GT(err, 0.0) << "int8 inputs change the logits";
  EXPECT_LT(err, 5 * err_bf16) << "by about what their rounding is worth (bf16 activations: " << err_bf16 << ")";
}

}  // namespace
}  // namespace ds::test
