// Linears fused at load (FusedLinear): the grouping rule on every mix of storage (the GPU's too),
// what the CPU loader builds from a W4A16 checkpoint and from an int8 MTP head, and that fusion
// changes no value: DS_FUSE_LINEARS=0 gives the same weights and bit-identical logits.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

#include "model/fixture.h"
#include "unit/seed_requant.h"

namespace ds::test {
namespace {

constexpr PartStorage kDense{0};
constexpr PartStorage kW4g128{128};
constexpr PartStorage kW4g64{64};
constexpr PartStorage kInt8{128, false, true};

TEST(GroupParts, ConsecutivePartsOfEqualStorageShareAWeight) {
  // GDN in_proj of a published W4A16 checkpoint on a backend that keeps W4A16: qkv, z | b, a
  EXPECT_EQ(group_parts({kW4g128, kW4g128, kDense, kDense}, true), (std::vector<int>{2, 2}));
  // the same in bf16 (or dequantised on the CPU): one group
  EXPECT_EQ(group_parts({kDense, kDense, kDense, kDense}, true), (std::vector<int>{4}));
  EXPECT_EQ(group_parts({kW4g128, kW4g128, kW4g128}, true), (std::vector<int>{3}));
  // a different group size is a different storage; equal storage apart does not join
  EXPECT_EQ(group_parts({kW4g128, kW4g64, kW4g64, kDense, kW4g128}, true), (std::vector<int>{1, 2, 1, 1}));
  EXPECT_EQ(group_parts({kDense, kW4g128, kDense}, true), (std::vector<int>{1, 1, 1}));
  // int8 rows are not W4A16 of the same group size
  EXPECT_EQ(group_parts({kW4g128, kInt8, kInt8}, true), (std::vector<int>{1, 2}));
  EXPECT_EQ(group_parts({kDense}, true), (std::vector<int>{1}));
  EXPECT_EQ(group_parts({}, true), (std::vector<int>{}));
}

TEST(GroupParts, WithoutFusionEveryPartIsAGroup) {
  EXPECT_EQ(group_parts({kW4g128, kW4g128, kDense, kDense}, false), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(group_parts({kDense, kDense}, false), (std::vector<int>{1, 1}));
}

// Sets DS_FUSE_LINEARS for one scope.
class FuseEnv {
 public:
  explicit FuseEnv(const char* value) {
    if (const char* old = std::getenv(kName)) old_ = old;
    setenv(kName, value, 1);
  }
  ~FuseEnv() {
    if (old_) setenv(kName, old_->c_str(), 1);
    else unsetenv(kName);
  }

 private:
  static constexpr const char* kName = "DS_FUSE_LINEARS";
  std::optional<std::string> old_;
};

std::vector<float> values(CpuOps& ops, Tensor t) {
  std::vector<float> v(t.numel());
  ops.download_f32(t, v.data());
  return v;
}

// Calls check(prefix, fused linear, names of its parts) for every fused linear of `w`.
void each_fused(const ModelWeights& w,
                const std::function<void(const std::string&, const FusedLinear&, std::vector<std::string>)>& check) {
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& L = w.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    if (L.type == LayerType::kLinearAttention)
      check(p + "linear_attn.", L.gdn.in_proj, {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"});
    else
      check(p + "self_attn.", L.attn.qkv_proj, {"q_proj", "k_proj", "v_proj"});
    check(p + "mlp.", L.mlp.gate_up, {"gate_proj", "up_proj"});
  }
  if (w.mtp) {
    check("mtp.layers.0.self_attn.", w.mtp->layer.attn.qkv_proj, {"q_proj", "k_proj", "v_proj"});
    check("mtp.layers.0.mlp.", w.mtp->layer.mlp.gate_up, {"gate_proj", "up_proj"});
  }
}

// On the CPU a W4A16 checkpoint is dequantised at load, so every part is dense and each input's
// linears form one group; its rows are the checkpoint's parts in order, values unchanged.
TEST(FusedLinearLoad, W4A16CheckpointOnCpuIsOneDenseGroupPerInput) {
  auto ck = Checkpoint::open(fixture_dir("tiny_w4a16"));
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  const ModelConfig& c = ck.value()->config();
  CpuOps ops;
  FuseEnv on("1");
  auto w = load_weights(*ck.value(), ops);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const int64_t H = c.hidden_size;
  const std::vector<int64_t> gdn_rows = {c.conv_dim(), c.linear_num_value_heads * c.linear_value_head_dim,
                                         c.linear_num_value_heads, c.linear_num_value_heads};
  EXPECT_EQ(w.value().layers[0].gdn.in_proj.rows, gdn_rows);
  int n_checked = 0;
  each_fused(w.value(), [&](const std::string& p, const FusedLinear& f, std::vector<std::string> names) {
    ASSERT_EQ(f.rows.size(), names.size()) << p;
    ASSERT_EQ(f.groups.size(), 1u) << p;
    const LinearWeight& g = f.groups[0].w;
    EXPECT_EQ(f.groups[0].n_parts, static_cast<int>(names.size())) << p;
    ASSERT_FALSE(g.quantized()) << p;
    std::vector<float> want;
    for (size_t i = 0; i < names.size(); ++i) {
      auto part = ck.value()->read_linear_f32(p + names[i], f.rows[i], H);
      ASSERT_TRUE(part.ok()) << part.status().message();
      want.insert(want.end(), part.value().begin(), part.value().end());
    }
    ASSERT_EQ(g.dense.dim(0) * H, static_cast<int64_t>(want.size())) << p;
    EXPECT_EQ(values(ops, g.dense), want) << p;
    ++n_checked;
  });
  EXPECT_EQ(n_checked, 2 * c.num_hidden_layers + (w.value().mtp ? 2 : 0));
}

// Records the int8 rows the loader hands the backend (Ops::upload_int8_rows), [N, K] each.
class Int8RowsCpuOps : public CpuOps {
 public:
  LinearWeight upload_int8_rows(const int8_t* q, const float* scales, int64_t N, int64_t K) override {
    uploads.push_back({N, K});
    return CpuOps::upload_int8_rows(q, scales, N, K);
  }
  std::vector<std::pair<int64_t, int64_t>> uploads;
};

// The seed's int8 MTP head (seed_requant.h): the linears of each input reach the backend as one
// weight of int8 rows (the CPU holds their values in fp32), and its logits are those of the same
// values published as F32, with W4A8 on too (int8 rows read their inputs as they are).
TEST(FusedLinearLoad, Int8MtpHeadLoadsAsInt8Rows) {
  Int8MtpCopies c("tiny_w4a16");
  {
    auto ck = Checkpoint::open(c.quantized.string());
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    const ModelConfig& cfg = ck.value()->config();
    const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, hd = cfg.head_dim;
    const int64_t q = cfg.num_attention_heads * hd, kv = cfg.num_key_value_heads * hd;
    Int8RowsCpuOps ops;
    FuseEnv on("1");
    auto w = load_weights(*ck.value(), ops);
    ASSERT_TRUE(w.ok()) << w.status().message();
    // fc, q + k + v, o_proj, gate + up, down_proj
    EXPECT_EQ(ops.uploads,
              (std::vector<std::pair<int64_t, int64_t>>{{H, 2 * H}, {2 * q + 2 * kv, H}, {H, q}, {2 * I, H}, {H, I}}));
  }
  const std::vector<int32_t> ids = load_reference("tiny_w4a16").prompt_ids;
  std::vector<int> rows(ids.size() - 1);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int>(i);
  for (const ActInt8Layers a8 : {ActInt8Layers{}, ActInt8Layers{true, true, true}}) {
    Engine quantized = make_engine(c.quantized.string(), 4, 64, 16, false, false, a8);
    Engine exact = make_engine(c.dequantised.string(), 4, 64, 16, false, false, a8);
    EXPECT_EQ(mtp_prompt_logits(*quantized.runner, *quantized.ops, *quantized.model, ids, rows),
              mtp_prompt_logits(*exact.runner, *exact.ops, *exact.model, ids, rows))
        << "W4A8 " << a8.mlp;
  }
}

TEST(FusedLinearLoad, FusionOffLoadsEveryPartAlone) {
  auto ck = Checkpoint::open(fixture_dir("tiny_wrapper_mtp"));
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  CpuOps ops;
  std::optional<FuseEnv> env(std::in_place, "1");
  auto fused = load_weights(*ck.value(), ops);
  ASSERT_TRUE(fused.ok()) << fused.status().message();
  env.emplace("0");
  auto apart = load_weights(*ck.value(), ops);
  ASSERT_TRUE(apart.ok()) << apart.status().message();
  std::vector<const FusedLinear*> fused_linears;
  each_fused(fused.value(), [&](const std::string&, const FusedLinear& f, std::vector<std::string>) {
    fused_linears.push_back(&f);
  });
  size_t k = 0;
  each_fused(apart.value(), [&](const std::string& p, const FusedLinear& f, std::vector<std::string> names) {
    const FusedLinear& one = *fused_linears.at(k++);
    ASSERT_EQ(f.groups.size(), names.size()) << p;
    ASSERT_EQ(one.groups.size(), 1u) << p;
    std::vector<float> stacked;
    for (const FusedLinear::Group& g : f.groups) {
      EXPECT_EQ(g.n_parts, 1) << p;
      const std::vector<float> v = values(ops, g.w.dense);
      stacked.insert(stacked.end(), v.begin(), v.end());
    }
    EXPECT_EQ(stacked, values(ops, one.groups[0].w.dense)) << p;
  });
  EXPECT_EQ(k, fused_linears.size());
}

// Synthetic parts draw their own seeds: the same random weights fused or not.
TEST(FusedLinearLoad, SyntheticWeightsDoNotDependOnFusion) {
  auto ck = Checkpoint::open(fixture_dir("tiny_wrapper_mtp"));
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  CpuOps ops;
  std::optional<FuseEnv> env(std::in_place, "1");
  auto fused = synthetic_weights(ck.value()->config(), ops, /*with_mtp=*/true, /*w4a16=*/false, 7);
  ASSERT_TRUE(fused.ok());
  env.emplace("0");
  auto apart = synthetic_weights(ck.value()->config(), ops, /*with_mtp=*/true, /*w4a16=*/false, 7);
  ASSERT_TRUE(apart.ok());
  std::vector<std::vector<float>> fused_values;
  each_fused(fused.value(), [&](const std::string&, const FusedLinear& f, std::vector<std::string>) {
    ASSERT_EQ(f.groups.size(), 1u);
    fused_values.push_back(values(ops, f.groups[0].w.dense));
  });
  size_t k = 0;
  each_fused(apart.value(), [&](const std::string& p, const FusedLinear& f, std::vector<std::string> names) {
    ASSERT_EQ(f.groups.size(), names.size()) << p;
    std::vector<float> stacked;
    for (const FusedLinear::Group& g : f.groups) {
      const std::vector<float> v = values(ops, g.w.dense);
      stacked.insert(stacked.end(), v.begin(), v.end());
    }
    EXPECT_EQ(stacked, fused_values.at(k++)) << p;
  });
  EXPECT_EQ(k, fused_values.size());
  // and a weight drawn after all the layers' fused linears is unchanged too
  EXPECT_EQ(values(ops, fused.value().layers.back().mlp.down_proj.dense),
            values(ops, apart.value().layers.back().mlp.down_proj.dense));
}

class FusedLogits : public ::testing::TestWithParam<std::string> {};

TEST_P(FusedLogits, BitIdenticalToSeparateLinears) {
  const std::vector<int32_t> ids = load_reference(GetParam()).prompt_ids;
  const int n = static_cast<int>(ids.size());
  std::optional<FuseEnv> env(std::in_place, "1");
  Engine fused = make_engine(GetParam());
  const std::vector<float> a = prefill_logits(fused, ids, {n}), a_decode = prefill_logits(fused, ids, {1});
  env.emplace("0");
  Engine apart = make_engine(GetParam());
  EXPECT_EQ(a, prefill_logits(apart, ids, {n})) << GetParam();
  EXPECT_EQ(a_decode, prefill_logits(apart, ids, {1})) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FusedLogits, ::testing::ValuesIn(fixture_names()));

}  // namespace
}  // namespace ds::test
