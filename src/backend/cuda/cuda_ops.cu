// CudaOps: device memory (weights, cache pools, step scratch, plan arrays), the cuBLAS linear,
// and the dispatch of every op to its launcher.
#include "backend/cuda/cuda_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"
#include "core/log.h"

namespace ds {

using cuda::bf16;

void cuda_check_launch(const char* kernel, cudaStream_t stream) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) DS_FATAL("launch of %s failed: %s", kernel, cudaGetErrorString(err));
  static const bool sync = std::getenv("DS_SYNC_DEBUG") != nullptr;  // env: DS_SYNC_DEBUG
  if (sync) {
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) DS_FATAL("%s failed: %s", kernel, cudaGetErrorString(err));
  }
}

struct CudaOps::Impl {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::vector<void*> allocations;  // weights and pools, freed with the backend
  char* scratch = nullptr;
  // Plan arrays on the device, packed in one buffer (i32).
  int32_t* plan_buf = nullptr;
  size_t plan_capacity = 0;
  const int32_t *ids = nullptr, *positions = nullptr, *cu_seqlens = nullptr, *n_past = nullptr, *slots = nullptr,
                *block_tables = nullptr, *logit_rows = nullptr, *seq_of_token = nullptr;
  bf16 *k_cache = nullptr, *v_cache = nullptr, *conv_states = nullptr;
  void* rec_states = nullptr;

  void* alloc(size_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    allocations.push_back(p);
    return p;
  }
};

namespace {
size_t state_elem_size(StateDType t) { return t == StateDType::kF32 ? 4 : 2; }
int state_code(StateDType t) { return t == StateDType::kF32 ? 0 : t == StateDType::kF16 ? 1 : 2; }

void expect_bf16(const Tensor& t, const char* what) {
  DS_ASSERT(t.dtype == DType::kBF16 && t.data, "%s must be an allocated BF16 tensor (is %s)", what, dtype_name(t.dtype));
}
void expect_f32(const Tensor& t, const char* what) {
  DS_ASSERT(t.dtype == DType::kF32 && t.data, "%s must be an allocated F32 tensor (is %s)", what, dtype_name(t.dtype));
}
bf16* B(const Tensor& t) { return static_cast<bf16*>(t.data); }
float* F(const Tensor& t) { return static_cast<float*>(t.data); }
}  // namespace

CudaOps::CudaOps(const CudaOpsOptions& options) : impl_(new Impl()), options_(options) {
  CUDA_CHECK(cudaSetDevice(options.device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&impl_->cublas));
  CUBLAS_CHECK(cublasSetStream(impl_->cublas, impl_->stream));
  impl_->scratch = static_cast<char*>(impl_->alloc(options.scratch_bytes));
}

CudaOps::~CudaOps() {
  cudaStreamSynchronize(impl_->stream);
  for (void* p : impl_->allocations) cudaFree(p);
  if (impl_->plan_buf) cudaFree(impl_->plan_buf);
  cublasDestroy(impl_->cublas);
  cudaStreamDestroy(impl_->stream);
}

Tensor CudaOps::upload(const void* host, DType host_dtype, std::initializer_list<int64_t> shape, DType want) {
  if (want == DType::kI32) {  // packed weights: copied as they are
    DS_ASSERT(host_dtype == DType::kI32, "I32 uploads copy I32 data");
    Tensor t = alloc(DType::kI32, shape);
    CUDA_CHECK(cudaMemcpy(t.data, host, t.nbytes(), cudaMemcpyHostToDevice));
    return t;
  }
  DS_ASSERT(want == DType::kBF16 || want == DType::kF32, "CUDA weights are BF16, F32 or I32, not %s", dtype_name(want));
  Tensor t(nullptr, want, shape);
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> f32(n);
  convert_to_f32(host_dtype, host, f32.data(), n);
  t.data = impl_->alloc(t.nbytes());
  weight_bytes_ += t.nbytes();
  if (want == DType::kF32) {
    CUDA_CHECK(cudaMemcpy(t.data, f32.data(), t.nbytes(), cudaMemcpyHostToDevice));
  } else {
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(f32[i]);
    CUDA_CHECK(cudaMemcpy(t.data, b.data(), t.nbytes(), cudaMemcpyHostToDevice));
  }
  return t;
}

Tensor CudaOps::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  DS_ASSERT(dtype == DType::kBF16 || dtype == DType::kF32 || dtype == DType::kI32,
            "CUDA tensors are BF16, F32 or I32, not %s", dtype_name(dtype));
  Tensor t(nullptr, dtype, shape);
  t.data = impl_->alloc(t.nbytes());
  weight_bytes_ += t.nbytes();
  return t;
}

void CudaOps::fill_random(Tensor t, float mean, float half_range, uint64_t seed) {
  if (t.dtype == DType::kI32) cuda::launch_fill_random_bits(static_cast<uint32_t*>(t.data), t.numel(), seed, impl_->stream);
  else if (t.dtype == DType::kF32) cuda::launch_fill_random_f32(F(t), t.numel(), mean, half_range, seed, impl_->stream);
  else cuda::launch_fill_random_bf16(B(t), t.numel(), mean, half_range, seed, impl_->stream);
}

Tensor CudaOps::scratch(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t(nullptr, dtype, shape);
  const size_t bytes = (t.nbytes() + 255) & ~size_t(255);
  if (scratch_used_ + bytes > options_.scratch_bytes)
    DS_FATAL("step scratch of %zu bytes exhausted (asked %zu more); raise CudaOpsOptions::scratch_bytes",
             options_.scratch_bytes, bytes);
  t.data = impl_->scratch + scratch_used_;
  scratch_used_ += bytes;
  return t;
}

void CudaOps::synchronize() { CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

void CudaOps::download_f32(Tensor src, float* host) {
  const size_t n = static_cast<size_t>(src.numel());
  std::vector<uint8_t> raw(src.nbytes());
  CUDA_CHECK(cudaMemcpyAsync(raw.data(), src.data, raw.size(), cudaMemcpyDeviceToHost, impl_->stream));
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  convert_to_f32(src.dtype, raw.data(), host, n);
}

size_t CudaOps::cache_bytes_for(const CacheGeometry& g) const {
  return (2 * g.kv_elems() + g.conv_elems()) * sizeof(bf16) + g.rec_elems() * state_elem_size(options_.state_dtype);
}

void CudaOps::alloc_caches(const CacheGeometry& g) {
  geo_ = g;
  const size_t kv = g.kv_elems() * sizeof(bf16);
  const size_t conv = g.conv_elems() * sizeof(bf16);
  const size_t rec = g.rec_elems() * state_elem_size(options_.state_dtype);
  impl_->k_cache = static_cast<bf16*>(impl_->alloc(kv));
  impl_->v_cache = static_cast<bf16*>(impl_->alloc(kv));
  impl_->conv_states = static_cast<bf16*>(impl_->alloc(conv));
  impl_->rec_states = impl_->alloc(rec);
  // Zeros, so stale bytes never reach a kernel even through a scheduling bug.
  CUDA_CHECK(cudaMemset(impl_->k_cache, 0, kv));
  CUDA_CHECK(cudaMemset(impl_->v_cache, 0, kv));
  CUDA_CHECK(cudaMemset(impl_->conv_states, 0, conv));
  CUDA_CHECK(cudaMemset(impl_->rec_states, 0, rec));
  cache_bytes_ = 2 * kv + conv + rec;
}

void CudaOps::begin_step(const StepPlan& plan) {
  check_step_plan(plan);
  plan_ = plan;
  std::vector<int32_t> seq_of_token(plan.n_tokens());  // i32 [n_tokens]
  max_chunk_ = 0;
  max_ctx_ = 1;
  for (int s = 0; s < plan.n_seqs(); ++s) {
    for (int t = plan.cu_seqlens[s]; t < plan.cu_seqlens[s + 1]; ++t) seq_of_token[t] = s;
    const int chunk = plan.cu_seqlens[s + 1] - plan.cu_seqlens[s];
    max_chunk_ = std::max(max_chunk_, chunk);
    max_ctx_ = std::max(max_ctx_, plan.n_past[s] + chunk);
  }
  // One host buffer, one copy: [ids | positions | cu_seqlens | n_past | slots | tables | rows | seq_of_token]
  std::vector<int32_t> packed;
  std::vector<size_t> offsets;
  for (const std::vector<int32_t>* v : {&plan.token_ids, &plan.positions, &plan.cu_seqlens, &plan.n_past,
                                        &plan.state_slots, &plan.block_tables, &plan.logit_rows,
                                        static_cast<const std::vector<int32_t>*>(&seq_of_token)}) {
    offsets.push_back(packed.size());
    packed.insert(packed.end(), v->begin(), v->end());
  }
  if (packed.size() > impl_->plan_capacity) {
    if (impl_->plan_buf) CUDA_CHECK(cudaFree(impl_->plan_buf));
    impl_->plan_capacity = packed.size() * 2;
    CUDA_CHECK(cudaMalloc(&impl_->plan_buf, impl_->plan_capacity * sizeof(int32_t)));
  }
  CUDA_CHECK(cudaMemcpyAsync(impl_->plan_buf, packed.data(), packed.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                             impl_->stream));
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));  // `packed` is pageable host memory about to go away
  const int32_t* b = impl_->plan_buf;
  impl_->ids = b + offsets[0];
  impl_->positions = b + offsets[1];
  impl_->cu_seqlens = b + offsets[2];
  impl_->n_past = b + offsets[3];
  impl_->slots = b + offsets[4];
  impl_->block_tables = b + offsets[5];
  impl_->logit_rows = b + offsets[6];
  impl_->seq_of_token = b + offsets[7];
}

void CudaOps::embedding(Tensor table, Tensor out) {
  expect_bf16(table, "embedding table");
  expect_bf16(out, "embedding out");
  cuda::launch_embedding(B(table), impl_->ids, B(out), plan_.n_tokens(), static_cast<int>(table.dim(1)), impl_->stream);
}

void CudaOps::rms_norm(Tensor x, Tensor w, float eps, Tensor out) {
  expect_bf16(x, "rms_norm x");
  expect_f32(w, "rms_norm weight");
  const int D = static_cast<int>(w.numel());
  cuda::launch_rms_norm(B(x), F(w), B(out), static_cast<int>(x.numel() / D), D, eps, impl_->stream);
}

void CudaOps::linear(Tensor x, Tensor w, Tensor out) {
  expect_bf16(x, "linear x");
  expect_bf16(w, "linear weight");
  expect_bf16(out, "linear out");
  const int T = static_cast<int>(x.dim(0)), K = static_cast<int>(x.dim(1)), N = static_cast<int>(w.dim(0));
  DS_ASSERT(w.dim(1) == K && out.numel() == int64_t(T) * N, "linear shapes x%s w%s out%s", x.shape_str().c_str(),
            w.shape_str().c_str(), out.shape_str().c_str());
  if (T == 0) return;
  // Row-major out [T, N] is column-major out^T [N, T] = W [N, K] . x^T, i.e. op(A)=W^T^T.
  const float alpha = 1.f, beta = 0.f;
  CUBLAS_CHECK(cublasGemmEx(impl_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, w.data, CUDA_R_16BF, K, x.data,
                            CUDA_R_16BF, K, &beta, out.data, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

void CudaOps::linear_w4a16(Tensor x, const LinearWeight& w, Tensor out) {
  expect_bf16(x, "linear x");
  expect_bf16(out, "linear out");
  DS_ASSERT(w.quantized() && w.packed.dtype == DType::kI32 && w.scales.dtype == DType::kF32, "W4A16 weight");
  const int T = static_cast<int>(x.dim(0)), K = static_cast<int>(x.dim(1)), N = static_cast<int>(w.packed.dim(0));
  DS_ASSERT(w.packed.dim(1) * 8 == K && out.numel() == int64_t(T) * N, "W4A16 shapes x%s packed%s out%s",
            x.shape_str().c_str(), w.packed.shape_str().c_str(), out.shape_str().c_str());
  const auto* packed = static_cast<const uint32_t*>(w.packed.data);
  // Steps of up to this many tokens take the GEMV, longer ones dequantise + cuBLAS.
  // env: DS_W4A16_GEMV_MAX_TOKENS (default 1: on the H200 the GEMV's 27B-shape steps grow
  // from 39 ms at 1 token to 95 ms at 8, where bf16 cuBLAS steps take 28 ms; see docs/perf)
  static const int gemv_max_tokens = [] {
    const char* env = std::getenv("DS_W4A16_GEMV_MAX_TOKENS");
    return env ? std::atoi(env) : 1;
  }();
  if (T <= gemv_max_tokens) {
    cuda::launch_w4a16_gemv(B(x), packed, F(w.scales), B(out), T, N, K, w.group_size, impl_->stream);
    return;
  }
  const size_t mark = scratch_mark();
  Tensor dense = scratch(DType::kBF16, {N, K});
  cuda::launch_w4a16_dequant(packed, F(w.scales), B(dense), N, K, w.group_size, impl_->stream);
  linear(x, dense, out);
  scratch_release(mark);
}

void CudaOps::add(Tensor x, Tensor y) {
  DS_ASSERT(x.numel() == y.numel(), "add shapes");
  cuda::launch_add(B(x), B(y), x.numel(), impl_->stream);
}

void CudaOps::silu_mul(Tensor gate, Tensor up, Tensor out) {
  cuda::launch_silu_mul(B(gate), B(up), B(out), out.numel(), impl_->stream);
}

void CudaOps::sigmoid_mul(Tensor x, Tensor gate) { cuda::launch_sigmoid_mul(B(x), B(gate), x.numel(), impl_->stream); }

void CudaOps::gather_rows(Tensor x, Tensor out) {
  cuda::launch_gather_rows(B(x), impl_->logit_rows, B(out), plan_.n_out(), static_cast<int>(x.dim(1)), impl_->stream);
}

void CudaOps::concat_cols(Tensor a, Tensor b, Tensor out) {
  cuda::launch_concat_cols(B(a), B(b), B(out), static_cast<int>(a.dim(0)), static_cast<int>(a.dim(1)),
                           static_cast<int>(b.dim(1)), impl_->stream);
}

void CudaOps::split_query_gate(Tensor p, int n_heads, int head_dim, Tensor q, Tensor gate) {
  cuda::launch_split_query_gate(B(p), B(q), B(gate), static_cast<int>(p.dim(0)), n_heads, head_dim, impl_->stream);
}

void CudaOps::rope(Tensor x, int rotary_dim, double theta) {
  cuda::launch_rope(B(x), impl_->positions, static_cast<int>(x.dim(0)), static_cast<int>(x.dim(1)),
                    static_cast<int>(x.dim(2)), rotary_dim, static_cast<float>(theta), impl_->stream);
}

void CudaOps::gated_rms_norm(Tensor x, Tensor z, Tensor w, float eps, bool sigmoid_gate, Tensor out) {
  expect_f32(w, "gated_rms_norm weight");
  const int D = static_cast<int>(w.numel());
  cuda::launch_gated_rms_norm(B(x), B(z), F(w), B(out), static_cast<int>(x.numel() / D), D, eps, sigmoid_gate,
                              impl_->stream);
}

void CudaOps::gdn_gates(Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, Tensor g, Tensor beta) {
  expect_f32(g, "gdn g");
  expect_f32(beta, "gdn beta");
  const int Hv = static_cast<int>(a_log.numel());
  cuda::launch_gdn_gates(B(a), B(b), F(a_log), F(dt_bias), F(g), F(beta), static_cast<int>(a.numel() / Hv), Hv,
                         impl_->stream);
}

void CudaOps::conv1d_silu(Tensor mixed, Tensor w, int layer, Tensor out) {
  const int C = static_cast<int>(mixed.dim(1)), K = static_cast<int>(w.dim(1));
  DS_ASSERT(C == geo_.conv_dim && K - 1 == geo_.conv_rows, "conv geometry");
  DS_ASSERT(layer >= 0 && layer < geo_.n_state_layers, "state layer %d", layer);
  bf16* state = impl_->conv_states + size_t(layer) * geo_.n_slots * geo_.conv_rows * geo_.conv_dim;
  cuda::launch_conv1d_silu(B(mixed), F(w), state, B(out), impl_->seq_of_token, impl_->cu_seqlens, impl_->n_past,
                           impl_->slots, plan_.n_tokens(), plan_.n_seqs(), C, K, impl_->stream);
}

void CudaOps::gated_delta_rule(Tensor qkv, Tensor g, Tensor beta, const GdnShape& sh, int layer, Tensor out) {
  DS_ASSERT(layer >= 0 && layer < geo_.n_state_layers, "state layer %d", layer);
  DS_ASSERT(sh.n_v_heads == geo_.n_v_heads && sh.k_head_dim == geo_.k_head_dim && sh.v_head_dim == geo_.v_head_dim,
            "GDN geometry");
  const size_t per_layer = size_t(geo_.n_slots) * sh.n_v_heads * sh.k_head_dim * sh.v_head_dim;
  void* state = static_cast<char*>(impl_->rec_states) + layer * per_layer * state_elem_size(options_.state_dtype);
  cuda::launch_gdn_recurrent(B(qkv), F(g), F(beta), state, state_code(options_.state_dtype), B(out), impl_->cu_seqlens,
                             impl_->n_past, impl_->slots, plan_.n_seqs(), sh.n_k_heads, sh.n_v_heads, sh.k_head_dim,
                             sh.v_head_dim, /*split_columns=*/max_chunk_ <= 16, impl_->stream);
}

void CudaOps::attention(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor out) {
  const int T = static_cast<int>(q.dim(0)), nH = static_cast<int>(q.dim(1)), hd = static_cast<int>(q.dim(2));
  const int nKV = static_cast<int>(k.dim(1));
  DS_ASSERT(nKV == geo_.n_kv_heads && hd == geo_.head_dim, "attention geometry");
  DS_ASSERT(kv_layer >= 0 && kv_layer < geo_.n_kv_layers, "kv layer %d", kv_layer);
  const size_t layer_elems = size_t(geo_.n_blocks) * geo_.block_size * nKV * hd;
  bf16* kc = impl_->k_cache + kv_layer * layer_elems;
  bf16* vc = impl_->v_cache + kv_layer * layer_elems;
  cuda::launch_kv_append(B(k), B(v), kc, vc, impl_->seq_of_token, impl_->cu_seqlens, impl_->n_past,
                         impl_->block_tables, plan_.max_blocks, T, nKV, hd, geo_.block_size, impl_->stream);
  const size_t budget = (options_.scratch_bytes - scratch_used_) / 4;  // leave room for the rest of the layer
  const int n_splits = cuda::attention_splits(T, nH, hd, max_ctx_, budget);
  float* partial = n_splits > 1 ? F(scratch(DType::kF32, {int64_t(T) * nH * n_splits, hd + 2})) : nullptr;
  cuda::launch_attention(B(q), kc, vc, B(out), partial, n_splits, max_ctx_, impl_->seq_of_token, impl_->cu_seqlens,
                         impl_->n_past, impl_->block_tables, plan_.max_blocks, T, nH, nKV, hd, geo_.block_size, scale,
                         impl_->stream);
}

void CudaOps::sample(Tensor logits, const std::vector<SampleRowSpec>& specs, SampledToken* out) {
  expect_bf16(logits, "sample logits");
  if (specs.empty()) return;
  const int V = static_cast<int>(logits.dim(1));
  std::vector<cuda::SampleRowParams> rows(specs.size());
  std::vector<LogitEdit> edits;
  int64_t n_work = 0;  // rows with edits, each gets an f32 [V] copy
  for (size_t r = 0; r < specs.size(); ++r) {
    const SampleRowSpec& s = specs[r];
    DS_ASSERT(s.row >= 0 && s.row < logits.dim(0), "sample row %d of %lld", s.row, (long long)logits.dim(0));
    rows[r] = {s.edits.empty() ? -1 : n_work++ * V, s.seed, s.draw, s.temperature, s.top_p, s.min_p, s.row, s.top_k,
               s.n_logprobs, static_cast<int32_t>(edits.size()), static_cast<int32_t>(edits.size() + s.edits.size())};
    edits.insert(edits.end(), s.edits.begin(), s.edits.end());
  }
  const size_t mark = scratch_mark();
  const size_t rows_bytes = rows.size() * sizeof(rows[0]), edit_bytes = edits.size() * sizeof(LogitEdit);
  Tensor buf = scratch(DType::kI32, {static_cast<int64_t>((rows_bytes + edit_bytes + 3) / 4)});
  char* d_rows = static_cast<char*>(buf.data);
  CUDA_CHECK(cudaMemcpyAsync(d_rows, rows.data(), rows_bytes, cudaMemcpyHostToDevice, impl_->stream));
  if (edit_bytes)
    CUDA_CHECK(cudaMemcpyAsync(d_rows + rows_bytes, edits.data(), edit_bytes, cudaMemcpyHostToDevice, impl_->stream));
  float* work = n_work ? F(scratch(DType::kF32, {n_work, V})) : nullptr;
  Tensor d_out = scratch(DType::kI32, {static_cast<int64_t>(specs.size() * sizeof(SampledToken) / 4)});
  cuda::launch_sample(B(logits), V, reinterpret_cast<const cuda::SampleRowParams*>(d_rows),
                      static_cast<int>(specs.size()), reinterpret_cast<const LogitEdit*>(d_rows + rows_bytes), work,
                      static_cast<SampledToken*>(d_out.data), impl_->stream);
  CUDA_CHECK(cudaMemcpyAsync(out, d_out.data, specs.size() * sizeof(SampledToken), cudaMemcpyDeviceToHost,
                             impl_->stream));
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));  // also keeps rows/edits (pageable) alive until copied
  scratch_release(mark);
}

}  // namespace ds
