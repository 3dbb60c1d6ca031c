// CudaOps: the GPU backend. bf16 activations and weights, fp32 accumulation, fp32 norm gains,
// bf16 paged KV cache, GDN recurrent state stored as fp16 (default), bf16 or fp32. Owns all
// device memory: weights, cache pools, a step scratch arena, and the current plan's arrays.
// Host-only header: no CUDA types leak to callers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ops/ops.h"

namespace ds {

namespace cuda {
struct GemvOut;
struct GdnNorm;
struct GdnConv;
enum class GemvGate : int;
}

enum class StateDType { kF32, kF16, kBF16 };

struct CudaOpsOptions {
  int device = 0;
  size_t scratch_bytes = size_t(256) << 20;  // per-step arena (step_scratch_bytes sizes it for a model)
  StateDType state_dtype = StateDType::kF16;
  // Embedding table and lm_head stored as int8 group-128 (dequant-on-gather embedding, int8
  // lm_head GEMV), quantised at load from bf16; off keeps them bf16 (--lm-head-dtype bf16).
  bool int8_vocab = true;
};

class CudaOps final : public Ops {
 public:
  explicit CudaOps(const CudaOpsOptions& options = {});
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  const char* name() const override { return "cuda"; }
  DType act_dtype() const override { return DType::kBF16; }

  Tensor upload(const void* host, DType host_dtype, std::initializer_list<int64_t> shape, DType want) override;
  Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) override;
  void fill_random(Tensor t, float mean, float half_range, uint64_t seed) override;
  Tensor scratch(DType dtype, std::initializer_list<int64_t> shape) override;
  void reset_scratch() override { scratch_used_ = 0; }
  size_t scratch_mark() const override { return scratch_used_; }
  void scratch_release(size_t mark) override { scratch_used_ = mark; }
  // The most step scratch taken at once since the backend was made, less what was sized from
  // what was free (scratch_from_free).
  size_t scratch_peak() const { return scratch_peak_; }
  void synchronize() override;
  void download_f32(Tensor src, float* host) override;
  void alloc_caches(const CacheGeometry& geometry) override;
  size_t cache_bytes_for(const CacheGeometry& g) const override;
  size_t bytes_in_use() const override { return weight_bytes_ + options_.scratch_bytes + cache_bytes_; }
  size_t device_bytes_used() const override;
  // 512 MiB: the 27B serve at C64 grew by 330 MiB in its first minute (graphs of each batch size).
  size_t runtime_reserve_bytes() const override { return size_t(512) << 20; }

  void begin_step(const StepPlan& plan) override;
  // Decode steps are recorded as a CUDA graph per (sequences, block-table width) on first use
  // and replayed after (env DS_CUDA_GRAPHS=0: never).
  std::vector<Tensor> run_step(const std::function<std::vector<Tensor>()>& record) override;
  void prepare_weight(LinearWeight& w, WeightRole role) override;
  bool keeps_int8_rows(int64_t K) const override { return K % 128 == 0; }
  bool keeps_int8_vocab(int64_t H) const override { return options_.int8_vocab && keeps_int8_rows(H); }
  LinearWeight upload_int8_rows(const int8_t* q, const float* scales, int64_t N, int64_t K) override;
  void embedding(const LinearWeight& table, Tensor out) override;
  void rms_norm(Tensor x, Tensor w, float eps, Tensor out) override;
  void linear(Tensor x, Tensor w, Tensor out) override;
  bool supports_w4a16() const override { return true; }
  void linear_quantized(Tensor x, const LinearWeight& w, Tensor out) override;
  // A small dense group after the W4A16 group of the same input (after_same_input) runs beside
  // that GEMV's tail: its kernel waits for the GEMV only before it ends (launch_small_gemv).
  // A scale (a deferred norm of x) is applied in the GEMVs' epilogues where they allow it, else by
  // scale_rows after them.
  void linear_parts(Tensor x, const LinearWeight& w, std::span<const Tensor> outs, bool after_same_input = false,
                    const RowScale& scale = {}) override;
  void add(Tensor x, Tensor y) override;
  void add_rms_norm(Tensor x, Tensor y, Tensor w, float eps, Tensor out) override;
  void scale_rows(Tensor out, const RowScale& s, int64_t D) override;
  int64_t norm_parts(int64_t D) const override;
  // At decode (up to 8 tokens, a W4A16 weight whose GEMV takes one split-K launch of the one-tile
  // kernel: cuda::w4a16_gemv_norms_output) the GEMV's epilogue adds its rows to x, writes h = x * w
  // and each tile's sums of squares, and leaves the division by the RMS to the linears after it
  // (out.scale), so no norm kernel runs between them. env DS_DEFER_NORM = 1 (default) | 0.
  void linear_add_rms_norm(Tensor a, const Tensor* b, GateAct act, const LinearWeight& w, Tensor x, Tensor norm_w,
                           float eps, Tensor ss, NormedAct& out, Int8Twin twin = {}, Tensor half = {},
                           Tensor a_half = {}) override;
  bool makes_int8_twin(int64_t T, int64_t D) const override;
  bool makes_half_copy(int64_t T, int64_t D) const override;
  void silu_mul(Tensor gate, Tensor up, Tensor out) override;
  void gather_rows(Tensor x, Tensor out) override;
  void conv1d_silu(Tensor mixed, Tensor w, int state_layer, Tensor out) override;
  void gdn_gates(Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, Tensor g, Tensor beta) override;
  void gated_delta_rule(Tensor qkv, Tensor g, Tensor beta, const GdnShape& shape, int state_layer, Tensor out) override;
  void gdn_gates_delta_rule(Tensor qkv, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, const GdnShape& shape,
                            int state_layer, Tensor out) override;
  void gdn_gates_delta_rule_norm(Tensor qkv, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, const GdnShape& shape,
                                 int state_layer, Tensor z, Tensor norm_w, float eps, bool sigmoid_gate,
                                 Tensor out, Tensor* half = nullptr) override;
  // The conv in the one-token GDN decode kernel where gdn_takes_conv, else the two ops.
  void conv_gdn_norm(Tensor mixed, Tensor conv_w, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias,
                     const GdnShape& shape, int state_layer, Tensor z, Tensor norm_w, float eps, bool sigmoid_gate,
                     Tensor out, Tensor* half = nullptr) override;
  // Whether conv_gdn_norm convolves in the GDN decode kernel at this step (cuda::GdnConv: decode
  // steps that take the one-token kernel, conv widths up to cuda::kGdnConvMaxK; env DS_GDN_CONV =
  // 1, the default | 0).
  bool gdn_takes_conv(const GdnShape& shape, int conv_width) const;
  void gated_rms_norm(Tensor x, Tensor z, Tensor w, float eps, bool sigmoid_gate, Tensor out) override;
  void split_query_gate(Tensor p, int n_heads, int head_dim, Tensor q, Tensor gate) override;
  void rope(Tensor x, int rotary_dim, double theta) override;
  void attention_prep(Tensor p, Tensor k, Tensor q_norm, Tensor k_norm, float eps, int rotary_dim, double theta,
                      Tensor q, Tensor gate) override;
  void attention(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor out) override;
  // The gate (and its fp16 copy for o_proj, at the steps makes_half_copy allows) applied where the
  // key splits are merged, at decode and verify steps whose rows all take the tensor-core decode
  // kernels in more than one split; else attention, then sigmoid_mul.
  void gated_attention(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor gate, Tensor out,
                       Tensor* half) override;
  void sigmoid_mul(Tensor x, Tensor gate) override;
  void gated_linear(Tensor a, Tensor b, GateAct act, const LinearWeight& w, Tensor out) override;
  // The fp16 copy (half) where the GEMV's epilogue writes the product and its launches read copies.
  void linear_swiglu(Tensor x, const LinearWeight& w, Tensor gate, Tensor up, Tensor out, const RowScale& scale = {},
                     Tensor* half = nullptr) override;
  void concat_cols(Tensor a, Tensor b, Tensor out) override;
  bool supports_sample() const override { return true; }
  void sample(Tensor logits, const std::vector<SampleRowSpec>& specs, SampledToken* out) override;

  size_t weight_bytes() const { return weight_bytes_; }
  size_t cache_bytes() const { return cache_bytes_; }

 private:
  // Step scratch whose size was chosen from what is free (blocks of dequantised rows, attention
  // partials sized from a budget): scratch_peak leaves it out, since it would take less if less
  // were free.
  Tensor scratch_from_free(DType dtype, std::initializer_list<int64_t> shape);
  // out[:, :N] (row stride ldc) = x bf16 [T, K] . w bf16 [N, K]^T with cuBLAS
  void gemm(const void* x, const void* w, void* out, int T, int N, int K, int ldc);
  void free_weight(Tensor t);  // a weight replaced by its prepared form
  // Int8 rows [N, K] of kInt8Tiled (a vocabulary table, or a linear published so), its packed i8
  // [padded rows, K] and scales f32 [padded rows, K / 128] allocated, their values left to be
  // written (whole 16-row blocks: qgemv_kernel.cuh Int8Tiled).
  LinearWeight alloc_int8_rows(int64_t N, int64_t K);
  // out's parts = x bf16 [T, K] . w^T for int8 rows w: the int8 GEMV up to kInt8GemvMaxTokens
  // tokens, else blocks of rows dequantised for cuBLAS; a consumer's norm scale (out.norm.ss,
  // RowScale) applied after.
  void linear_int8(const void* x_bf16, int T, int K, const LinearWeight& w, const cuda::GemvOut& out);
  // out's parts' columns [r0, r0 + n) of x bf16 [T, K] . dense^T, dense bf16 [n, K] the weight's
  // rows [r0, r0 + n), with cuBLAS.
  void gemm_rows(const void* x, const void* dense, int r0, int n, int T, int K, const cuda::GemvOut& out);
  // Each part of out divided by its rows' RMS (out.norm, a consumer's scale of an input K wide).
  void scale_parts(const cuda::GemvOut& out, int T, int K);
  // Rows of an N x K weight dequantised to bf16 at once for cuBLAS: all N, or a multiple of 128
  // (so of the W4A16 16-row tiles) within a quarter of the free step scratch, at least 128.
  int dequant_block_rows(int N, int K) const;
  // The recurrent state pool of GDN layer `layer` [n_slots, Hv, dk, dv] (checks the shape).
  void* gdn_state(const GdnShape& shape, int layer);
  // The conv state pool of GDN layer `layer`, bf16 [n_slots, conv_rows, conv_dim] (checks the layer).
  void* conv_state(int layer);
  // The decode kernels' delta rule with its own gates (and, with norm.z, the gated norm):
  // gdn_gates_delta_rule and gdn_gates_delta_rule_norm at decode and verify. With conv.w, qkv is
  // the pre-conv rows, convolved in the kernel (conv_gdn_norm).
  void gdn_decode(Tensor qkv, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, const GdnShape& shape, int layer,
                  Tensor out, const cuda::GdnNorm& norm, const cuda::GdnConv& conv);
  // The gated norm of each v-head's output the decode kernels apply (z act [T, Hv*dv], norm_w f32 [dv]),
  // and its fp16 copy into *half (f16 [T, Hv*dv], out's shape) where the step's kernel makes one
  // (cuda::gdn_norm_copies), else *half emptied.
  cuda::GdnNorm gdn_norm(Tensor z, Tensor norm_w, const GdnShape& shape, float eps, bool sigmoid_gate, Tensor out,
                         Tensor* half) const;
  // Whether this verify step (2 to 8 tokens a sequence, at most 2 sequences) takes the decode
  // kernel of a CTA a head with its norm and 4 parts of a column's rows, rather than the 32-column
  // tiles and a gated-norm launch. env DS_GDN_VERIFY_HEAD = 1 (default) | 0.
  bool gdn_verify_head() const;
  // The GDN decode kernel of this step (launch_gdn_recurrent's head_parts): cuda::kGdnOneToken at
  // decode steps, cuda::kGdnVerifyMma at verify steps of the heads it takes; else the row parts a
  // column of the kernel of a CTA a head (4 at decode steps of up to 2 sequences and where
  // gdn_verify_head, else 2), or cuda::kGdnHeadPair (a CTA pair a head) at verify steps of 4 or
  // more tokens whose pairs fit one wave.
  int gdn_head_parts(const GdnShape& sh) const;
  // attention; gate (optional, gated_attention's) applied, and half filled or emptied, where the
  // step's split merge can take them. Returns whether it did.
  bool attend(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor out, const Tensor* gate,
              Tensor* half);
  // The W4A16 (tiled) linear of x bf16 [T, K] into one output or the parts of a fused weight.
  // xb, gate: a gated input (cuda::w4a16_gemv_gates_input), else null and kNone. out.norm: a
  // producer's (cuda::w4a16_gemv_norms_output), or a consumer's scale, applied by scale_rows after
  // the GEMV where its epilogue cannot (never with a swiglu output).
  // twin, half: a producer's copies of x (RowScale).
  void linear_w4a16(const void* x, int T, int K, const LinearWeight& w, const cuda::GemvOut& out, const void* xb,
                    cuda::GemvGate gate, const Int8Twin& twin = {}, const Tensor& half = {});
  // A paired weight's GEMV (T within w4a16_gemv_step_tokens) into scratch rows in its paired order,
  // then launch_paired_rows: a, b bf16 [T, N/2] = gate, up, or with swiglu a = silu(gate) * up.
  void linear_w4a16_paired_rows(const void* x, int T, int K, const LinearWeight& w, void* a, void* b, bool swiglu,
                                const RowScale& scale);
  struct Impl;  // CUDA handles and device pointers (cuda_ops.cu)
  std::unique_ptr<Impl> impl_;
  CudaOpsOptions options_;
  CacheGeometry geo_;
  StepPlan plan_;                  // host copy of the current step
  int max_chunk_ = 0;              // most new tokens of one sequence in the step
  int max_ctx_ = 1;                // longest context (cached + new) of one sequence in the step;
                                   // for graph steps, the whole block-table width
  int table_width_ = 0;            // block-table row width on the device (padded for graph steps)
  bool graph_step_ = false;        // the current step may run as a recorded graph
  size_t scratch_used_ = 0, scratch_peak_ = 0;
  size_t weight_bytes_ = 0, cache_bytes_ = 0;
};

}  // namespace ds
