// The qwen3_5 forward, top to bottom (architecture reference §3-§6). Every intermediate has
// the name HF's module uses, so it can be dumped and compared layer by layer.
#include "model/qwen3_5.h"

#include <cmath>

#include "core/log.h"

namespace ds {

Result<std::unique_ptr<Qwen35Model>> Qwen35Model::load(const Checkpoint& ck, Ops& ops) {
  DS_ASSIGN_OR_RETURN(ModelWeights w, load_weights(ck, ops));
  const ModelConfig& c = ck.config();
  DS_LOG_INFO("model", "%s: %d layers (%d GDN, %d attention), hidden %d, vocab %d, MTP %s", ck.dir().c_str(),
              c.num_hidden_layers, c.n_linear_attention_layers(), c.n_full_attention_layers(), c.hidden_size,
              c.vocab_size, w.mtp ? "yes" : "no");
  return std::unique_ptr<Qwen35Model>(new Qwen35Model(c, std::move(w), ops));
}

Result<std::unique_ptr<Qwen35Model>> Qwen35Model::synthetic(const ModelConfig& config, Ops& ops, bool with_mtp,
                                                             bool w4a16, uint64_t seed) {
  DS_ASSIGN_OR_RETURN(ModelWeights w, synthetic_weights(config, ops, with_mtp, w4a16, seed));
  return std::unique_ptr<Qwen35Model>(new Qwen35Model(config, std::move(w), ops));
}

CacheGeometry Qwen35Model::cache_geometry(int n_blocks, int block_size, int n_slots) const {
  CacheGeometry g;
  g.n_kv_layers = cfg_.n_full_attention_layers() + (has_mtp() ? 1 : 0);
  g.n_blocks = n_blocks;
  g.block_size = block_size;
  g.n_kv_heads = cfg_.num_key_value_heads;
  g.head_dim = cfg_.head_dim;
  g.n_state_layers = cfg_.n_linear_attention_layers();
  g.n_slots = n_slots;
  g.conv_rows = cfg_.linear_conv_kernel_dim - 1;
  g.conv_dim = cfg_.conv_dim();
  g.n_v_heads = cfg_.linear_num_value_heads;
  g.k_head_dim = cfg_.linear_key_head_dim;
  g.v_head_dim = cfg_.linear_value_head_dim;
  return g;
}

void Qwen35Model::linear(Tensor x, const FusedLinear& w, std::initializer_list<Tensor> outs, const ConvOfFirst* conv) {
  size_t n_grouped = 0;
  for (const FusedLinear::Group& g : w.groups) n_grouped += g.n_parts;
  DS_ASSERT(outs.size() == w.rows.size() && n_grouped == w.rows.size(),
            "%zu outputs for a fused linear of %zu parts, %zu of them in groups", outs.size(), w.rows.size(), n_grouped);
  const Tensor* part = outs.begin();
  for (const FusedLinear::Group& g : w.groups) {
    const std::span<const Tensor> parts(part, g.n_parts);
    if (conv && part == outs.begin())
      ops_.linear_parts_conv1d_silu(x, g.w, parts, false, conv->w, conv->state_layer, conv->out);
    else
      ops_.linear_parts(x, g.w, parts, part != outs.begin());
    part += g.n_parts;
  }
}

// Gated DeltaNet token mixer. h act [T, H] -> act [T, H]
Tensor Qwen35Model::gdn_block(const LayerWeights& L, Tensor h) {
  const GdnWeights& w = L.gdn;
  const int64_t T = h.dim(0), H = cfg_.hidden_size, C = cfg_.conv_dim();
  const int64_t Hv = cfg_.linear_num_value_heads, dv = cfg_.linear_value_head_dim;
  Tensor mixed_qkv = act({T, C});  // pre-conv; what the conv state keeps
  Tensor z = act({T, Hv * dv});
  Tensor b = act({T, Hv});
  Tensor a = act({T, Hv});
  Tensor qkv = act({T, C});  // silu(causal_conv1d(mixed_qkv)) = [q | k | v]
  const ConvOfFirst conv{w.conv1d, L.cache_index, qkv};
  linear(h, w.in_proj, {mixed_qkv, z, b, a}, &conv);

  GdnShape shape{cfg_.linear_num_key_heads, cfg_.linear_num_value_heads, cfg_.linear_key_head_dim,
                 cfg_.linear_value_head_dim};
  // gates g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), the delta rule, then each
  // v-head's output RMS-normed and gated by z
  Tensor normed = act({T, Hv * dv});
  ops_.gdn_gates_delta_rule_norm(qkv, a, b, w.a_log, w.dt_bias, shape, L.cache_index, z, w.norm, cfg_.rms_norm_eps,
                                 cfg_.output_gate_sigmoid, normed);
  Tensor out = act({T, H});
  ops_.linear_weight(normed, w.out_proj, out);
  return out;
}

// Gated full attention. h act [T, H] -> act [T, H]
Tensor Qwen35Model::attention_block(const LayerWeights& L, Tensor h) {
  const AttnWeights& w = L.attn;
  const int64_t T = h.dim(0), H = cfg_.hidden_size, hd = cfg_.head_dim;
  const int64_t nH = cfg_.num_attention_heads, nKV = cfg_.num_key_value_heads;
  Tensor q_gate = act({T, nH * 2 * hd});
  Tensor key_states = act({T, nKV, hd});
  Tensor value_states = act({T, nKV, hd});
  linear(h, w.qkv_proj, {q_gate, key_states.view({T, nKV * hd}), value_states.view({T, nKV * hd})});

  Tensor query_states = act({T, nH, hd});
  Tensor gate = act({T, nH * hd});
  // split query/gate, q_norm and k_norm per head, RoPE of q and k
  ops_.attention_prep(q_gate, key_states, w.q_norm, w.k_norm, cfg_.rms_norm_eps, cfg_.rotary_dim, cfg_.rope_theta,
                      query_states, gate);

  Tensor attn_output = act({T, nH * hd});
  ops_.attention(query_states, key_states, value_states, L.cache_index, 1.0f / std::sqrt(static_cast<float>(hd)),
                 attn_output);
  Tensor out = act({T, H});
  ops_.gated_linear(attn_output, gate, GateAct::kMulSigmoid, w.o_proj, out);  // o_proj(attn * sigmoid(gate))
  return out;
}

// The residual add of the token mixer's output, the post-attention norm and the SiLU-gated MLP.
// x act [T, H] += mixed act [T, H]; out act [T, H] = the MLP of the normed sum.
void Qwen35Model::mlp_block(const LayerWeights& L, Tensor x, Tensor mixed, Tensor out) {
  const MlpWeights& m = L.mlp;
  if (m.gate_up.groups.size() == 1) {  // one fused weight (kGateUp): the whole half in the op a backend may fuse
    ops_.residual_mlp(x, mixed, L.post_attn_norm, cfg_.rms_norm_eps, m.gate_up.groups[0].w, m.down_proj, out);
    return;
  }
  const int64_t T = x.dim(0), H = cfg_.hidden_size, I = cfg_.intermediate_size;
  Tensor h = act({T, H});
  ops_.add_rms_norm(x, mixed, L.post_attn_norm, cfg_.rms_norm_eps, h);
  Tensor gate = act({T, I});
  Tensor up = act({T, I});
  linear(h, m.gate_up, {gate, up});
  ops_.gated_linear(gate, up, GateAct::kSiluMul, m.down_proj, out);  // down_proj(silu(gate) * up)
}

// Pre-norm residual block on the residual stream x act [T, H]. The block's last residual add is
// left to the next norm (add_rms_norm): pending (act [T, H], or null) is the previous layer's
// MLP output, added to x here with the input norm, and mlp_out receives this layer's, pending in
// turn. The layer's other intermediates are dead afterwards, so their scratch is reused.
void Qwen35Model::decoder_layer(const LayerWeights& L, Tensor x, const Tensor* pending, Tensor mlp_out) {
  const int64_t T = x.dim(0), H = cfg_.hidden_size;
  const size_t mark = ops_.scratch_mark();
  Tensor h = act({T, H});
  if (pending) ops_.add_rms_norm(x, *pending, L.input_norm, cfg_.rms_norm_eps, h);
  else ops_.rms_norm(x, L.input_norm, cfg_.rms_norm_eps, h);
  Tensor mixed = L.type == LayerType::kLinearAttention ? gdn_block(L, h) : attention_block(L, h);
  mlp_block(L, x, mixed, mlp_out);
  ops_.scratch_release(mark);
}

// hn act [T, H] (final-normed) -> act [n_out, V] logits of plan.logit_rows
Tensor Qwen35Model::logits_of(Tensor hn, int64_t n_out) {
  Tensor selected = act({n_out, cfg_.hidden_size});
  ops_.gather_rows(hn, selected);
  Tensor logits = act({n_out, cfg_.vocab_size});
  ops_.linear_weight(selected, w_.lm_head, logits);
  return logits;
}

Tensor Qwen35Model::forward(const StepPlan& plan, Tensor* hidden_out) {
  ops_.begin_step(plan);
  const std::vector<Tensor> out = ops_.run_step([&]() -> std::vector<Tensor> {
    const int64_t T = plan.n_tokens(), H = cfg_.hidden_size;
    Tensor x = act({T, H});  // the residual stream
    ops_.embedding(w_.embed, x);
    Tensor mlp_out[2] = {act({T, H}), act({T, H})};  // a layer's MLP output, added by the next norm
    const Tensor* pending = nullptr;
    for (size_t i = 0; i < w_.layers.size(); ++i) {
      decoder_layer(w_.layers[i], x, pending, mlp_out[i % 2]);
      pending = &mlp_out[i % 2];
    }
    Tensor hn = act({T, H});
    if (pending) ops_.add_rms_norm(x, *pending, w_.final_norm, cfg_.rms_norm_eps, hn);
    else ops_.rms_norm(x, w_.final_norm, cfg_.rms_norm_eps, hn);
    return {logits_of(hn, plan.n_out()), hn};
  });
  if (hidden_out) *hidden_out = out[1];
  return out[0];
}

Tensor Qwen35Model::forward_mtp(const StepPlan& plan, Tensor hidden_prev, Tensor* hidden_out) {
  DS_ASSERT(has_mtp(), "forward_mtp on a checkpoint without mtp.* weights");
  const MtpWeights& m = *w_.mtp;
  ops_.begin_step(plan);
  const int64_t T = plan.n_tokens(), H = cfg_.hidden_size;
  DS_ASSERT(hidden_prev.dim(0) == T, "hidden_prev rows %lld != tokens %lld", (long long)hidden_prev.dim(0), (long long)T);
  Tensor embeds = act({T, H});
  ops_.embedding(w_.embed, embeds);
  Tensor e_normed = act({T, H});
  Tensor h_normed = act({T, H});
  ops_.rms_norm(embeds, m.pre_fc_norm_embedding, cfg_.rms_norm_eps, e_normed);
  ops_.rms_norm(hidden_prev, m.pre_fc_norm_hidden, cfg_.rms_norm_eps, h_normed);
  Tensor fc_in = act({T, 2 * H});  // order: [embedding, hidden]
  ops_.concat_cols(e_normed, h_normed, fc_in);
  Tensor x = act({T, H});
  ops_.linear_weight(fc_in, m.fc, x);
  Tensor mlp_out = act({T, H});
  decoder_layer(m.layer, x, nullptr, mlp_out);
  Tensor mtp_hidden = act({T, H});
  ops_.add_rms_norm(x, mlp_out, m.norm, cfg_.rms_norm_eps, mtp_hidden);
  if (hidden_out) *hidden_out = mtp_hidden;
  return logits_of(mtp_hidden, plan.n_out());
}

}  // namespace ds
