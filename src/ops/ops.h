// Ops: the backend-neutral list of operations the model forward is written against.
// A backend owns all device memory (weights, cache pools, step scratch) and the current
// StepPlan; the model passes tensor views and layer indices. Shapes are outermost first;
// "act" is the backend's activation dtype (F32 on the CPU reference, BF16 on CUDA).
#pragma once

#include <functional>
#include <initializer_list>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "ops/sampling.h"
#include "ops/step_plan.h"

namespace ds {

// Head layout of one Gated DeltaNet layer.
struct GdnShape {
  int n_k_heads = 0, n_v_heads = 0, k_head_dim = 0, v_head_dim = 0;
};

// A weight matrix [N, K] of a linear layer (also the embedding table [V, H]): dense when
// group_size == 0, else quantized in `format`:
//  kW4A16      as published by compressed-tensors: `packed` i32 [N, K/8] (nibble j of word c is
//              input column 8c+j, stored as q + 8), `scales` f32 [N, K/group_size], signed;
//              W[n, k] = q * scales[n, k / group_size].
//  kW4A16Tiled the same values repacked at load for the CUDA GEMV (CudaOps::prepare_weight;
//              backend/cuda/w4a16.cu documents the layout): `packed` holds the codes and the
//              scales, `scales` is empty; `rows` = N.
//  kInt8Tiled  int8 group-128 rows, symmetric: scale = max|w| / 127, q = round(w / scale)
//              (ops/int8_rows.h), quantised at load for the CUDA GEMV in its tile layout
//              (CudaOps::prepare_weight; backend/cuda/qgemv_kernel.cuh documents it): `packed` i8
//              and `scales` f32 of whole 16-row blocks, group_size 128, `rows` = N.
enum class WeightFormat : uint8_t { kW4A16, kW4A16Tiled, kInt8Tiled };

struct LinearWeight {
  Tensor dense;  // act [N, K]
  Tensor packed;
  Tensor scales;
  int group_size = 0;  // > 0: quantized
  WeightFormat format = WeightFormat::kW4A16;
  int64_t rows = 0;  // N of the tiled forms (their tensors are padded to 16-row blocks)
  // kW4A16Tiled of a kGateUp weight [2I, K] (I % 8 == 0): 16-row block b holds rows [8b, 8b + 8)
  // of the first half, then the same rows of the second, so a GEMV lane holds the gate and up
  // values of one output (CudaOps::linear_swiglu).
  bool paired = false;
  // W4A8: the linear's inputs are rounded to int8, each token's 64-column chunk with its own scale
  // (ops/act_int8.h), for int8 tensor cores. The CUDA W4A16 GEMV does so where it can
  // (cuda::w4a16_gemv_takes_a8: decode-sized steps); the CPU backend rounds every input alike.
  bool act_int8 = false;
  bool quantized() const { return group_size > 0; }
};

// The gate of Ops::gated_linear's input.
enum class GateAct : uint8_t { kSiluMul, kMulSigmoid };

// A pre-norm's output as the linears after it read it (Ops::linear_add_rms_norm). Where the
// backend leaves the division by each row's RMS to those linears, h holds the row times the norm
// weight (rounded to act) and scale the sums of squares to divide by: the linears multiply their
// output row t by 1 / sqrt(sum_p ss[p, t] / D + eps), D = h's width, the sum in order p = 0, 1, ..
// Otherwise scale is empty and h = rms_norm(x) * w.
// W4A8: a backend's int8 copy of a pre-norm's output h, made by the op that writes h, so the linears
// after it that read int8 inputs (LinearWeight::act_int8) take it instead of rounding h each: q i8
// [T, D] in the backend's column order, scale f32 [T, D / 64] (ops/act_int8.h's rounding of each
// token's 64-column chunks; CUDA: launchers.h GemvNorm).
struct Int8Twin {
  Tensor q, scale;
  bool empty() const { return q.data == nullptr; }
};
struct RowScale {
  Tensor ss;  // f32 [P, T]: the sums of x^2 over P parts of each row
  float eps = 0.f;
  Int8Twin twin;  // empty where none was made
  // f16 [T, D]: a backend's fp16 copy of h / 16 for the linears after it that take fp16 inputs
  // (CUDA's W4A16 GEMV, launchers.h w4a16_gemv_f16), made by the op that writes h; empty where
  // none was made.
  Tensor half;
  bool empty() const { return ss.data == nullptr; }
};
struct NormedAct {
  Tensor h;  // act [T, D]
  RowScale scale;
};

// What a weight is used for, so a backend can choose its storage (Ops::prepare_weight).
// kGateUp: the MLP's fused gate_up [2I, K], rows gate then up, used through linear_swiglu.
enum class WeightRole : uint8_t { kLinear, kEmbedding, kLmHead, kGateUp };
// A vocabulary table (embedding or lm_head): the weights a backend may store as int8 rows.
inline bool is_vocab_role(WeightRole role) { return role == WeightRole::kEmbedding || role == WeightRole::kLmHead; }

class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;
  virtual DType act_dtype() const = 0;

  // --- memory ---
  // A persistent copy of host data (any float dtype), stored as `want`; integer data (I32)
  // is copied as it is (want == host_dtype).
  virtual Tensor upload(const void* host, DType host_dtype, std::initializer_list<int64_t> shape, DType want) = 0;
  // Persistent memory, contents undefined (filled by fill_random or by ops).
  virtual Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) = 0;
  // Uniform values in [mean - half_range, mean + half_range], a pure function of seed and index
  // (synthetic weights). t is F32 or act; for I32, random bit patterns (mean/range unused).
  virtual void fill_random(Tensor t, float mean, float half_range, uint64_t seed) = 0;
  // Step-lifetime memory, released by reset_scratch().
  virtual Tensor scratch(DType dtype, std::initializer_list<int64_t> shape) = 0;
  virtual void reset_scratch() = 0;
  // Scratch taken after scratch_mark() is returned by scratch_release(mark) (per-layer reuse;
  // on a GPU the queued kernels still run before the memory is handed out again).
  virtual size_t scratch_mark() const = 0;
  virtual void scratch_release(size_t mark) = 0;
  // Waits for all queued work (benchmarks time whole steps with a host clock).
  virtual void synchronize() = 0;
  // Copies a float tensor to host fp32 (synchronises).
  virtual void download_f32(Tensor src, float* host) = 0;
  // Allocates the KV and GDN state pools once (contents start as zeros).
  virtual void alloc_caches(const CacheGeometry& geometry) = 0;
  // Bytes alloc_caches(geometry) takes on this backend (linear in n_blocks and n_slots).
  virtual size_t cache_bytes_for(const CacheGeometry& geometry) const = 0;
  // Bytes held now: weights, the scratch arena and caches allocated so far.
  virtual size_t bytes_in_use() const = 0;
  // Bytes the device has in use now by everything: on a GPU the whole device's total - free,
  // so the runtime's context and library workspaces count too. Default: bytes_in_use().
  virtual size_t device_bytes_used() const { return bytes_in_use(); }
  // Headroom a memory budget keeps beyond weights, scratch and caches for what the backend
  // allocates while serving (step graphs, sampler buffers, library growth).
  virtual size_t runtime_reserve_bytes() const { return 0; }

  // --- step ---
  // Makes `plan` the current step; the ops below read its token ids, positions, sequence
  // ranges, block tables and state slots.
  virtual void begin_step(const StepPlan& plan) = 0;
  // Runs the current step's ops, issued by `record`, and returns its result tensors. A backend
  // may record them once and replay the recording for later steps of the same shape (CUDA
  // graphs for decode steps): `record` must then issue the same ops on the same scratch
  // layout every time, reading step data only through the plan. Default: runs `record`.
  virtual std::vector<Tensor> run_step(const std::function<std::vector<Tensor>()>& record) { return record(); }

  // Called by the weight loader once per weight whose values are final; the backend may convert
  // it into its own storage. CUDA: kW4A16 -> kW4A16Tiled; a dense embedding table or lm_head ->
  // kInt8Tiled (CudaOpsOptions::int8_vocab). CPU: with int8 vocab tables on, the same quantisation
  // applied in place to the fp32 values (the twin of the CUDA kernels).
  virtual void prepare_weight(LinearWeight& w, WeightRole role) {}
  // Whether weights [N, K] published as int8 rows (upload_int8_rows) can be stored as such: CUDA
  // kInt8Tiled; CPU, the twin, their values q * scale in fp32.
  virtual bool keeps_int8_rows(int64_t K) const { return false; }
  // Whether vocabulary tables [V, H] are stored as int8 rows (prepare_weight quantises bf16 ones;
  // those published as int8 rows keep their codes): an option of the backend's, where
  // keeps_int8_rows(H).
  virtual bool keeps_int8_vocab(int64_t H) const { return false; }
  // A weight published as int8 groups of 128 columns, symmetric (w[r, k] = q[r, k] * scales[r, k /
  // 128]; q i8 [N, K], scales f32 [N, K / 128] on the host), stored as the int8 rows prepare_weight
  // makes of a vocabulary table, with these codes and scales as they are. Only where
  // keeps_int8_rows(K). Read by linear_weight, linear_parts and linear_swiglu, and by embedding.
  virtual LinearWeight upload_int8_rows(const int8_t* q, const float* scales, int64_t N, int64_t K) {
    DS_FATAL("%s keeps no int8 rows", name());
  }

  // out act [T, H] = table[plan.token_ids]; table [V, H] dense or kInt8Tiled (dequantised on gather)
  virtual void embedding(const LinearWeight& table, Tensor out) = 0;
  // out act [R, D] = x / rms(x) * w; x act [R, D]; w f32 [D] (zero-centred norms pre-add 1 at load)
  virtual void rms_norm(Tensor x, Tensor w, float eps, Tensor out) = 0;
  // out act [T, N] = x act [T, K] . w [N, K]^T
  virtual void linear(Tensor x, Tensor w, Tensor out) = 0;
  // Whether W4A16 weights can be kept quantized; otherwise W4A16 checkpoints are dequantised at load.
  virtual bool supports_w4a16() const { return false; }
  // out act [T, N] = x act [T, K] . W^T for a quantized LinearWeight in a format this backend's
  // prepare_weight produced.
  virtual void linear_quantized(Tensor x, const LinearWeight& w, Tensor out) {
    DS_FATAL("%s has no quantized linear", name());
  }
  // The input a dense weight with act_int8 reads: x rounded to int8 as ops/act_int8.h does (CPU),
  // or x itself on a backend that rounds only inside its quantized GEMVs (CUDA).
  virtual Tensor act_int8_input(Tensor x) { return x; }
  // out act [T, N] = x act [T, K] . W^T for a LinearWeight in whichever form prepare_weight left
  // it: linear for a dense one (its input through act_int8_input with act_int8), linear_quantized
  // otherwise.
  void linear_weight(Tensor x, const LinearWeight& w, Tensor out) {
    if (w.quantized()) linear_quantized(x, w, out);
    else linear(w.act_int8 ? act_int8_input(x) : x, w.dense, out);
  }
  // outs[i] act [T, N_i] = x act [T, K] . W[r_i, r_i + N_i)^T, where w [sum N_i, K] holds the rows
  // of several linears that share the input x, in order (fused at load, model/qwen3_5.h
  // FusedLinear). Dense or quantized like linear/linear_quantized. The default runs one linear per
  // part on row views of a dense or raw W4A16 (packed [N, K/8], scales [N, K/group]) weight; a
  // backend whose quantized form cannot be cut into rows (CUDA tiles) overrides it.
  // after_same_input: the op just before this one read the same x (an earlier group of one fused
  // linear), so x was complete before that op began and a backend may start this one before that
  // op ends. Results are the same either way.
  // scale: x is a NormedAct's h whose rows are still to be divided by their RMS (RowScale); the
  // default scales the outputs with scale_rows.
  virtual void linear_parts(Tensor x, const LinearWeight& w, std::span<const Tensor> outs,
                            bool after_same_input = false, const RowScale& scale = {});
  // out act [T, N] = act(a, b) . W^T, act(a, b) = silu(a) * b (kSiluMul: the MLP's down_proj) or
  // a * sigmoid(b) (kMulSigmoid); a, b act [T, K]. The default runs silu_mul or sigmoid_mul, then
  // linear_weight; a may be overwritten. (CUDA gates a SiLU-gated input while its GEMV stages it
  // in shared memory, where it can: once per block, not per warp.)
  virtual void gated_linear(Tensor a, Tensor b, GateAct act, const LinearWeight& w, Tensor out);
  // out act [T, I] = silu(gate) * up, where gate and up act [T, I] are the two halves of x act
  // [T, K] . W^T for w [2I, K] (rows gate then up: the MLP's fused gate_up, WeightRole::kGateUp),
  // each rounded to act first (scale: as linear_parts'). The default runs linear_parts into gate
  // and up, then silu_mul; a backend may never write them (CUDA's GEMV computes the product in
  // its epilogue). half (optional): a buffer f16 [T, I] (where makes_half_copy(T, I)) the backend
  // fills with out's fp16 copy / 16 for the linear that reads out (linear_add_rms_norm's a_half),
  // or empties where it makes none (the default).
  virtual void linear_swiglu(Tensor x, const LinearWeight& w, Tensor gate, Tensor up, Tensor out,
                             const RowScale& scale = {}, Tensor* half = nullptr);
  // out act [T, N] *= 1 / sqrt(sum_p s.ss[p, t] / D + s.eps) for each row t (RowScale).
  virtual void scale_rows(Tensor out, const RowScale& s, int64_t D) = 0;
  // x act [R, D] += y act [R, D]
  virtual void add(Tensor x, Tensor y) = 0;
  // x += y, then out = rms_norm(x) (of the sum as stored in act): the residual add and the next
  // pre-norm in one pass where a backend fuses them. x, y, out act [R, D]; w f32 [D]
  virtual void add_rms_norm(Tensor x, Tensor y, Tensor w, float eps, Tensor out) {
    add(x, y);
    rms_norm(x, w, eps, out);
  }
  // The P of a RowScale's sums over rows of width D (linear_add_rms_norm's ss); 1 where the
  // backend never leaves the division to the linears.
  virtual int64_t norm_parts(int64_t D) const { return 1; }
  // The last linear of a block, the residual add and the next pre-norm: y = a . W^T (b null) or
  // act(a, b) . W^T (gated_linear; a may be overwritten), x += y, out = rms_norm(x) * norm_w
  // (add_rms_norm). x act [T, D]; out.h act [T, D]; ss f32 [norm_parts(D), T], or empty where out
  // is read by more than linears. A backend may leave the division by the RMS to the linears that
  // read out (out.scale = {ss, eps}; CUDA at decode, where the GEMV's epilogue writes the sums:
  // CudaOps); the default runs the three ops and leaves out.scale empty. twin: buffers (where
  // makes_int8_twin) the backend fills with out.h's int8 twin when it defers the norm
  // (out.scale.twin then names them); half: likewise f16 [T, D] (where makes_half_copy) for out.h's
  // fp16 copy / 16 (out.scale.half). a_half (b null): a's fp16 copy / 16 made by its producer
  // (linear_swiglu's half), which the backend may read instead of a, or empty.
  virtual void linear_add_rms_norm(Tensor a, const Tensor* b, GateAct act, const LinearWeight& w, Tensor x,
                                   Tensor norm_w, float eps, Tensor ss, NormedAct& out, Int8Twin twin = {},
                                   Tensor half = {}, Tensor a_half = {});
  // Whether linear_add_rms_norm of T rows of width D can make an int8 twin (Int8Twin).
  virtual bool makes_int8_twin(int64_t T, int64_t D) const { return false; }
  // Whether linear_add_rms_norm (RowScale::half), linear_swiglu or gdn_gates_delta_rule_norm of T
  // rows of width D can make an fp16 copy.
  virtual bool makes_half_copy(int64_t T, int64_t D) const { return false; }
  // out act [T, I] = silu(gate) * up; gate, up act [T, I]
  virtual void silu_mul(Tensor gate, Tensor up, Tensor out) = 0;
  // out act [n_out, H] = x[plan.logit_rows]; x act [T, H]
  virtual void gather_rows(Tensor x, Tensor out) = 0;

  // --- Gated DeltaNet ---
  // Causal depthwise conv over each sequence continuing from its conv state, then SiLU; the
  // state keeps the last K-1 pre-conv rows. mixed act [T, C]; w f32 [C, K]; out act [T, C].
  virtual void conv1d_silu(Tensor mixed, Tensor w, int state_layer, Tensor out) = 0;
  // g = -exp(a_log) * softplus(a + dt_bias), beta = sigmoid(b).
  // a, b act [T, Hv]; a_log, dt_bias f32 [Hv]; g, beta f32 [T, Hv]
  virtual void gdn_gates(Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, Tensor g, Tensor beta) = 0;
  // The gated delta rule per sequence from its recurrent state (q/k L2-normalised inside, q
  // scaled by dk^-0.5, k-head of v-head h = h / (Hv/Hk)); writes the new state.
  // qkv act [T, 2*Hk*dk + Hv*dv] (post-conv); g, beta f32 [T, Hv]; out act [T, Hv, dv]
  virtual void gated_delta_rule(Tensor qkv, Tensor g, Tensor beta, const GdnShape& shape, int state_layer,
                                Tensor out) = 0;
  // gdn_gates, then gated_delta_rule with those gates: one op where a backend makes the gates
  // inside the delta-rule kernel (CUDA at decode). a, b act [T, Hv]; a_log, dt_bias f32 [Hv];
  // the rest as gated_delta_rule.
  virtual void gdn_gates_delta_rule(Tensor qkv, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias,
                                    const GdnShape& shape, int state_layer, Tensor out);
  // out = w * (x / rms(x)) * act(z), act = sigmoid if sigmoid_gate else silu.
  // x, z act [R, D]; w f32 [D]; out act [R, D]
  virtual void gated_rms_norm(Tensor x, Tensor z, Tensor w, float eps, bool sigmoid_gate, Tensor out) = 0;
  // gdn_gates_delta_rule, then gated_rms_norm of each v-head's output (rows of dv) with z: one op
  // where a backend normalises inside the delta-rule kernel (CUDA at decode). z act [T, Hv*dv];
  // norm_w f32 [dv]; out act [T, Hv*dv]; the rest as gdn_gates_delta_rule. half (optional): a
  // buffer f16 [T, Hv*dv] (where makes_half_copy(T, Hv*dv)) the backend fills with out's fp16 copy
  // / 16 for the linear that reads out (linear_add_rms_norm's a_half), or empties where it makes
  // none (the default).
  virtual void gdn_gates_delta_rule_norm(Tensor qkv, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias,
                                         const GdnShape& shape, int state_layer, Tensor z, Tensor norm_w, float eps,
                                         bool sigmoid_gate, Tensor out, Tensor* half = nullptr);
  // conv1d_silu of mixed, then gdn_gates_delta_rule_norm of its output: one op where a backend
  // convolves inside the delta-rule kernel (CUDA at decode steps). mixed act [T, C] (pre-conv,
  // C = 2*Hk*dk + Hv*dv); conv_w f32 [C, K]; the rest as gdn_gates_delta_rule_norm.
  virtual void conv_gdn_norm(Tensor mixed, Tensor conv_w, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias,
                             const GdnShape& shape, int state_layer, Tensor z, Tensor norm_w, float eps,
                             bool sigmoid_gate, Tensor out, Tensor* half = nullptr);

  // --- gated full attention ---
  // p act [T, nH * 2 * hd] (per head [query | gate]) -> q act [T, nH, hd], gate act [T, nH * hd]
  virtual void split_query_gate(Tensor p, int n_heads, int head_dim, Tensor q, Tensor gate) = 0;
  // NeoX rotation of the first rotary_dim dims of every head at plan.positions. x act [T, n, hd]
  virtual void rope(Tensor x, int rotary_dim, double theta) = 0;
  // The attention block's inputs in one op where a backend fuses it: split_query_gate, rms_norm
  // of every query head (q_norm) and key head (k_norm), then rope of both. p act [T, nH*2*hd];
  // k act [T, nKV, hd] (normalised and rotated in place); q act [T, nH, hd] and gate act
  // [T, nH*hd] are written; q_norm, k_norm f32 [hd].
  virtual void attention_prep(Tensor p, Tensor k, Tensor q_norm, Tensor k_norm, float eps, int rotary_dim,
                              double theta, Tensor q, Tensor gate);
  // Appends k, v to the paged cache of kv_layer at each sequence's n_past, then causal GQA
  // attention of q over the sequence's cache. q act [T, nH, hd]; k, v act [T, nKV, hd];
  // out act [T, nH * hd]
  virtual void attention(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor out) = 0;
  // The gated attention's output, its o_proj's input: attention, then out *= sigmoid(gate) as
  // sigmoid_mul rounds it. gate act [T, nH * hd]. half (optional): a buffer f16 [T, nH * hd] (where
  // makes_half_copy) the backend fills with out's fp16 copy / 16 for o_proj (linear_add_rms_norm's
  // a_half), or empties where it makes none. The default runs attention and sigmoid_mul and makes
  // none; CUDA gates where it merges the key splits at decode and verify.
  virtual void gated_attention(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor gate, Tensor out,
                               Tensor* half = nullptr);
  // x act [R, D] *= sigmoid(gate act [R, D])
  virtual void sigmoid_mul(Tensor x, Tensor gate) = 0;
  // out act [T, D1 + D2] = concat(a act [T, D1], b act [T, D2]) along the last dim
  virtual void concat_cols(Tensor a, Tensor b, Tensor out) = 0;

  // --- sampling (optional; engine/sampler.h is the reference) ---
  // Whether sample() exists; otherwise the engine downloads logits and samples on the host.
  virtual bool supports_sample() const { return false; }
  // One token per spec from its row of logits act [rows, V]; out: [specs.size()]. Synchronises:
  // only the tokens and logprobs are copied back.
  virtual void sample(Tensor logits, const std::vector<SampleRowSpec>& specs, SampledToken* out) {
    DS_FATAL("%s has no device sampler", name());
  }

 protected:
  // act(a, b) of a gated linear's input (GateAct): silu(a) * b into new scratch, or a * sigmoid(b)
  // in place in a (then returned).
  Tensor gated_input(Tensor a, Tensor b, GateAct act);
  // Checks linear_parts' outs against x and w: each [T, N_i], the N_i summing to w's rows.
  static void check_parts(Tensor x, const LinearWeight& w, std::span<const Tensor> outs);
};

}  // namespace ds
