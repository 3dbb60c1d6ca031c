// The qwen3_5 forward, top to bottom (architecture reference §3-§6). Every intermediate has
// the name HF's module uses, so it can be dumped and compared layer by layer.
#include "model/qwen3_5.h"

#include <algorithm>
#include <cmath>

#include "core/log.h"

namespace ds {

size_t step_scratch_bytes(const ModelConfig& c, int64_t tokens, int64_t logit_rows) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, C = c.conv_dim();
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
  const int64_t nH = c.num_attention_heads, nKV = c.num_key_value_heads, hd = c.head_dim;
  // Elements (bf16; f32 as two) a token holds while a layer runs: the residual stream, the two
  // input norms and the post-attention one (forward, decoder_layer); the mixer's intermediates,
  // live until the layer ends; then the larger of the mixer op's own (the GDN's conv output,
  // gates and chunk matrices) and the MLP's (gate, up, the gated product, gate_up's paired rows).
  const int64_t stream = 4 * H;
  const int64_t gdn = C + 2 * Hv * dv + 2 * Hv, gdn_op = C + 4 * Hv + 2 * 64 * Hv + 4 * Hk;
  const int64_t attn = 5 * nH * hd + 2 * nKV * hd;
  const int64_t mlp = 5 * I;
  const int64_t per_token = stream + std::max(gdn + std::max(gdn_op, mlp), attn + mlp);
  // Steps of up to 8 tokens also take fp16 copies and int8 twins of the norms and the mixers'
  // and the MLP's outputs.
  const int64_t small = std::min<int64_t>(tokens, 8) * (5 * H + I + std::max(Hv * dv, nH * hd));
  // A row's logits (bf16), up to two f32 rows of the sampler's, and its gathered hidden.
  const int64_t per_row = int64_t(c.vocab_size) * (1 + 2 + 2) + H;
  // A GEMV's split-K partial sums: f32 [splits, tokens, N] in slices of at most 128 tokens, as
  // much as 4 splits of gate_up's 2I rows, and at least the wide kernels' stream-K partials: 256
  // rows of a slice's tokens for each block, one block an SM (up to 256 SMs), the int8 lm_head's
  // included (the W4A16 splits' rounding takes a slice's N more: under 2 at the 27B's).
  const int64_t slice = std::min<int64_t>(tokens, 128);
  const int64_t partials = 2 * std::max(4 * slice * 2 * I, 256 * 256 * ((slice + 7) / 8 * 8));
  // What backends hand out by the block from what is free (a weight dequantised in blocks of
  // rows takes a quarter of it, 128 rows at least), and 16 MiB for the small rest.
  const int64_t widest_k = std::max({H, I, Hv * dv, nH * hd});
  const int64_t blocks = 4 * 128 * widest_k * 2 + (int64_t(16) << 20);
  return size_t(2 * (tokens * per_token + small + logit_rows * per_row + partials) + blocks);
}

Result<std::unique_ptr<Qwen35Model>> Qwen35Model::load(const Checkpoint& ck, Ops& ops, ActInt8Layers a8) {
  DS_ASSIGN_OR_RETURN(ModelWeights w, load_weights(ck, ops, a8));
  const ModelConfig& c = ck.config();
  DS_LOG_INFO("model", "%s: %d layers (%d GDN, %d attention), hidden %d, vocab %d, MTP %s", ck.dir().c_str(),
              c.num_hidden_layers, c.n_linear_attention_layers(), c.n_full_attention_layers(), c.hidden_size,
              c.vocab_size, w.mtp ? "yes" : "no");
  return std::unique_ptr<Qwen35Model>(new Qwen35Model(c, std::move(w), ops));
}

Result<std::unique_ptr<Qwen35Model>> Qwen35Model::synthetic(const ModelConfig& config, Ops& ops, bool with_mtp,
                                                             bool w4a16, uint64_t seed, ActInt8Layers a8) {
  DS_ASSIGN_OR_RETURN(ModelWeights w, synthetic_weights(config, ops, with_mtp, w4a16, seed, a8));
  return std::unique_ptr<Qwen35Model>(new Qwen35Model(config, std::move(w), ops));
}

namespace {

// Whether a fused linear reads int8 inputs (any of its weights: LinearWeight::act_int8).
bool reads_int8(const FusedLinear& f) {
  for (const FusedLinear::Group& g : f.groups)
    if (g.w.act_int8) return true;
  return false;
}
// The linears that read a layer's input norm.
const FusedLinear& mixer_in(const LayerWeights& L) {
  return L.type == LayerType::kLinearAttention ? L.gdn.in_proj : L.attn.qkv_proj;
}

}  // namespace

Int8Twin Qwen35Model::int8_twin(int64_t T, bool wanted) {
  const int64_t H = cfg_.hidden_size;
  if (!wanted || !ops_.makes_int8_twin(T, H)) return {};
  return {ops_.scratch(DType::kI8, {T, H}), ops_.scratch(DType::kF32, {T, H / 64})};
}

Tensor Qwen35Model::half_copy(int64_t T, int64_t D) {
  return ops_.makes_half_copy(T, D) ? ops_.scratch(DType::kF16, {T, D}) : Tensor{};
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

void Qwen35Model::linear(const NormedAct& in, const FusedLinear& w, std::initializer_list<Tensor> outs) {
  size_t n_grouped = 0;
  for (const FusedLinear::Group& g : w.groups) n_grouped += g.n_parts;
  DS_ASSERT(outs.size() == w.rows.size() && n_grouped == w.rows.size(),
            "%zu outputs for a fused linear of %zu parts, %zu of them in groups", outs.size(), w.rows.size(), n_grouped);
  const Tensor* part = outs.begin();
  for (const FusedLinear::Group& g : w.groups) {
    const std::span<const Tensor> parts(part, g.n_parts);
    ops_.linear_parts(in.h, g.w, parts, part != outs.begin(), in.scale);
    part += g.n_parts;
  }
}

// Gated DeltaNet token mixer on in (act [T, H]); its out_proj is added to x.
void Qwen35Model::gdn_block(const LayerWeights& L, const NormedAct& in, Tensor x, const NextNorm& next,
                            NormedAct& out) {
  const GdnWeights& w = L.gdn;
  const int64_t T = x.dim(0), C = cfg_.conv_dim();
  const int64_t Hv = cfg_.linear_num_value_heads, dv = cfg_.linear_value_head_dim;
  Tensor mixed_qkv = act({T, C});  // pre-conv; what the conv state keeps
  Tensor z = act({T, Hv * dv});
  Tensor b = act({T, Hv});
  Tensor a = act({T, Hv});
  linear(in, w.in_proj, {mixed_qkv, z, b, a});

  GdnShape shape{cfg_.linear_num_key_heads, cfg_.linear_num_value_heads, cfg_.linear_key_head_dim,
                 cfg_.linear_value_head_dim};
  // [q | k | v] = silu(causal_conv1d(mixed_qkv)); gates g = -exp(A_log) softplus(a + dt_bias),
  // beta = sigmoid(b), the delta rule, then each v-head's output RMS-normed and gated by z
  Tensor normed = act({T, Hv * dv});
  Tensor normed_half = half_copy(T, Hv * dv);  // its fp16 copy where the backend makes one, for out_proj
  ops_.conv_gdn_norm(mixed_qkv, w.conv1d, a, b, w.a_log, w.dt_bias, shape, L.cache_index, z, w.norm,
                     cfg_.rms_norm_eps, cfg_.output_gate_sigmoid, normed, &normed_half);
  ops_.linear_add_rms_norm(normed, nullptr, GateAct::kSiluMul, w.out_proj, x, next.w, cfg_.rms_norm_eps, next.ss, out,
                           next.twin, next.half, normed_half);
}

// Gated full attention on in (act [T, H]); its o_proj is added to x.
void Qwen35Model::attention_block(const LayerWeights& L, const NormedAct& in, Tensor x, const NextNorm& next,
                                  NormedAct& out) {
  const AttnWeights& w = L.attn;
  const int64_t T = x.dim(0), hd = cfg_.head_dim;
  const int64_t nH = cfg_.num_attention_heads, nKV = cfg_.num_key_value_heads;
  Tensor q_gate = act({T, nH * 2 * hd});
  Tensor key_states = act({T, nKV, hd});
  Tensor value_states = act({T, nKV, hd});
  linear(in, w.qkv_proj, {q_gate, key_states.view({T, nKV * hd}), value_states.view({T, nKV * hd})});

  Tensor query_states = act({T, nH, hd});
  Tensor gate = act({T, nH * hd});
  // split query/gate, q_norm and k_norm per head, RoPE of q and k
  ops_.attention_prep(q_gate, key_states, w.q_norm, w.k_norm, cfg_.rms_norm_eps, cfg_.rotary_dim, cfg_.rope_theta,
                      query_states, gate);

  // o_proj(attn * sigmoid(gate)), the gate applied by the attention op, which may also make the
  // gated output's fp16 copy for o_proj
  Tensor attn_output = act({T, nH * hd});
  Tensor attn_half = half_copy(T, nH * hd);
  ops_.gated_attention(query_states, key_states, value_states, L.cache_index,
                       1.0f / std::sqrt(static_cast<float>(hd)), gate, attn_output, &attn_half);
  ops_.linear_add_rms_norm(attn_output, nullptr, GateAct::kMulSigmoid, w.o_proj, x, next.w, cfg_.rms_norm_eps, next.ss,
                           out, next.twin, next.half, attn_half);
}

// The SiLU-gated MLP on in (the post-attention norm, act [T, H]); its down_proj is added to x.
void Qwen35Model::mlp_block(const LayerWeights& L, const NormedAct& in, Tensor x, const NextNorm& next,
                            NormedAct& out) {
  const MlpWeights& m = L.mlp;
  const int64_t T = x.dim(0), I = cfg_.intermediate_size;
  Tensor gate = act({T, I});
  Tensor up = act({T, I});
  if (m.gate_up.groups.size() == 1) {  // one fused weight (kGateUp): silu(gate) * up where its GEMV makes it
    Tensor gated = act({T, I});
    Tensor gated_half = half_copy(T, I);  // its fp16 copy where the backend makes one, for down_proj
    ops_.linear_swiglu(in.h, m.gate_up.groups[0].w, gate, up, gated, in.scale, &gated_half);
    ops_.linear_add_rms_norm(gated, nullptr, GateAct::kSiluMul, m.down_proj, x, next.w, cfg_.rms_norm_eps, next.ss,
                             out, next.twin, next.half, gated_half);
    return;
  }
  linear(in, m.gate_up, {gate, up});
  // down_proj(silu(gate) * up)
  ops_.linear_add_rms_norm(gate, &up, GateAct::kSiluMul, m.down_proj, x, next.w, cfg_.rms_norm_eps, next.ss, out,
                           next.twin, next.half);
}

// Pre-norm residual block: in is the layer's input norm of the residual stream x act [T, H]; the
// mixer and the MLP each add their output to x, and each block's last linear makes the norm
// after it (the post-attention norm, then next: the next layer's input norm or the final norm)
// into out. The layer's other intermediates are dead afterwards, so their scratch is reused.
void Qwen35Model::decoder_layer(const LayerWeights& L, const NormedAct& in, Tensor x, const NextNorm& next,
                                NormedAct& out) {
  const int64_t T = x.dim(0), H = cfg_.hidden_size;
  const size_t mark = ops_.scratch_mark();
  NormedAct mid{act({T, H}), {}};  // the post-attention norm
  const NextNorm post{L.post_attn_norm, ops_.scratch(DType::kF32, {ops_.norm_parts(H), T}),
                      int8_twin(T, reads_int8(L.mlp.gate_up)), half_copy(T, H)};
  if (L.type == LayerType::kLinearAttention) gdn_block(L, in, x, post, mid);
  else attention_block(L, in, x, post, mid);
  mlp_block(L, mid, x, next, out);
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
    const int64_t T = plan.n_tokens(), H = cfg_.hidden_size, P = ops_.norm_parts(H);
    Tensor x = act({T, H});  // the residual stream
    ops_.embedding(w_.embed, x);
    // Each layer's input norm, alternating between two buffers: made by the layer before, read by this one.
    NormedAct normed[2] = {{act({T, H}), {}}, {act({T, H}), {}}};
    Tensor sums[2] = {ops_.scratch(DType::kF32, {P, T}), ops_.scratch(DType::kF32, {P, T})};
    bool mixers_int8 = false;
    for (const LayerWeights& L : w_.layers) mixers_int8 = mixers_int8 || reads_int8(mixer_in(L));
    const Int8Twin twins[2] = {int8_twin(T, mixers_int8), int8_twin(T, mixers_int8)};
    // The fp16 copies of the layers' input norms where the backend makes them (half_copy), which the
    // mixers' first linears read (CUDA's W4A16 GEMV stages them as they are), alternating as normed.
    const Tensor halves[2] = {half_copy(T, H), half_copy(T, H)};
    const size_t n = w_.layers.size();
    ops_.rms_norm(x, n > 0 ? w_.layers[0].input_norm : w_.final_norm, cfg_.rms_norm_eps, normed[0].h);
    for (size_t i = 0; i < n; ++i) {
      const bool last = i + 1 == n;
      const bool twin = !last && reads_int8(mixer_in(w_.layers[i + 1]));
      const NextNorm next{last ? w_.final_norm : w_.layers[i + 1].input_norm, last ? Tensor{} : sums[(i + 1) % 2],
                          twin ? twins[(i + 1) % 2] : Int8Twin{}, last ? Tensor{} : halves[(i + 1) % 2]};
      decoder_layer(w_.layers[i], normed[i % 2], x, next, normed[(i + 1) % 2]);
    }
    Tensor hn = normed[n % 2].h;  // the final norm: never left to the linears (NextNorm)
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
  NormedAct in{act({T, H}), {}};
  ops_.rms_norm(x, m.layer.input_norm, cfg_.rms_norm_eps, in.h);
  NormedAct out{act({T, H}), {}};  // the MTP's final norm: its output hidden
  decoder_layer(m.layer, in, x, NextNorm{m.norm, Tensor{}, Int8Twin{}, Tensor{}}, out);
  Tensor mtp_hidden = out.h;
  if (hidden_out) *hidden_out = mtp_hidden;
  return logits_of(mtp_hidden, plan.n_out());
}

}  // namespace ds
