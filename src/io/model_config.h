// ModelConfig: the qwen3_5 text model's hyper-parameters read from config.json, in either
// layout (multimodal wrapper with text_config, or text-only). Validated here, so the model
// code may trust every field.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace ds {

enum class LayerType { kLinearAttention, kFullAttention };

// compressed-tensors "pack-quantized" weights (architecture reference §8): int4 (or int8) values
// packed into int32 along the input dim, one signed scale per (row, group of input columns).
// QuantScheme: one config group's weights, symmetric ints in groups of group_size input columns.
struct QuantScheme {
  std::string name;  // the config group's, e.g. "group_0"
  int bits = 4;      // 4 or 8
  int group_size = 128;
};
struct QuantConfig {
  bool present = false;
  // Every config group's scheme, in config order. A checkpoint may mix them (the body int4, the
  // lm_head and embedding int8): a packed tensor's shapes say which one it is (Checkpoint::read_packed).
  std::vector<QuantScheme> schemes;
};

struct ModelConfig {
  std::string model_type;    // "qwen3_5" (wrapper) or "qwen3_5_text"
  bool wrapper = false;      // fields came from "text_config"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  std::vector<LayerType> layer_types;  // [num_hidden_layers]
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;

  // gated full attention
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  double rope_theta = 10000.0;
  float partial_rotary_factor = 1.0f;
  int rotary_dim = 0;                 // head_dim * partial_rotary_factor (even)
  std::vector<int> mrope_section;     // informational for text-only input

  // Gated DeltaNet
  int linear_num_key_heads = 0;       // Hk
  int linear_num_value_heads = 0;     // Hv (multiple of Hk)
  int linear_key_head_dim = 0;        // dk
  int linear_value_head_dim = 0;      // dv
  int linear_conv_kernel_dim = 4;     // K
  bool output_gate_sigmoid = false;   // output_gate_type "sigmoid"; "swish"/"silu" (default) -> SiLU

  int mtp_num_hidden_layers = 0;      // from config; the checkpoint decides whether mtp.* exists
  int max_position_embeddings = 0;
  std::vector<int> eos_token_ids;
  int bos_token_id = -1;
  std::string dtype;                  // "bfloat16", ...
  QuantConfig quant;                  // from quantization_config (top level of config.json)

  int n_full_attention_layers() const;
  int n_linear_attention_layers() const;
  int conv_dim() const { return 2 * linear_num_key_heads * linear_key_head_dim + linear_num_value_heads * linear_value_head_dim; }
};

// `path` is used only in error messages.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& path);
Result<ModelConfig> load_model_config(const std::string& path);

}  // namespace ds
