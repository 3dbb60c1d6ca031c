// CpuOps: the reference backend. Plain loops, fp32 activations and accumulation, threads over
// independent rows/heads only (results never depend on the thread count). The ground truth
// every other backend is tested against.
#pragma once

#include <memory>
#include <vector>

#include "ops/int8_rows.h"
#include "ops/ops.h"

namespace ds {

enum class GdnMode {
  kAuto,       // chunked for multi-token sequence chunks, recurrent for single tokens (as HF)
  kRecurrent,  // token by token everywhere
  kChunked,    // chunked form everywhere
};

class CpuOps : public Ops {
 public:
  // bf16_activations: round every activation an op writes to bf16, emulating a bf16 backend's
  // storage with fp32 math (the same-precision baseline the CUDA backend is judged against).
  explicit CpuOps(bool bf16_activations = false) : bf16_act_(bf16_activations) {}
  const char* name() const override { return "cpu"; }
  DType act_dtype() const override { return DType::kF32; }
  void set_gdn_mode(GdnMode mode) { gdn_mode_ = mode; }
  // Int8 group-128 vocabulary tables: prepare_weight rounds the embedding and lm_head values
  // through ops/int8_rows.h in place (the twin of CudaOpsOptions::int8_vocab). Off by default.
  void set_int8_vocab(bool on) { int8_vocab_ = on; }

  Tensor upload(const void* host, DType host_dtype, std::initializer_list<int64_t> shape, DType want) override;
  Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) override;
  void fill_random(Tensor t, float mean, float half_range, uint64_t seed) override;
  Tensor scratch(DType dtype, std::initializer_list<int64_t> shape) override;
  void reset_scratch() override { scratch_.clear(); }
  size_t scratch_mark() const override { return scratch_.size(); }
  void scratch_release(size_t mark) override { scratch_.resize(mark); }
  void synchronize() override {}
  void download_f32(Tensor src, float* host) override;
  void alloc_caches(const CacheGeometry& geometry) override;
  size_t cache_bytes_for(const CacheGeometry& g) const override;
  size_t bytes_in_use() const override { return weight_bytes_ + cache_bytes_for(geo_); }

  void begin_step(const StepPlan& plan) override;
  void prepare_weight(LinearWeight& w, WeightRole role) override;
  bool keeps_int8_rows(int64_t K) const override { return K % kInt8Group == 0; }
  bool keeps_int8_vocab(int64_t H) const override { return int8_vocab_ && keeps_int8_rows(H); }
  // The weight's values q * scale in fp32, as prepare_weight leaves a table it rounds.
  LinearWeight upload_int8_rows(const int8_t* q, const float* scales, int64_t N, int64_t K) override;
  void embedding(const LinearWeight& table, Tensor out) override;
  void rms_norm(Tensor x, Tensor w, float eps, Tensor out) override;
  void linear(Tensor x, Tensor w, Tensor out) override;
  Tensor act_int8_input(Tensor x) override;
  void add(Tensor x, Tensor y) override;
  void scale_rows(Tensor out, const RowScale& s, int64_t D) override;
  void silu_mul(Tensor gate, Tensor up, Tensor out) override;
  void gather_rows(Tensor x, Tensor out) override;
  void conv1d_silu(Tensor mixed, Tensor w, int state_layer, Tensor out) override;
  void gdn_gates(Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, Tensor g, Tensor beta) override;
  void gated_delta_rule(Tensor qkv, Tensor g, Tensor beta, const GdnShape& shape, int state_layer, Tensor out) override;
  void gated_rms_norm(Tensor x, Tensor z, Tensor w, float eps, bool sigmoid_gate, Tensor out) override;
  void split_query_gate(Tensor p, int n_heads, int head_dim, Tensor q, Tensor gate) override;
  void rope(Tensor x, int rotary_dim, double theta) override;
  void attention(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor out) override;
  void sigmoid_mul(Tensor x, Tensor gate) override;
  void concat_cols(Tensor a, Tensor b, Tensor out) override;

 private:
  void round_act(Tensor t) const;  // bf16 rounding in bf16_activations mode
  Tensor alloc_owned(std::vector<std::unique_ptr<float[]>>& owner, DType dtype, std::initializer_list<int64_t> shape);
  float* conv_state(int layer, int slot);
  float* recurrent_state(int layer, int slot);

  bool bf16_act_ = false;
  GdnMode gdn_mode_ = GdnMode::kAuto;
  bool int8_vocab_ = false;
  std::vector<std::unique_ptr<float[]>> weights_;  // persistent uploads (fp32-aligned storage)
  size_t weight_bytes_ = 0;
  std::vector<std::unique_ptr<float[]>> scratch_;
  CacheGeometry geo_;
  std::vector<float> k_cache_, v_cache_;           // f32 [n_kv_layers, n_blocks, block_size, n_kv_heads, head_dim]
  std::vector<float> conv_states_;                 // f32 [n_state_layers, n_slots, conv_rows, conv_dim]
  std::vector<float> rec_states_;                  // f32 [n_state_layers, n_slots, Hv, dk, dv]
  StepPlan plan_;
};

}  // namespace ds
