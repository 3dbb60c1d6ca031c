// config.json -> ModelConfig. Reads cfg.get("text_config", cfg); accepts rope fields nested
// in rope_parameters or flattened (MLX); builds layer_types from full_attention_interval.
#include "io/model_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ds {

using nlohmann::json;

int ModelConfig::n_full_attention_layers() const {
  int n = 0;
  for (auto t : layer_types) n += t == LayerType::kFullAttention;
  return n;
}
int ModelConfig::n_linear_attention_layers() const { return num_hidden_layers - n_full_attention_layers(); }

namespace {

class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  Status err(const std::string& field, const std::string& why) const {
    return invalid_argument(path_ + ": field '" + field + "' " + why);
  }
  Status get_int(const char* key, int* out, bool required, int min_value = 1) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return required ? err(key, "is missing") : Status();
    if (!it->is_number_integer()) return err(key, "must be an integer, found " + it->dump());
    long long v = it->get<long long>();
    if (v < min_value || v > (1ll << 31) - 1) return err(key, "must be >= " + std::to_string(min_value) + ", found " + it->dump());
    *out = static_cast<int>(v);
    return Status();
  }
  Status get_number(const json& obj, const char* key, double* out) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return Status();
    if (!it->is_number()) return err(key, "must be a number, found " + it->dump());
    *out = it->get<double>();
    return Status();
  }
  const json& j() const { return j_; }

 private:
  const json& j_;
  std::string path_;
};

// quantization_config: compressed-tensors pack-quantized, symmetric int4/int8 weight groups, one
// scheme a config group. Anything else is refused by name rather than loaded wrongly.
Status parse_quant_config(const json& root, const std::string& path, QuantConfig* q) try {
  auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return Status();
  const json& qc = *it;
  auto where = [&](const std::string& m) { return unsupported(path + ": quantization_config " + m); };
  if (!qc.is_object()) return invalid_argument(path + ": quantization_config is not an object");
  const std::string method = qc.value("quant_method", "");
  const std::string format = qc.value("format", "");
  if (method != "compressed-tensors") return where("quant_method \"" + method + "\" is not supported (compressed-tensors only)");
  if (format != "pack-quantized") return where("format \"" + format + "\" is not supported (pack-quantized only)");
  auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object() || groups->empty()) return where("has no config_groups");
  for (auto g = groups->begin(); g != groups->end(); ++g) {
    const json& w = (*g).value("weights", json::object());
    if (!w.is_object()) return where("group '" + g.key() + "' has no weights scheme");
    if ((*g).contains("input_activations") && !(*g)["input_activations"].is_null())
      return where("group '" + g.key() + "' quantizes activations (only weight-only schemes are supported)");
    const int bits = w.value("num_bits", 0);
    const std::string type = w.value("type", "int"), strategy = w.value("strategy", "");
    const int group_size = w.value("group_size", 0);
    const bool symmetric = w.value("symmetric", true);
    if (type != "int" || (bits != 4 && bits != 8)) return where("group '" + g.key() + "': only int4/int8 weights");
    if (strategy != "group" || group_size <= 0 || group_size % 8 != 0)
      return where("group '" + g.key() + "': only the \"group\" strategy with a group_size multiple of 8");
    if (!symmetric) return where("group '" + g.key() + "': asymmetric (zero-point) weights are not supported yet");
    q->schemes.push_back({g.key(), bits, group_size});
  }
  q->present = true;
  return Status();
} catch (const json::exception& e) {  // a field of the wrong JSON type
  return invalid_argument(path + ": quantization_config: " + e.what());
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& path) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid_argument(path + ": not valid JSON");
  if (!root.is_object()) return invalid_argument(path + ": top level is not a JSON object");
  ModelConfig c;
  auto mt = root.find("model_type");
  if (mt == root.end() || !mt->is_string()) return invalid_argument(path + ": field 'model_type' is missing");
  c.model_type = mt->get<std::string>();
  if (c.model_type != "qwen3_5" && c.model_type != "qwen3_5_text")
    return unsupported(path + ": unsupported model_type '" + c.model_type +
                       "' (deltaserve serves the qwen3_5 family: model_type 'qwen3_5' or 'qwen3_5_text')");
  const json* tj = &root;
  auto tc = root.find("text_config");
  if (tc != root.end()) {
    if (!tc->is_object()) return invalid_argument(path + ": field 'text_config' is not an object");
    tj = &*tc;
    c.wrapper = true;
  }
  Reader r(*tj, path + (c.wrapper ? " (text_config)" : ""));
  DS_RETURN_IF_ERROR(r.get_int("vocab_size", &c.vocab_size, true));
  DS_RETURN_IF_ERROR(r.get_int("hidden_size", &c.hidden_size, true));
  DS_RETURN_IF_ERROR(r.get_int("intermediate_size", &c.intermediate_size, true));
  DS_RETURN_IF_ERROR(r.get_int("num_hidden_layers", &c.num_hidden_layers, true));
  DS_RETURN_IF_ERROR(r.get_int("num_attention_heads", &c.num_attention_heads, true));
  DS_RETURN_IF_ERROR(r.get_int("num_key_value_heads", &c.num_key_value_heads, true));
  c.head_dim = c.hidden_size / c.num_attention_heads;
  DS_RETURN_IF_ERROR(r.get_int("head_dim", &c.head_dim, false));
  c.linear_num_key_heads = 16, c.linear_num_value_heads = 32, c.linear_key_head_dim = 128, c.linear_value_head_dim = 128;
  DS_RETURN_IF_ERROR(r.get_int("linear_num_key_heads", &c.linear_num_key_heads, false));
  DS_RETURN_IF_ERROR(r.get_int("linear_num_value_heads", &c.linear_num_value_heads, false));
  DS_RETURN_IF_ERROR(r.get_int("linear_key_head_dim", &c.linear_key_head_dim, false));
  DS_RETURN_IF_ERROR(r.get_int("linear_value_head_dim", &c.linear_value_head_dim, false));
  DS_RETURN_IF_ERROR(r.get_int("linear_conv_kernel_dim", &c.linear_conv_kernel_dim, false));
  DS_RETURN_IF_ERROR(r.get_int("mtp_num_hidden_layers", &c.mtp_num_hidden_layers, false, 0));
  c.max_position_embeddings = 262144;
  DS_RETURN_IF_ERROR(r.get_int("max_position_embeddings", &c.max_position_embeddings, false));
  double eps = 1e-6;
  DS_RETURN_IF_ERROR(r.get_number(*tj, "rms_norm_eps", &eps));
  c.rms_norm_eps = static_cast<float>(eps);

  auto bool_field = [&](const char* key, bool* out) -> Status {
    auto it = tj->find(key);
    if (it == tj->end() || it->is_null()) {
      it = root.find(key);
      if (it == root.end() || it->is_null()) return Status();
    }
    if (!it->is_boolean()) return r.err(key, "must be true or false");
    *out = it->get<bool>();
    return Status();
  };
  DS_RETURN_IF_ERROR(bool_field("tie_word_embeddings", &c.tie_word_embeddings));
  bool attention_bias = false;
  DS_RETURN_IF_ERROR(bool_field("attention_bias", &attention_bias));
  if (attention_bias) return unsupported(path + ": attention_bias=true is not part of qwen3_5");
  if (auto it = tj->find("hidden_act"); it != tj->end() && *it != "silu")
    return unsupported(path + ": hidden_act " + it->dump() + " is not supported (qwen3_5 uses \"silu\")");
  if (auto it = tj->find("output_gate_type"); it != tj->end() && !it->is_null()) {
    std::string g = it->is_string() ? it->get<std::string>() : "";
    if (g == "sigmoid") c.output_gate_sigmoid = true;
    else if (g != "swish" && g != "silu") return r.err("output_gate_type", "must be \"swish\", \"silu\" or \"sigmoid\"");
  }

  // layer_types, or full_attention_interval (default 4) to build them.
  if (auto lt = tj->find("layer_types"); lt != tj->end() && !lt->is_null()) {
    if (!lt->is_array()) return r.err("layer_types", "must be an array");
    for (const auto& t : *lt) {
      if (t == "linear_attention") c.layer_types.push_back(LayerType::kLinearAttention);
      else if (t == "full_attention") c.layer_types.push_back(LayerType::kFullAttention);
      else return r.err("layer_types", "has unknown layer type " + t.dump());
    }
    if (static_cast<int>(c.layer_types.size()) != c.num_hidden_layers)
      return r.err("layer_types", "has " + std::to_string(c.layer_types.size()) + " entries but num_hidden_layers is " +
                                      std::to_string(c.num_hidden_layers));
  } else {
    int interval = 4;
    DS_RETURN_IF_ERROR(r.get_int("full_attention_interval", &interval, false));
    for (int i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::kFullAttention : LayerType::kLinearAttention);
  }

  // RoPE: rope_parameters (or legacy rope_scaling), or flattened fields.
  const json* rp = tj;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = tj->find(key);
    if (it != tj->end() && it->is_object()) {
      rp = &*it;
      break;
    }
  }
  if (auto it = rp->find("rope_type"); it != rp->end() && it->is_string() && *it != "default")
    return unsupported(path + ": rope_type " + it->dump() + " is not supported yet (only \"default\")");
  double theta = 10000.0, prf = 0.25;
  DS_RETURN_IF_ERROR(r.get_number(*tj, "rope_theta", &theta));
  DS_RETURN_IF_ERROR(r.get_number(*rp, "rope_theta", &theta));
  DS_RETURN_IF_ERROR(r.get_number(*tj, "partial_rotary_factor", &prf));
  DS_RETURN_IF_ERROR(r.get_number(*rp, "partial_rotary_factor", &prf));
  c.rope_theta = theta;
  c.partial_rotary_factor = static_cast<float>(prf);
  c.rotary_dim = static_cast<int>(c.head_dim * prf);
  if (theta <= 0) return r.err("rope_theta", "must be positive");
  if (prf <= 0 || prf > 1 || c.rotary_dim % 2 != 0 || c.rotary_dim == 0)
    return r.err("partial_rotary_factor", "gives rotary dim " + std::to_string(c.rotary_dim) + " of head_dim " +
                                              std::to_string(c.head_dim) + "; it must be even and positive");
  if (auto it = rp->find("mrope_section"); it != rp->end() && it->is_array())
    for (const auto& s : *it)
      if (s.is_number_integer()) c.mrope_section.push_back(s.get<int>());

  // Structural checks the kernels rely on.
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    return r.err("num_key_value_heads", "must divide num_attention_heads");
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    return r.err("linear_num_value_heads", "must be a multiple of linear_num_key_heads");
  if (c.linear_conv_kernel_dim < 2) return r.err("linear_conv_kernel_dim", "must be at least 2");

  // Token ids: text_config first, then the wrapper.
  auto field = [&](const char* key) -> const json* {
    auto it = tj->find(key);
    if (it != tj->end() && !it->is_null()) return &*it;
    it = root.find(key);
    return it != root.end() && !it->is_null() ? &*it : nullptr;
  };
  if (const json* e = field("eos_token_id")) {
    if (e->is_number_integer()) c.eos_token_ids.push_back(e->get<int>());
    else if (e->is_array())
      for (const auto& v : *e)
        if (v.is_number_integer()) c.eos_token_ids.push_back(v.get<int>());
  }
  if (const json* b = field("bos_token_id"); b && b->is_number_integer()) c.bos_token_id = b->get<int>();
  for (const char* key : {"dtype", "torch_dtype"}) {
    const json* d = field(key);
    if (d && d->is_string()) {
      c.dtype = d->get<std::string>();
      break;
    }
  }
  DS_RETURN_IF_ERROR(parse_quant_config(root, path, &c.quant));
  return c;
}

Result<ModelConfig> load_model_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return io_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace ds

