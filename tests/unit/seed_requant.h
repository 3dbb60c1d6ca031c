// Test helper: copies of a fixture whose vocabulary tables or MTP head are stored as the seed
// system's requantization scripts store them (compressed-tensors pack-quantized: an int8 lm_head
// with fp16 scales, an int8 embedding table with bf16 scales, or its fast variant's int4 lm_head;
// an int8 MTP head with bf16 scales), beside a copy holding the same values dequantised as F32;
// and the safetensors / config.json rewriting they are made with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "unit/st_writer.h"

namespace ds::test {

// Rewrites dir/model.safetensors through `edit`, which may change the entry list.
inline void rewrite_weights(const std::filesystem::path& dir, const std::function<void(std::vector<StEntry>&)>& edit) {
  const std::filesystem::path p = dir / "model.safetensors";
  std::vector<StEntry> entries;
  {
    auto f = SafetensorsFile::open(p.string());
    ASSERT_TRUE(f.ok());
    for (const auto& [name, info] : f.value()->tensors()) {
      const uint8_t* d = static_cast<const uint8_t*>(f.value()->data(info));
      entries.push_back({name, dtype_name(info.dtype), info.shape,
                         std::vector<uint8_t>(d, d + (info.end - info.begin))});
    }
  }
  edit(entries);
  write_file(p, make_safetensors(entries));
}

inline void edit_config(const std::filesystem::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(read_file(dir / "config.json"));
  edit(j);
  write_file(dir / "config.json", j.dump());
}

// Quantizes the BF16 weight `name` [R, C] of `entries` as compressed-tensors pack-quantized
// does (symmetric, groups of 128 columns, scale = max |w| / (2^(bits-1) - 1) stored as
// `scale_dtype`, "F16" or "BF16"), replacing it with its weight_packed, weight_scale and
// weight_shape. Returns the values it stands for, q * scale in fp32 (exact), [R, C].
inline std::vector<float> pack_quantize(std::vector<StEntry>& entries, const std::string& name, int bits,
                                        const std::string& scale_dtype) {
  auto it = std::find_if(entries.begin(), entries.end(), [&](const StEntry& e) { return e.name == name; });
  EXPECT_TRUE(it != entries.end() && it->dtype == "BF16" && it->shape.size() == 2) << name;
  const int64_t R = it->shape[0], C = it->shape[1], G = C / 128, per_word = 32 / bits;
  const int qmax = (1 << (bits - 1)) - 1;
  std::vector<float> w(R * C), values(R * C);
  for (int64_t i = 0; i < R * C; ++i) {
    uint16_t h;
    std::memcpy(&h, &it->bytes[2 * i], 2);
    w[i] = bf16_to_f32(h);
  }
  std::vector<uint8_t> packed(R * (C / per_word) * 4, 0), scales(R * G * 2);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < G; ++g) {
      float amax = 0.f;
      for (int64_t c = g * 128; c < (g + 1) * 128; ++c) amax = std::max(amax, std::fabs(w[r * C + c]));
      const uint16_t s16 = scale_dtype == "F16" ? f32_to_f16(amax / qmax) : f32_to_bf16(amax / qmax);
      const float s = scale_dtype == "F16" ? f16_to_f32(s16) : bf16_to_f32(s16);
      std::memcpy(&scales[2 * (r * G + g)], &s16, 2);
      for (int64_t c = g * 128; c < (g + 1) * 128; ++c) {
        const int q = s > 0.f ? std::clamp(static_cast<int>(std::nearbyint(w[r * C + c] / s)), -qmax - 1, qmax) : 0;
        values[r * C + c] = static_cast<float>(q) * s;
        const int64_t byte = (r * (C / per_word) + c / per_word) * 4;
        const uint32_t field = static_cast<uint32_t>(q + qmax + 1) << (bits * (c % per_word));
        for (int b = 0; b < 4; ++b) packed[byte + b] |= static_cast<uint8_t>(field >> (8 * b));
      }
    }
  const std::string module = name.substr(0, name.size() - std::strlen(".weight"));
  std::vector<uint8_t> shape(16);
  std::memcpy(&shape[0], &R, 8);
  std::memcpy(&shape[8], &C, 8);
  entries.erase(it);
  entries.push_back({module + ".weight_packed", "I32", {R, C / per_word}, packed});
  entries.push_back({module + ".weight_scale", scale_dtype, {R, G}, scales});
  entries.push_back({module + ".weight_shape", "I64", {2}, shape});
  return values;
}

// The entry `name` replaced by F32 `values` of the same shape.
inline void store_f32(std::vector<StEntry>& entries, const std::string& name, const std::vector<float>& values) {
  for (StEntry& e : entries)
    if (e.name == name) {
      e.dtype = "F32";
      e.bytes.resize(values.size() * 4);
      std::memcpy(e.bytes.data(), values.data(), e.bytes.size());
    }
}

// The config as the seed's scripts leave it: lm_head out of `ignore`, and with int8 tables a copy
// of group_0 for each (group_1 the lm_head, group_2 the embedding table).
inline void add_vocab_schemes(const std::filesystem::path& dir, bool int8_tables) {
  edit_config(dir, [&](nlohmann::json& j) {
    auto& q = j["quantization_config"];
    q["ignore"].erase(std::remove(q["ignore"].begin(), q["ignore"].end(), "lm_head"), q["ignore"].end());
    if (!int8_tables) return;
    const std::pair<const char*, const char*> groups[] = {{"group_1", "re:.*lm_head$"},
                                                          {"group_2", "re:.*embed_tokens$"}};
    for (const auto& [group, target] : groups) {
      q["config_groups"][group] = q["config_groups"]["group_0"];
      q["config_groups"][group]["weights"]["num_bits"] = 8;
      q["config_groups"][group]["targets"] = nlohmann::json::array({target});
    }
  });
}

// Two copies of the W4A16 fixture `name` (its lm_head and embedding table bf16 [V, H], H a
// multiple of 128): `quantized` with an int8 lm_head (fp16 scales) and an int8 embedding table
// (bf16 scales) when int8_tables, else an int4 lm_head (fp16 scales); `dequantised` with those
// tables as F32 of the same values. The quantized copy's config gets its schemes when
// with_schemes (add_vocab_schemes). Both removed with the object.
struct VocabCopies {
  std::filesystem::path quantized, dequantised;
  VocabCopies(const std::string& name, bool int8_tables, bool with_schemes = true)
      : quantized(copy_fixture(name, "vocab_q")), dequantised(copy_fixture(name, "vocab_f")) {
    const std::string head = "lm_head.weight", embed = "model.language_model.embed_tokens.weight";
    std::vector<float> head_values, embed_values;
    rewrite_weights(quantized, [&](auto& e) {
      head_values = pack_quantize(e, head, int8_tables ? 8 : 4, "F16");
      if (int8_tables) embed_values = pack_quantize(e, embed, 8, "BF16");
    });
    rewrite_weights(dequantised, [&](auto& e) {
      store_f32(e, head, head_values);
      if (int8_tables) store_f32(e, embed, embed_values);
    });
    if (with_schemes) add_vocab_schemes(quantized, int8_tables);
  }
  ~VocabCopies() {
    std::filesystem::remove_all(quantized);
    std::filesystem::remove_all(dequantised);
  }
  VocabCopies(const VocabCopies&) = delete;
  VocabCopies& operator=(const VocabCopies&) = delete;
};

// The MTP head's linears: mtp.fc, and its layer's attention and MLP.
inline std::vector<std::string> mtp_linears() {
  std::vector<std::string> names = {"mtp.fc.weight"};
  for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
    names.push_back(std::string("mtp.layers.0.") + n + ".weight");
  return names;
}

// Two copies of the W4A16 fixture `name` (its MTP head bf16, each linear's K a multiple of 128):
// `quantized` with the MTP head's linears int8 in groups of 128 with bf16 scales, under a scheme
// of their own (group_3, targets re:^mtp\..*, mtp no longer in `ignore`), as the seed's
// requantized checkpoint has them; `dequantised` with those linears as F32 of the same values.
// Both removed with the object.
struct Int8MtpCopies {
  std::filesystem::path quantized, dequantised;
  explicit Int8MtpCopies(const std::string& name)
      : quantized(copy_fixture(name, "mtp_q")), dequantised(copy_fixture(name, "mtp_f")) {
    const std::vector<std::string> names = mtp_linears();
    std::vector<std::vector<float>> values;
    rewrite_weights(quantized, [&](auto& e) {
      for (const std::string& n : names) values.push_back(pack_quantize(e, n, 8, "BF16"));
    });
    rewrite_weights(dequantised, [&](auto& e) {
      for (size_t i = 0; i < names.size(); ++i) store_f32(e, names[i], values[i]);
    });
    edit_config(quantized, [](nlohmann::json& j) {
      auto& q = j["quantization_config"];
      q["ignore"].erase(std::remove(q["ignore"].begin(), q["ignore"].end(), "re:^mtp.*"), q["ignore"].end());
      q["config_groups"]["group_3"] = q["config_groups"]["group_0"];
      q["config_groups"]["group_3"]["weights"]["num_bits"] = 8;
      q["config_groups"]["group_3"]["targets"] = nlohmann::json::array({"re:^mtp\\..*"});
    });
  }
  ~Int8MtpCopies() {
    std::filesystem::remove_all(quantized);
    std::filesystem::remove_all(dequantised);
  }
  Int8MtpCopies(const Int8MtpCopies&) = delete;
  Int8MtpCopies& operator=(const Int8MtpCopies&) = delete;
};

}  // namespace ds::test
