// Weight loading for Qwen35Model: canonical tensor names, expected shapes from the config,
// zero-centred norms turned into plain gains (1 + w, in fp32) at load.
#include <string>

#include "model/qwen3_5.h"

namespace ds {

namespace {

class Loader {
 public:
  Loader(const Checkpoint& ck, Ops& ops) : ck_(ck), ops_(ops) {}

  // A matrix or embedding in the backend's activation dtype.
  Result<Tensor> matrix(const std::string& name, int64_t rows, int64_t cols) {
    DS_ASSIGN_OR_RETURN(CheckpointTensor t, ck_.get_float(name, {rows, cols}));
    return ops_.upload(t.data, t.info->dtype, {rows, cols}, ops_.act_dtype());
  }
  // A small fp32 vector; `plus_one` for zero-centred RMSNorm weights.
  Result<Tensor> vec(const std::string& name, std::vector<int64_t> shape, bool plus_one) {
    DS_ASSIGN_OR_RETURN(std::vector<float> v, ck_.read_f32(name, shape));
    if (plus_one)
      for (float& x : v) x = 1.0f + x;
    int64_t n = static_cast<int64_t>(v.size());
    return ops_.upload(v.data(), DType::kF32, {n}, DType::kF32);
  }

  Status attention(const std::string& p, const ModelConfig& c, AttnWeights* a) {
    const int64_t H = c.hidden_size, hd = c.head_dim, nH = c.num_attention_heads, nKV = c.num_key_value_heads;
    DS_ASSIGN_OR_RETURN(a->q_proj, matrix(p + "q_proj.weight", nH * hd * 2, H));
    DS_ASSIGN_OR_RETURN(a->k_proj, matrix(p + "k_proj.weight", nKV * hd, H));
    DS_ASSIGN_OR_RETURN(a->v_proj, matrix(p + "v_proj.weight", nKV * hd, H));
    DS_ASSIGN_OR_RETURN(a->o_proj, matrix(p + "o_proj.weight", H, nH * hd));
    DS_ASSIGN_OR_RETURN(a->q_norm, vec(p + "q_norm.weight", {hd}, true));
    DS_ASSIGN_OR_RETURN(a->k_norm, vec(p + "k_norm.weight", {hd}, true));
    return Status();
  }

  Status mlp(const std::string& p, const ModelConfig& c, MlpWeights* m) {
    const int64_t H = c.hidden_size, I = c.intermediate_size;
    DS_ASSIGN_OR_RETURN(m->gate_proj, matrix(p + "gate_proj.weight", I, H));
    DS_ASSIGN_OR_RETURN(m->up_proj, matrix(p + "up_proj.weight", I, H));
    DS_ASSIGN_OR_RETURN(m->down_proj, matrix(p + "down_proj.weight", H, I));
    return Status();
  }

  Status gdn(const std::string& p, const ModelConfig& c, GdnWeights* g) {
    const int64_t H = c.hidden_size, C = c.conv_dim(), Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
    const int64_t K = c.linear_conv_kernel_dim;
    DS_ASSIGN_OR_RETURN(g->in_proj_qkv, matrix(p + "in_proj_qkv.weight", C, H));
    DS_ASSIGN_OR_RETURN(g->in_proj_z, matrix(p + "in_proj_z.weight", Hv * dv, H));
    DS_ASSIGN_OR_RETURN(g->in_proj_b, matrix(p + "in_proj_b.weight", Hv, H));
    DS_ASSIGN_OR_RETURN(g->in_proj_a, matrix(p + "in_proj_a.weight", Hv, H));
    DS_ASSIGN_OR_RETURN(std::vector<float> conv, ck_.read_f32(p + "conv1d.weight", {C, 1, K}));
    g->conv1d = ops_.upload(conv.data(), DType::kF32, {C, K}, DType::kF32);
    DS_ASSIGN_OR_RETURN(g->a_log, vec(p + "A_log", {Hv}, false));
    DS_ASSIGN_OR_RETURN(g->dt_bias, vec(p + "dt_bias", {Hv}, false));
    DS_ASSIGN_OR_RETURN(g->norm, vec(p + "norm.weight", {dv}, false));
    DS_ASSIGN_OR_RETURN(g->out_proj, matrix(p + "out_proj.weight", H, Hv * dv));
    return Status();
  }

 private:
  const Checkpoint& ck_;
  Ops& ops_;
};

}  // namespace

Result<ModelWeights> load_weights(const Checkpoint& ck, Ops& ops) {
  const ModelConfig& c = ck.config();
  const int64_t H = c.hidden_size, V = c.vocab_size;
  Loader ld(ck, ops);
  ModelWeights w;
  DS_ASSIGN_OR_RETURN(w.embed, ld.matrix("model.embed_tokens.weight", V, H));
  DS_ASSIGN_OR_RETURN(w.final_norm, ld.vec("model.norm.weight", {H}, true));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else {
    DS_ASSIGN_OR_RETURN(w.lm_head, ld.matrix("lm_head.weight", V, H));
  }
  int n_gdn = 0, n_attn = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights L;
    L.type = c.layer_types[i];
    DS_ASSIGN_OR_RETURN(L.input_norm, ld.vec(p + "input_layernorm.weight", {H}, true));
    DS_ASSIGN_OR_RETURN(L.post_attn_norm, ld.vec(p + "post_attention_layernorm.weight", {H}, true));
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
  // The MTP head is optional; when any mtp.* tensor exists, all of them must.
  if (ck.has_prefix("mtp.")) {
    MtpWeights m;
    DS_ASSIGN_OR_RETURN(m.fc, ld.matrix("mtp.fc.weight", H, 2 * H));
    DS_ASSIGN_OR_RETURN(m.pre_fc_norm_embedding, ld.vec("mtp.pre_fc_norm_embedding.weight", {H}, true));
    DS_ASSIGN_OR_RETURN(m.pre_fc_norm_hidden, ld.vec("mtp.pre_fc_norm_hidden.weight", {H}, true));
    DS_ASSIGN_OR_RETURN(m.norm, ld.vec("mtp.norm.weight", {H}, true));
    m.layer.type = LayerType::kFullAttention;
    m.layer.cache_index = n_attn;
    DS_ASSIGN_OR_RETURN(m.layer.input_norm, ld.vec("mtp.layers.0.input_layernorm.weight", {H}, true));
    DS_ASSIGN_OR_RETURN(m.layer.post_attn_norm, ld.vec("mtp.layers.0.post_attention_layernorm.weight", {H}, true));
    DS_RETURN_IF_ERROR(ld.attention("mtp.layers.0.self_attn.", c, &m.layer.attn));
    DS_RETURN_IF_ERROR(ld.mlp("mtp.layers.0.mlp.", c, &m.layer.mlp));
    w.mtp = std::move(m);
  }
  return w;
}

}  // namespace ds
