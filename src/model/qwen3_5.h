// Qwen35Model: the qwen3_5 text model (and its MTP head) written once against the Ops
// contract. Owns no memory: weights are backend tensors, caches live in the backend pools,
// and every step is described by a StepPlan.
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "ops/ops.h"

namespace ds {

// Linears that share an input, stored fused where their storage agrees (Ops::linear_parts):
// part i has rows[i] output rows; groups[g] holds n_parts consecutive parts in one weight.
struct FusedLinear {
  struct Group {
    LinearWeight w;
    int n_parts = 0;
  };
  std::vector<Group> groups;
  std::vector<int64_t> rows;  // per part, in order
};

// How one part of a FusedLinear is stored at load: dense (group_size 0), W4A16 packed with
// group_size (4 bits, no g_idx), or int8 rows (int8_rows, group_size 128: published as int8
// groups of 128, Ops::upload_int8_rows); and whether it reads int8 inputs (LinearWeight::act_int8).
// Only parts of equal storage can share one weight.
struct PartStorage {
  int group_size = 0;
  bool act_int8 = false;
  bool int8_rows = false;
  bool operator==(const PartStorage&) const = default;
};

// W4A8 (DESIGN.md §4): the layer classes whose linears published as W4A16 read int8 inputs
// (LinearWeight::act_int8). The MTP head's attention and MLP follow their classes, its fc not;
// linears published as int8 rows (the seed's MTP head) read their inputs as they are.
struct ActInt8Layers {
  bool mlp = false, linear_attn = false, self_attn = false;
  bool operator==(const ActInt8Layers&) const = default;
};
// "none", "all", or a comma-separated list of mlp, linear_attn and self_attn.
Result<ActInt8Layers> parse_act_int8_layers(const std::string& s);

// The n_parts of each group: consecutive parts of equal storage form one group, a part that
// differs from the one before starts the next. With fuse false every part is a group of its own.
std::vector<int> group_parts(const std::vector<PartStorage>& parts, bool fuse);

// env: DS_FUSE_LINEARS=0 loads every linear as a weight of its own (default 1: fused), so the
// two can be measured side by side. Read by load_weights and synthetic_weights.
bool fuse_linears_from_env();

struct GdnWeights {
  FusedLinear in_proj;  // parts: qkv [conv_dim], z [Hv*dv], b [Hv], a [Hv]
  Tensor conv1d;       // f32 [conv_dim, K]
  Tensor a_log;        // f32 [Hv]
  Tensor dt_bias;      // f32 [Hv]
  Tensor norm;         // f32 [dv], plain multiplier
  LinearWeight out_proj;     // [H, Hv*dv]
};

struct AttnWeights {
  FusedLinear qkv_proj;  // parts: q [nH*2*hd], k [nKV*hd], v [nKV*hd]; q per head [query | gate]
  LinearWeight o_proj;  // [H, nH*hd]
  Tensor q_norm;  // f32 [hd], 1 already added
  Tensor k_norm;  // f32 [hd], 1 already added
};

struct MlpWeights {
  FusedLinear gate_up;     // parts: gate [I], up [I]
  LinearWeight down_proj;  // [H, I]
};

struct LayerWeights {
  LayerType type = LayerType::kLinearAttention;
  int cache_index = 0;    // GDN state layer, or KV layer, of this decoder layer
  Tensor input_norm;      // f32 [H], 1 already added
  Tensor post_attn_norm;  // f32 [H], 1 already added
  GdnWeights gdn;         // linear-attention layers only
  AttnWeights attn;       // full-attention layers only
  MlpWeights mlp;
};

struct MtpWeights {
  LinearWeight fc;               // [H, 2H], input = concat(embedding part, hidden part)
  Tensor pre_fc_norm_embedding;  // f32 [H], 1 already added
  Tensor pre_fc_norm_hidden;     // f32 [H], 1 already added
  Tensor norm;                   // f32 [H], 1 already added
  LayerWeights layer;            // one full-attention decoder layer
};

struct ModelWeights {
  LinearWeight embed;    // [V, H], dense or int8 (Ops::prepare_weight)
  Tensor final_norm;  // f32 [H], 1 already added
  LinearWeight lm_head;  // [V, H] (the embedding table when tied)
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;
};

// Reads and checks every tensor the config implies; uploads through `ops`.
Result<ModelWeights> load_weights(const Checkpoint& ck, Ops& ops, ActInt8Layers a8 = {});
// Random weights of the config's exact shapes, drawn on the backend (benchmarks); w4a16 makes
// every linear but the lm_head and in_proj_a/b W4A16 with group 128, as published checkpoints do.
Result<ModelWeights> synthetic_weights(const ModelConfig& config, Ops& ops, bool with_mtp, bool w4a16, uint64_t seed,
                                       ActInt8Layers a8 = {});

// A bound on the step scratch (Ops::scratch) one forward of `tokens` tokens with `logit_rows`
// logit rows takes, sampling included: what every token's activations hold at the widest point
// of a layer (the residual stream, two input norms and their copies, the mixer's intermediates,
// still live while the MLP's run), counted in bf16 with f32 ones as two, plus the logits, the
// sampler's f32 rows, a GEMV's split-K partial sums, and room for what backends hand out by the
// block from what is free. A backend whose arena is fixed at start (CUDA) is sized with this for
// its largest step; bench model sizes its own so, and stops where a step finds it too small.
size_t step_scratch_bytes(const ModelConfig& c, int64_t tokens, int64_t logit_rows);

class Qwen35Model {
 public:
  static Result<std::unique_ptr<Qwen35Model>> load(const Checkpoint& ck, Ops& ops, ActInt8Layers a8 = {});
  static Result<std::unique_ptr<Qwen35Model>> synthetic(const ModelConfig& config, Ops& ops, bool with_mtp,
                                                        bool w4a16, uint64_t seed, ActInt8Layers a8 = {});

  const ModelConfig& config() const { return cfg_; }
  bool has_mtp() const { return w_.mtp.has_value(); }
  int mtp_kv_layer() const { return cfg_.n_full_attention_layers(); }
  // Pool sizes for n_blocks KV blocks of block_size tokens and n_slots GDN state slots.
  CacheGeometry cache_geometry(int n_blocks, int block_size, int n_slots) const;

  // One step of the main model. Returns act [plan.n_out(), V] logits of plan.logit_rows;
  // hidden_out (optional) gets act [T, H], the final-normed hidden of every row (MTP input).
  // Results are backend scratch: valid until ops.reset_scratch().
  Tensor forward(const StepPlan& plan, Tensor* hidden_out = nullptr);

  // One MTP step: row t takes token plan.token_ids[t] and hidden_prev[t] (act [T, H], the
  // main model's final-normed hidden of the previous position, or the previous MTP output),
  // attends over the MTP layer's cache. Returns act [n_out, V] draft logits; hidden_out gets
  // the MTP output hidden act [T, H] for chaining.
  Tensor forward_mtp(const StepPlan& plan, Tensor hidden_prev, Tensor* hidden_out = nullptr);

 private:
  Qwen35Model(const ModelConfig& cfg, ModelWeights w, Ops& ops) : cfg_(cfg), w_(std::move(w)), ops_(ops) {}
  // The norm after a block's last linear (Ops::linear_add_rms_norm): its weight, and the sums a
  // backend may leave for the linears after it (f32 [norm_parts(H), T]; empty: the final norm,
  // whose output is read by more than linears).
  struct NextNorm {
    Tensor w;
    Tensor ss;
    Int8Twin twin;  // buffers for the norm's int8 twin (int8_twin), or empty
    Tensor half;    // a buffer for its fp16 copy (half_copy), or empty
  };
  // Each block reads the normed input `in`, adds its output to the residual stream x act [T, H]
  // and writes `out` = the next norm of x (out.h act [T, H] given).
  void gdn_block(const LayerWeights& L, const NormedAct& in, Tensor x, const NextNorm& next, NormedAct& out);
  void attention_block(const LayerWeights& L, const NormedAct& in, Tensor x, const NextNorm& next, NormedAct& out);
  void mlp_block(const LayerWeights& L, const NormedAct& in, Tensor x, const NextNorm& next, NormedAct& out);
  void decoder_layer(const LayerWeights& L, const NormedAct& in, Tensor x, const NextNorm& next, NormedAct& out);
  Tensor logits_of(Tensor hn, int64_t n_out);
  Tensor act(std::initializer_list<int64_t> shape) { return ops_.scratch(ops_.act_dtype(), shape); }
  // Scratch for the int8 twin of a pre-norm of T rows (Ops::linear_add_rms_norm) where `wanted`
  // (the linears after it read int8 inputs) and the backend makes twins; else empty.
  Int8Twin int8_twin(int64_t T, bool wanted);
  // Scratch f16 [T, D] for the fp16 copy of a pre-norm (RowScale::half), of the MLP's gated
  // product (linear_swiglu) or of the GDN's normed output (conv_gdn_norm) where the backend makes
  // them; else empty.
  Tensor half_copy(int64_t T, int64_t D);
  // outs[i] act [T, rows[i]] = in act [T, K] . (part i of w)^T; one Ops::linear_parts per group.
  void linear(const NormedAct& in, const FusedLinear& w, std::initializer_list<Tensor> outs);

  ModelConfig cfg_;
  ModelWeights w_;
  Ops& ops_;
};

}  // namespace ds
