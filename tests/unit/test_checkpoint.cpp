// Checkpoint folders and config.json: both layouts load; every kind of bad checkpoint gives
// an error that names the file, the tensor and what was expected.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_ops.h"
#include "io/checkpoint.h"
#include "model/qwen3_5.h"
#include "ops/int8_rows.h"
#include "unit/st_writer.h"
#include "unit/seed_requant.h"

namespace ds {
namespace {

namespace fs = std::filesystem;

// Loads the model in `dir`; returns the error message ("" on success).
std::string load_error(const fs::path& dir) {
  auto ck = Checkpoint::open(dir.string());
  if (!ck.ok()) return ck.status().message();
  CpuOps ops;
  auto m = Qwen35Model::load(*ck.value(), ops);
  return m.ok() ? "" : m.status().message();
}

using test::edit_config;
using test::rewrite_weights;

TEST(Checkpoint, BothLayoutsLoad) {
  for (const char* name : {"tiny_wrapper_mtp", "tiny_causal_sharded"})
    EXPECT_EQ(load_error(fs::path(DS_TEST_DATA_DIR) / name), "") << name;
  auto wrapper = Checkpoint::open(std::string(DS_TEST_DATA_DIR) + "/tiny_wrapper_mtp");
  ASSERT_TRUE(wrapper.ok());
  EXPECT_TRUE(wrapper.value()->config().wrapper);
  EXPECT_TRUE(wrapper.value()->has("model.layers.0.linear_attn.A_log"));
  EXPECT_TRUE(wrapper.value()->has_prefix("mtp."));
  EXPECT_FALSE(wrapper.value()->has_prefix("model.visual."));  // vision weights are skipped
  auto causal = Checkpoint::open(std::string(DS_TEST_DATA_DIR) + "/tiny_causal_sharded");
  ASSERT_TRUE(causal.ok());
  const ModelConfig& c = causal.value()->config();
  EXPECT_FALSE(c.wrapper);
  // full_attention_interval 2 and flattened rope fields
  ASSERT_EQ(c.layer_types.size(), 4u);
  EXPECT_EQ(c.layer_types[0], LayerType::kLinearAttention);
  EXPECT_EQ(c.layer_types[1], LayerType::kFullAttention);
  EXPECT_EQ(c.rotary_dim, 20);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
}

// Logits of the fixture's prompt from the checkpoint in `dir`.
std::vector<float> prompt_logits(const fs::path& dir, bool int8_vocab = false) {
  auto ck = Checkpoint::open(dir.string());
  EXPECT_TRUE(ck.ok()) << ck.status().message();
  CpuOps ops;
  ops.set_int8_vocab(int8_vocab);
  auto model = Qwen35Model::load(*ck.value(), ops);
  EXPECT_TRUE(model.ok()) << model.status().message();
  StepPlan plan;
  const int n = 12;
  for (int i = 0; i < n; ++i) {
    plan.token_ids.push_back((i * 37) % 300);
    plan.positions.push_back(i);
    plan.logit_rows.push_back(i);
  }
  plan.cu_seqlens = {0, n};
  plan.n_past = {0};
  plan.state_slots = {0};
  plan.block_tables = {0};
  plan.max_blocks = 1;
  ops.alloc_caches(model.value()->cache_geometry(1, 16, 1));
  Tensor logits = model.value()->forward(plan);
  std::vector<float> out(logits.numel());
  ops.download_f32(logits, out.data());
  return out;
}

// Converts the BF16 tensors of dir/model.safetensors whose name contains `only` (every one when
// empty) to `dtype` ("F32" or "F16").
void convert_bf16_weights(const fs::path& dir, const std::string& dtype, const std::string& only = "") {
  rewrite_weights(dir, [&](auto& entries) {
    for (auto& e : entries) {
      if (e.dtype != "BF16" || e.name.find(only) == std::string::npos) continue;
      const size_t n = e.bytes.size() / 2;
      std::vector<uint8_t> out(n * (dtype == "F32" ? 4 : 2));
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, &e.bytes[2 * i], 2);
        const float f = bf16_to_f32(h);
        if (dtype == "F32") {
          std::memcpy(&out[4 * i], &f, 4);
        } else {
          const uint16_t x = f32_to_f16(f);
          std::memcpy(&out[2 * i], &x, 2);
        }
      }
      e.dtype = dtype;
      e.bytes = std::move(out);
    }
  });
}

TEST(Checkpoint, Fp32AndFp16WeightsLoad) {
  const std::vector<float> bf16 = prompt_logits(fs::path(DS_TEST_DATA_DIR) / "tiny_wrapper_mtp");
  fs::path d32 = test::copy_fixture("tiny_wrapper_mtp", "f32");
  convert_bf16_weights(d32, "F32");
  EXPECT_EQ(prompt_logits(d32), bf16);  // the same values, widened: bit-identical logits
  fs::path d16 = test::copy_fixture("tiny_wrapper_mtp", "f16");
  convert_bf16_weights(d16, "F16");
  std::vector<float> f16 = prompt_logits(d16);
  double num = 0, den = 0;
  for (size_t i = 0; i < f16.size(); ++i) {
    num += (f16[i] - bf16[i]) * double(f16[i] - bf16[i]);
    den += double(bf16[i]) * bf16[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-3);  // fp16 keeps bf16's values up to its narrower range
  fs::remove_all(d32);
  fs::remove_all(d16);
}

// Linears fused at load whose parts come in different dtypes are stacked through f32: the same
// values as when every part is bf16.
TEST(Checkpoint, FusedPartsOfMixedDtypesLoad) {
  const std::vector<float> bf16 = prompt_logits(fs::path(DS_TEST_DATA_DIR) / "tiny_wrapper_mtp");
  fs::path d = test::copy_fixture("tiny_wrapper_mtp", "mixed");
  for (const char* part : {"in_proj_z", "k_proj", "up_proj"}) convert_bf16_weights(d, "F32", part);
  EXPECT_EQ(prompt_logits(d), bf16);
  fs::remove_all(d);
}

TEST(Checkpoint, CanonicalNames) {
  EXPECT_EQ(Checkpoint::canonical_name("model.language_model.layers.3.mlp.up_proj.weight"),
            "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(Checkpoint::canonical_name("language_model.model.norm.weight"), "model.norm.weight");
  EXPECT_EQ(Checkpoint::canonical_name("model.visual.blocks.0.attn.qkv.weight"), "");
  EXPECT_EQ(Checkpoint::canonical_name("mtp.fc.weight"), "mtp.fc.weight");
}

TEST(Checkpoint, MissingTensor) {
  fs::path d = test::copy_fixture("tiny_wrapper_mtp", "missing");
  rewrite_weights(d, [](auto& e) {
    std::erase_if(e, [](const auto& x) { return x.name == "model.language_model.layers.1.mlp.up_proj.weight"; });
  });
  std::string err = load_error(d);
  EXPECT_NE(err.find("has no tensor 'model.layers.1.mlp.up_proj.weight'"), std::string::npos) << err;
  fs::remove_all(d);
}

TEST(Checkpoint, WrongShape) {
  fs::path d = test::copy_fixture("tiny_wrapper_mtp", "shape");
  rewrite_weights(d, [](auto& e) {
    for (auto& x : e)
      if (x.name == "model.language_model.layers.2.self_attn.k_proj.weight") {
        x.shape = {47, 64};
        x.bytes.resize(47 * 64 * 2);
      }
  });
  std::string err = load_error(d);
  EXPECT_NE(err.find("model.language_model.layers.2.self_attn.k_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("expected shape [48, 64], found [47, 64]"), std::string::npos) << err;
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
  fs::remove_all(d);
}

TEST(Checkpoint, WrongDtype) {
  fs::path d = test::copy_fixture("tiny_wrapper_mtp", "dtype");
  rewrite_weights(d, [](auto& e) {
    for (auto& x : e)
      if (x.name == "model.language_model.norm.weight") {
        x.dtype = "I16";
      }
  });
  std::string err = load_error(d);
  EXPECT_NE(err.find("'model.language_model.norm.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find("expected dtype BF16, F16 or F32, found I16"), std::string::npos) << err;
  fs::remove_all(d);
}

TEST(Checkpoint, TruncatedFile) {
  fs::path d = test::copy_fixture("tiny_wrapper_mtp", "trunc");
  fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") - 1000);
  std::string err = load_error(d);
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  fs::remove_all(d);
}

TEST(Checkpoint, PartialMtpIsAnError) {
  fs::path d = test::copy_fixture("tiny_wrapper_mtp", "mtp");
  rewrite_weights(d, [](auto& e) { std::erase_if(e, [](const auto& x) { return x.name == "mtp.norm.weight"; }); });
  std::string err = load_error(d);
  EXPECT_NE(err.find("'mtp.norm.weight'"), std::string::npos) << err;
  fs::remove_all(d);
}

TEST(Checkpoint, MissingShard) {
  fs::path d = test::copy_fixture("tiny_causal_sharded", "shard");
  fs::remove(d / "model-00002-of-00004.safetensors");
  std::string err = load_error(d);
  EXPECT_NE(err.find("model-00002-of-00004.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
  fs::remove_all(d);
}

TEST(Checkpoint, BadConfigs) {
  fs::path d = test::copy_fixture("tiny_wrapper_mtp", "config");
  const std::string original = test::read_file(d / "config.json");
  auto with_config = [&](const std::function<void(nlohmann::json&)>& edit) {
    test::write_file(d / "config.json", original);
    edit_config(d, edit);
    return load_error(d);
  };
  test::write_file(d / "config.json", "{\"model_type\": \"qwen3_5\", ");
  std::string err = load_error(d);
  EXPECT_NE(err.find("config.json: not valid JSON"), std::string::npos) << err;
  err = with_config([](auto& j) { j["model_type"] = "llama"; });
  EXPECT_NE(err.find("unsupported model_type 'llama'"), std::string::npos) << err;
  err = with_config([](auto& j) { j["text_config"]["hidden_size"] = "64"; });
  EXPECT_NE(err.find("'hidden_size' must be an integer"), std::string::npos) << err;
  err = with_config([](auto& j) { j["text_config"].erase("vocab_size"); });
  EXPECT_NE(err.find("'vocab_size' is missing"), std::string::npos) << err;
  err = with_config([](auto& j) { j["text_config"]["layer_types"].push_back("full_attention"); });
  EXPECT_NE(err.find("'layer_types' has 6 entries but num_hidden_layers is 5"), std::string::npos) << err;
  err = with_config([](auto& j) { j["text_config"]["layer_types"][0] = "mamba"; });
  EXPECT_NE(err.find("unknown layer type \"mamba\""), std::string::npos) << err;
  err = with_config([](auto& j) { j["text_config"]["rope_parameters"]["rope_type"] = "yarn"; });
  EXPECT_NE(err.find("rope_type \"yarn\""), std::string::npos) << err;
  err = with_config([](auto& j) { j["text_config"]["linear_num_value_heads"] = 5; });
  EXPECT_NE(err.find("multiple of linear_num_key_heads"), std::string::npos) << err;
  fs::remove(d / "config.json");
  err = load_error(d);
  EXPECT_NE(err.find("cannot read"), std::string::npos) << err;
  EXPECT_NE(load_error("/nonexistent/model").find("does not exist"), std::string::npos);
  fs::remove_all(d);
}

TEST(Checkpoint, BadQuantizedWeights) {
  const std::string packed = "model.language_model.layers.0.mlp.up_proj.weight_packed";
  fs::path d = test::copy_fixture("tiny_w4a16", "quant");
  const std::string weights = test::read_file(d / "model.safetensors");
  const std::string config = test::read_file(d / "config.json");
  auto reset = [&] {
    test::write_file(d / "model.safetensors", weights);
    test::write_file(d / "config.json", config);
  };
  rewrite_weights(d, [&](auto& e) {
    for (auto& x : e)
      if (x.name == packed) x.dtype = "F32";
  });
  std::string err = load_error(d);
  EXPECT_NE(err.find("'" + packed + "'"), std::string::npos) << err;
  EXPECT_NE(err.find("expected dtype I32, found F32"), std::string::npos) << err;
  reset();
  rewrite_weights(d, [&](auto& e) {
    for (auto& x : e)
      if (x.name == "model.language_model.layers.0.mlp.up_proj.weight_shape") x.bytes[0] ^= 1;
  });
  err = load_error(d);
  EXPECT_NE(err.find("up_proj.weight_shape"), std::string::npos) << err;
  reset();
  rewrite_weights(d, [&](auto& e) {
    e.push_back({"model.language_model.layers.0.mlp.up_proj.weight_zero_point", "I32", {1}, std::vector<uint8_t>(4)});
  });
  err = load_error(d);
  EXPECT_NE(err.find("asymmetric weights are not supported"), std::string::npos) << err;
  reset();
  edit_config(d, [](auto& j) { j.erase("quantization_config"); });
  err = load_error(d);
  EXPECT_NE(err.find("config.json has no quantization_config"), std::string::npos) << err;
  reset();
  edit_config(d, [](auto& j) { j["quantization_config"]["format"] = "marlin-24"; });
  err = load_error(d);
  EXPECT_NE(err.find("format \"marlin-24\" is not supported"), std::string::npos) << err;
  reset();
  edit_config(d, [](auto& j) { j["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = false; });
  err = load_error(d);
  EXPECT_NE(err.find("asymmetric"), std::string::npos) << err;
  reset();
  edit_config(d, [](auto& j) { j["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = "4"; });
  err = load_error(d);
  EXPECT_NE(err.find("quantization_config"), std::string::npos) << err;
  reset();
  // A second scheme of groups of 136 columns: a row of 256 or 384 has as many groups either way.
  edit_config(d, [](auto& j) {
    auto& groups = j["quantization_config"]["config_groups"];
    groups["group_1"] = groups["group_0"];
    groups["group_1"]["weights"]["group_size"] = 136;
  });
  err = load_error(d);
  EXPECT_NE(err.find("fit two schemes of config.json's quantization_config that read them differently (group_0 and "
                     "group_1)"),
            std::string::npos)
      << err;
  reset();
  EXPECT_EQ(load_error(d), "");
  fs::remove_all(d);
}

// The seed system's requantized checkpoints: the body int4 (group_0), the lm_head int8 with fp16
// scales (group_1) and the embedding table int8 with bf16 scales (group_2); or its fast variant's
// int4 lm_head under group_0's scheme. Each loads, with the logits of the same checkpoint holding
// those tables dequantised as F32; a packed table that fits no scheme of the config is an error
// naming it and the schemes.
TEST(Checkpoint, QuantizedVocabularyTablesLoad) {
  {
    // The int8 tables first with no scheme of their own (the config's only one is int4): the table
    // loaded first is named, by its canonical name.
    test::VocabCopies c("tiny_w4a16", /*int8_tables=*/true, /*with_schemes=*/false);
    const std::string err = load_error(c.quantized);
    EXPECT_NE(err.find("'model.embed_tokens.weight_packed' [320, 32]"), std::string::npos) << err;
    EXPECT_NE(err.find("fit no scheme of config.json's quantization_config (group_0: int4 in groups of 128)"),
              std::string::npos)
        << err;
    test::add_vocab_schemes(c.quantized, true);
    EXPECT_EQ(prompt_logits(c.quantized), prompt_logits(c.dequantised)) << "int8 tables";
  }
  test::VocabCopies c("tiny_w4a16", /*int8_tables=*/false);
  EXPECT_EQ(prompt_logits(c.quantized), prompt_logits(c.dequantised)) << "int4 lm_head";
}

// int8_codes reads each word's bytes low first, less 128; with the scales it gives the values
// read_linear_f32 dequantises, on the fixture's int8 tables.
TEST(Checkpoint, Int8CodesAreTheDequantisedValues) {
  PackedLinear p;
  p.bits = 8;
  p.rows = 1;
  p.cols = 6;
  p.words_per_row = 2;
  p.packed = {static_cast<int32_t>(0x80FF017Fu), 0x0000FF00};
  EXPECT_EQ(int8_codes(p), (std::vector<int8_t>{-1, -127, 127, 0, -128, 127}));

  test::VocabCopies c("tiny_w4a16", /*int8_tables=*/true);
  auto ck = Checkpoint::open(c.quantized.string());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  const ModelConfig& cfg = ck.value()->config();
  for (const char* module : {"lm_head", "model.embed_tokens"}) {
    auto packed = ck.value()->read_packed(module, cfg.vocab_size, cfg.hidden_size);
    auto values = ck.value()->read_linear_f32(module, cfg.vocab_size, cfg.hidden_size);
    ASSERT_TRUE(packed.ok() && values.ok()) << module;
    ASSERT_EQ(packed.value().bits, 8) << module;
    const std::vector<int8_t> q = int8_codes(packed.value());
    const int64_t groups = cfg.hidden_size / packed.value().group_size;
    size_t mismatches = 0;
    for (int64_t r = 0; r < cfg.vocab_size; ++r)
      for (int64_t k = 0; k < cfg.hidden_size; ++k)
        mismatches += values.value()[r * cfg.hidden_size + k] !=
                      float(q[r * cfg.hidden_size + k]) * packed.value().scales[r * groups + k / 128];
    EXPECT_EQ(mismatches, 0u) << module;
  }
}

// A backend with int8 vocabulary tables takes a table published as int8 with its codes and scales
// as they are (Ops::upload_int8_rows), not quantised again from its values: codes halved, so that
// no group's largest is 127, give the logits of the same checkpoint dequantised exactly (int8
// tables off). Quantised again, each group would get a new scale and new codes.
TEST(Checkpoint, PublishedInt8TablesKeepTheirCodes) {
  test::VocabCopies c("tiny_w4a16", /*int8_tables=*/true);
  rewrite_weights(c.quantized, [](std::vector<test::StEntry>& entries) {
    for (test::StEntry& e : entries)
      if (e.name == "lm_head.weight_packed" || e.name == "model.language_model.embed_tokens.weight_packed")
        for (uint8_t& b : e.bytes) b = static_cast<uint8_t>((static_cast<int>(b) - 128) / 2 + 128);
  });
  const std::vector<float> exact = prompt_logits(c.quantized, /*int8_vocab=*/false);
  EXPECT_EQ(prompt_logits(c.quantized, /*int8_vocab=*/true), exact);
  // What quantising anew (the values read back, then ops/int8_rows.h) would have made of them.
  auto ck = Checkpoint::open(c.quantized.string());
  ASSERT_TRUE(ck.ok());
  const ModelConfig& cfg = ck.value()->config();
  auto values = ck.value()->read_linear_f32("lm_head", cfg.vocab_size, cfg.hidden_size);
  ASSERT_TRUE(values.ok());
  std::vector<int8_t> q(values.value().size());
  std::vector<float> scales(q.size() / kInt8Group), again(q.size());
  quantize_int8_rows(values.value().data(), cfg.vocab_size, cfg.hidden_size, q.data(), scales.data());
  for (size_t i = 0; i < q.size(); ++i) again[i] = float(q[i]) * scales[i / kInt8Group];
  EXPECT_NE(again, values.value());
}

TEST(ModelConfig, DefaultIntervalBuildsThreeToOne) {
  auto c = parse_model_config(
      R"({"model_type":"qwen3_5_text","vocab_size":10,"hidden_size":8,"intermediate_size":8,
          "num_hidden_layers":8,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":4,
          "linear_num_key_heads":1,"linear_num_value_heads":2,"linear_key_head_dim":4,"linear_value_head_dim":4,
          "rope_parameters":{"rope_theta":1e7,"partial_rotary_factor":0.5},"eos_token_id":[3,4]})",
      "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(c.value().layer_types[i], (i + 1) % 4 == 0 ? LayerType::kFullAttention : LayerType::kLinearAttention);
  EXPECT_EQ(c.value().rotary_dim, 2);
  EXPECT_EQ(c.value().eos_token_ids, (std::vector<int>{3, 4}));
}

}  // namespace
}  // namespace ds
