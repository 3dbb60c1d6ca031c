// Weights of Qwen35Model: canonical tensor names and expected shapes from the config, read
// from a checkpoint (zero-centred norms turned into plain gains, 1 + w in fp32) or drawn at
// random on the backend for synthetic benchmarks.
#include <cmath>
#include <cstring>
#include <string>

#include "model/qwen3_5.h"

namespace ds {

namespace {

// How a fp32 parameter is stored and, for synthetic weights, drawn.
enum class ParamKind { kNorm1p, kGain, kALog, kDtBias, kConv };

// Where weight values come from: a checkpoint folder, or random values of the right shapes.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // A matrix or embedding [rows, cols] in the backend's activation dtype.
  virtual Result<Tensor> matrix(const std::string& name, int64_t rows, int64_t cols) = 0;
  // The weight `name` of a linear layer [rows, cols]: W4A16 where the source has it and the
  // backend runs it, else dense.
  virtual Result<LinearWeight> linear(const std::string& name, int64_t rows, int64_t cols) = 0;
  // A fp32 parameter published with `shape`, stored as [rows, cols] (cols 0: a vector of rows).
  virtual Result<Tensor> f32(const std::string& name, const std::vector<int64_t>& shape, int64_t rows, int64_t cols,
                             ParamKind kind) = 0;
};

class CheckpointSource final : public WeightSource {
 public:
  CheckpointSource(const Checkpoint& ck, Ops& ops) : ck_(ck), ops_(ops) {}
  Result<Tensor> matrix(const std::string& name, int64_t rows, int64_t cols) override {
    DS_ASSIGN_OR_RETURN(CheckpointTensor t, ck_.get_float(name, {rows, cols}));
    return ops_.upload(t.data, t.info->dtype, {rows, cols}, ops_.act_dtype());
  }
  Result<LinearWeight> linear(const std::string& name, int64_t rows, int64_t cols) override {
    const std::string module = name.substr(0, name.size() - std::strlen(".weight"));
    LinearWeight w;
    if (!ck_.is_quantized(module)) {
      DS_ASSIGN_OR_RETURN(w.dense, matrix(name, rows, cols));
      return w;
    }
    DS_ASSIGN_OR_RETURN(PackedLinear p, ck_.read_packed(module, rows, cols));
    if (ops_.supports_w4a16() && p.bits == 4 && p.g_idx.empty() && cols % p.group_size == 0) {
      w.packed = ops_.upload(p.packed.data(), DType::kI32, {rows, cols / 8}, DType::kI32);
      w.scales = ops_.upload(p.scales.data(), DType::kF32, {rows, cols / p.group_size}, DType::kF32);
      w.group_size = p.group_size;
      return w;
    }
    // Dequantised at load: exact in fp32, rounded once for a bf16 backend.
    DS_ASSIGN_OR_RETURN(std::vector<float> dense, ck_.read_linear_f32(module, rows, cols));
    w.dense = ops_.upload(dense.data(), DType::kF32, {rows, cols}, ops_.act_dtype());
    return w;
  }
  Result<Tensor> f32(const std::string& name, const std::vector<int64_t>& shape, int64_t rows, int64_t cols,
                     ParamKind kind) override {
    DS_ASSIGN_OR_RETURN(std::vector<float> v, ck_.read_f32(name, shape));
    if (kind == ParamKind::kNorm1p)  // zero-centred RMSNorm: the gain is 1 + w, added in fp32
      for (float& x : v) x = 1.0f + x;
    return cols ? ops_.upload(v.data(), DType::kF32, {rows, cols}, DType::kF32)
                : ops_.upload(v.data(), DType::kF32, {rows}, DType::kF32);
  }

 private:
  const Checkpoint& ck_;
  Ops& ops_;
};

// Random weights drawn on the backend (uniform, scaled so activations stay O(1)).
class SyntheticSource final : public WeightSource {
 public:
  SyntheticSource(Ops& ops, bool w4a16, uint64_t seed) : ops_(ops), w4a16_(w4a16 && ops.supports_w4a16()), seed_(seed) {}
  Result<Tensor> matrix(const std::string& name, int64_t rows, int64_t cols) override {
    Tensor t = ops_.alloc(ops_.act_dtype(), {rows, cols});
    const bool embedding = name.find("embed_tokens") != std::string::npos;
    ops_.fill_random(t, 0.f, embedding ? 1.f : 1.7f / std::sqrt(static_cast<float>(cols)), seed_++);
    return t;
  }
  Result<LinearWeight> linear(const std::string& name, int64_t rows, int64_t cols) override {
    LinearWeight w;
    const bool keep_dense = name == "lm_head.weight" || name.find("in_proj_a") != std::string::npos ||
                            name.find("in_proj_b") != std::string::npos || name.rfind("mtp.", 0) == 0;
    if (!w4a16_ || keep_dense || cols % kGroup != 0) {
      DS_ASSIGN_OR_RETURN(w.dense, matrix(name, rows, cols));
      return w;
    }
    w.packed = ops_.alloc(DType::kI32, {rows, cols / 8});
    ops_.fill_random(w.packed, 0.f, 0.f, seed_++);  // random nibbles: q uniform in [-8, 7]
    w.scales = ops_.alloc(DType::kF32, {rows, cols / kGroup});
    // |q| averages 4: scales of 0.4/sqrt(K) give the dense weights' spread
    ops_.fill_random(w.scales, 0.f, 0.4f / std::sqrt(static_cast<float>(cols)), seed_++);
    w.group_size = kGroup;
    return w;
  }
  Result<Tensor> f32(const std::string&, const std::vector<int64_t>&, int64_t rows, int64_t cols,
                     ParamKind kind) override {
    Tensor t = cols ? ops_.alloc(DType::kF32, {rows, cols}) : ops_.alloc(DType::kF32, {rows});
    static constexpr float kMean[] = {1.f, 1.f, 0.f, 0.f, 0.f};
    static constexpr float kRange[] = {0.1f, 0.1f, 1.f, 0.5f, 0.5f};
    ops_.fill_random(t, kMean[static_cast<int>(kind)], kRange[static_cast<int>(kind)], seed_++);
    return t;
  }

 private:
  static constexpr int kGroup = 128;
  Ops& ops_;
  bool w4a16_;
  uint64_t seed_;
};

class Loader {
 public:
  Loader(WeightSource& src, Ops& ops) : src_(src), ops_(ops) {}

  // A weight matrix handed to the backend's prepare_weight once its values are final.
  Result<LinearWeight> lin(const std::string& name, int64_t rows, int64_t cols, WeightRole role = WeightRole::kLinear) {
    LinearWeight w;
    if (role == WeightRole::kEmbedding) {
      DS_ASSIGN_OR_RETURN(w.dense, src_.matrix(name, rows, cols));
    } else {
      DS_ASSIGN_OR_RETURN(w, src_.linear(name, rows, cols));
    }
    ops_.prepare_weight(w, role);
    return w;
  }
  Result<Tensor> norm(const std::string& name, int64_t n) { return src_.f32(name, {n}, n, 0, ParamKind::kNorm1p); }

  Status attention(const std::string& p, const ModelConfig& c, AttnWeights* a) {
    const int64_t H = c.hidden_size, hd = c.head_dim, nH = c.num_attention_heads, nKV = c.num_key_value_heads;
    DS_ASSIGN_OR_RETURN(a->q_proj, lin(p + "q_proj.weight", nH * hd * 2, H));
    DS_ASSIGN_OR_RETURN(a->k_proj, lin(p + "k_proj.weight", nKV * hd, H));
    DS_ASSIGN_OR_RETURN(a->v_proj, lin(p + "v_proj.weight", nKV * hd, H));
    DS_ASSIGN_OR_RETURN(a->o_proj, lin(p + "o_proj.weight", H, nH * hd));
    DS_ASSIGN_OR_RETURN(a->q_norm, norm(p + "q_norm.weight", hd));
    DS_ASSIGN_OR_RETURN(a->k_norm, norm(p + "k_norm.weight", hd));
    return Status();
  }

  Status mlp(const std::string& p, const ModelConfig& c, MlpWeights* m) {
    const int64_t H = c.hidden_size, I = c.intermediate_size;
    DS_ASSIGN_OR_RETURN(m->gate_proj, lin(p + "gate_proj.weight", I, H));
    DS_ASSIGN_OR_RETURN(m->up_proj, lin(p + "up_proj.weight", I, H));
    DS_ASSIGN_OR_RETURN(m->down_proj, lin(p + "down_proj.weight", H, I));
    return Status();
  }

  Status gdn(const std::string& p, const ModelConfig& c, GdnWeights* g) {
    const int64_t H = c.hidden_size, C = c.conv_dim(), Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
    const int64_t K = c.linear_conv_kernel_dim;
    DS_ASSIGN_OR_RETURN(g->in_proj_qkv, lin(p + "in_proj_qkv.weight", C, H));
    DS_ASSIGN_OR_RETURN(g->in_proj_z, lin(p + "in_proj_z.weight", Hv * dv, H));
    DS_ASSIGN_OR_RETURN(g->in_proj_b, lin(p + "in_proj_b.weight", Hv, H));
    DS_ASSIGN_OR_RETURN(g->in_proj_a, lin(p + "in_proj_a.weight", Hv, H));
    DS_ASSIGN_OR_RETURN(g->conv1d, src_.f32(p + "conv1d.weight", {C, 1, K}, C, K, ParamKind::kConv));
    DS_ASSIGN_OR_RETURN(g->a_log, src_.f32(p + "A_log", {Hv}, Hv, 0, ParamKind::kALog));
    DS_ASSIGN_OR_RETURN(g->dt_bias, src_.f32(p + "dt_bias", {Hv}, Hv, 0, ParamKind::kDtBias));
    DS_ASSIGN_OR_RETURN(g->norm, src_.f32(p + "norm.weight", {dv}, dv, 0, ParamKind::kGain));
    DS_ASSIGN_OR_RETURN(g->out_proj, lin(p + "out_proj.weight", H, Hv * dv));
    return Status();
  }

 private:
  WeightSource& src_;
  Ops& ops_;
};

// Every tensor the config implies, from `src`; the MTP head when with_mtp.
Result<ModelWeights> build_weights(const ModelConfig& c, WeightSource& src, Ops& ops, bool with_mtp) {
  const int64_t H = c.hidden_size, V = c.vocab_size;
  Loader ld(src, ops);
  ModelWeights w;
  DS_ASSIGN_OR_RETURN(w.embed, ld.lin("model.embed_tokens.weight", V, H, WeightRole::kEmbedding));
  DS_ASSIGN_OR_RETURN(w.final_norm, ld.norm("model.norm.weight", H));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;  // one table (in the backend's storage) serves both
  } else {
    DS_ASSIGN_OR_RETURN(w.lm_head, ld.lin("lm_head.weight", V, H, WeightRole::kLmHead));
  }
  int n_gdn = 0, n_attn = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights L;
    L.type = c.layer_types[i];
    DS_ASSIGN_OR_RETURN(L.input_norm, ld.norm(p + "input_layernorm.weight", H));
    DS_ASSIGN_OR_RETURN(L.post_attn_norm, ld.norm(p + "post_attention_layernorm.weight", H));
    if (L.type == LayerType::kLinearAttention) {
      L.cache_index = n_gdn++;
      DS_RETURN_IF_ERROR(ld.gdn(p + "linear_attn.", c, &L.gdn));
    } else {
      L.cache_index = n_attn++;
      DS_RETURN_IF_ERROR(ld.attention(p + "self_attn.", c, &L.attn));
    }
    DS_RETURN_IF_ERROR(ld.mlp(p + "mlp.", c, &L.mlp));
    w.layers.push_back(std::move(L));
  }
  if (with_mtp) {
    MtpWeights m;
    DS_ASSIGN_OR_RETURN(m.fc, ld.lin("mtp.fc.weight", H, 2 * H));
    DS_ASSIGN_OR_RETURN(m.pre_fc_norm_embedding, ld.norm("mtp.pre_fc_norm_embedding.weight", H));
    DS_ASSIGN_OR_RETURN(m.pre_fc_norm_hidden, ld.norm("mtp.pre_fc_norm_hidden.weight", H));
    DS_ASSIGN_OR_RETURN(m.norm, ld.norm("mtp.norm.weight", H));
    m.layer.type = LayerType::kFullAttention;
    m.layer.cache_index = n_attn;
    DS_ASSIGN_OR_RETURN(m.layer.input_norm, ld.norm("mtp.layers.0.input_layernorm.weight", H));
    DS_ASSIGN_OR_RETURN(m.layer.post_attn_norm, ld.norm("mtp.layers.0.post_attention_layernorm.weight", H));
    DS_RETURN_IF_ERROR(ld.attention("mtp.layers.0.self_attn.", c, &m.layer.attn));
    DS_RETURN_IF_ERROR(ld.mlp("mtp.layers.0.mlp.", c, &m.layer.mlp));
    w.mtp = std::move(m);
  }
  return w;
}

}  // namespace

Result<ModelWeights> load_weights(const Checkpoint& ck, Ops& ops) {
  CheckpointSource src(ck, ops);
  // The MTP head is optional; when any mtp.* tensor exists, all of them must.
  return build_weights(ck.config(), src, ops, ck.has_prefix("mtp."));
}

Result<ModelWeights> synthetic_weights(const ModelConfig& config, Ops& ops, bool with_mtp, bool w4a16, uint64_t seed) {
  SyntheticSource src(ops, w4a16, seed);
  return build_weights(config, src, ops, with_mtp);
}

}  // namespace ds
