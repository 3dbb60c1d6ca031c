// Checkpoint: a Hugging Face model folder (config.json + single or sharded safetensors).
// Maps published tensor names to canonical ones ("model.layers.N...", "lm_head.weight",
// "mtp...."), skips vision weights, and hands out validated views. Knows no model math.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace ds {

// A tensor inside an mmap'd file: valid while its Checkpoint lives.
struct CheckpointTensor {
  const TensorInfo* info = nullptr;
  const void* data = nullptr;
  const std::string* file = nullptr;  // path of the file holding it
};

// A compressed-tensors pack-quantized linear as stored (validated, copied out of the mmap).
struct PackedLinear {
  int bits = 4, group_size = 128;
  int64_t rows = 0, cols = 0, words_per_row = 0;
  std::vector<int32_t> packed;  // i32 [rows, words_per_row]: value j of word c is column c*(32/bits)+j, + 2^(bits-1)
  std::vector<float> scales;    // f32 [rows, ceil(cols / group_size)], signed
  std::vector<int32_t> g_idx;   // i32 [cols] column -> group (actorder "group"), empty for column / group_size
};

// The codes of an 8-bit PackedLinear without a g_idx, i8 [rows, cols]: value (r, k) is
// codes[r * cols + k] * scales[r * groups + k / group_size].
std::vector<int8_t> int8_codes(const PackedLinear& p);

class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  bool has(const std::string& canonical_name) const { return tensors_.count(canonical_name) != 0; }
  bool has_prefix(const std::string& prefix) const;

  // The tensor `name` (canonical), checked against `shape` and required to be a float dtype.
  Result<CheckpointTensor> get_float(const std::string& name, const std::vector<int64_t>& shape) const;
  // The same, converted to fp32.
  Result<std::vector<float>> read_f32(const std::string& name, const std::vector<int64_t>& shape) const;

  // The weight of linear `module` (e.g. "model.layers.0.mlp.up_proj") as fp32 [rows, cols]:
  // `module.weight`, or the dequantised compressed-tensors `module.weight_packed` +
  // `weight_scale` (+ `weight_shape`, `weight_g_idx`) when the checkpoint has them.
  Result<std::vector<float>> read_linear_f32(const std::string& module, int64_t rows, int64_t cols) const;
  bool is_quantized(const std::string& module) const { return has(module + ".weight_packed"); }
  // The scheme of config.json's quantization_config that packed quantized linear `module`
  // [rows, cols], told by its tensors' shapes; an error where none fits, or two that read it
  // differently do.
  Result<QuantScheme> packed_scheme(const std::string& module, int64_t rows, int64_t cols) const;
  // The packed tensors of quantized linear `module`, checked against [rows, cols].
  Result<PackedLinear> read_packed(const std::string& module, int64_t rows, int64_t cols) const;

  static std::string canonical_name(const std::string& published);  // "" for ignored tensors

 private:
  Status add_file(const std::string& path);
  // The tensor `name` with exact dtype and shape (for integer tensors).
  Result<CheckpointTensor> get_exact(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const;

  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, CheckpointTensor> tensors_;
};

}  // namespace ds
