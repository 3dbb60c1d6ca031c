// CudaOps: device memory (weights, cache pools, step scratch, plan arrays), the cuBLAS linear,
// load-time weight preparation (W4A16 repacking, int8 vocabulary tables) and the dispatch of
// every op to its launcher.
#include "backend/cuda/cuda_ops.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"
#include "core/log.h"

namespace ds {

using cuda::bf16;

void cuda_check_launch(const char* kernel, cudaStream_t stream) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) DS_FATAL("launch of %s failed: %s", kernel, cudaGetErrorString(err));
  static const bool sync = std::getenv("DS_SYNC_DEBUG") != nullptr;  // env: DS_SYNC_DEBUG
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (sync) CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  if (sync && capturing == cudaStreamCaptureStatusNone) {
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
  void* cublas_workspace = nullptr;
  // Recorded decode and verify steps by shape (sequences, tokens per sequence, logit rows,
  // block-table width); see run_step.
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    std::vector<Tensor> outputs;
    size_t scratch_begin = 0, scratch_end = 0;
  };
  std::map<std::array<int, 4>, StepGraph> graphs;

  void clear_graphs() {
    for (auto& [key, g] : graphs) cudaGraphExecDestroy(g.exec);
    graphs.clear();
  }
  int* gemv_counters = nullptr;  // i32 [kGemvMaxSplitTiles]: split-K GEMV tile counters, zero between launches
  int* gdn_conv_counters = nullptr;  // i32 [kGdnConvCounters]: cuda::GdnConv's, zero between launches

  void* alloc(size_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    allocations.push_back(p);
    return p;
  }
  void release(void* p) {
    auto it = std::find(allocations.begin(), allocations.end(), p);
    DS_ASSERT(it != allocations.end(), "release of memory this backend did not allocate");
    allocations.erase(it);
    CUDA_CHECK(cudaFree(p));
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

// A GEMV's outputs, one part each of outs act [T, rows_i] (at most kGemvMaxParts).
cuda::GemvOut gemv_out_of(std::span<const Tensor> outs, const char* what) {
  cuda::GemvOut o;
  for (size_t i = 0; i < outs.size(); ++i) {
    expect_bf16(outs[i], what);
    o.ptr[i] = B(outs[i]);
    o.rows[i] = static_cast<int>(outs[i].dim(1));
  }
  o.n_parts = static_cast<int>(outs.size());
  return o;
}

// A consumer's GemvNorm: the scale of the rows of an input K wide.
cuda::GemvNorm norm_scale_of(const RowScale& s, int K) {
  if (s.empty()) return {};
  expect_f32(s.ss, "a deferred norm's sums");
  cuda::GemvNorm n;
  n.ss = F(s.ss);
  n.eps = s.eps;
  n.inv_d = 1.f / static_cast<float>(K);
  n.parts = static_cast<int>(s.ss.dim(0));
  DS_ASSERT(n.parts <= cuda::kGemvNormMaxParts, "a deferred norm of %d parts", n.parts);
  return n;
}

// Whether linear_add_rms_norm may leave the division by the RMS to the linears (DS_DEFER_NORM).
bool defer_norms() {
  static const bool on = cuda::env_flag("DS_DEFER_NORM", true);
  return on;
}

// Where a kernel writes out's fp16 copy / 16 (f16, out's shape) for the linear that reads out: the
// buffer *half where `makes` (this launch makes one) and it has one; else null, and *half emptied
// so that the consumer reads out itself. half null: no copy asked for.
__half* half_copy_of(Tensor* half, Tensor out, bool makes, const char* what) {
  if (!half) return nullptr;
  if (!makes || !half->data) {
    *half = {};
    return nullptr;
  }
  DS_ASSERT(half->dtype == DType::kF16 && half->numel() == out.numel(), "%s: an fp16 copy %s for out%s", what,
            half->shape_str().c_str(), out.shape_str().c_str());
  return static_cast<__half*>(half->data);
}
}  // namespace

CudaOps::CudaOps(const CudaOpsOptions& options) : impl_(new Impl()), options_(options) {
  CUDA_CHECK(cudaSetDevice(options.device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&impl_->cublas));
  CUBLAS_CHECK(cublasSetStream(impl_->cublas, impl_->stream));
  // An explicit workspace: cuBLAS then allocates nothing while a step graph is being recorded.
  constexpr size_t kCublasWorkspace = size_t(32) << 20;
  impl_->cublas_workspace = impl_->alloc(kCublasWorkspace);
  CUBLAS_CHECK(cublasSetWorkspace(impl_->cublas, impl_->cublas_workspace, kCublasWorkspace));
  impl_->scratch = static_cast<char*>(impl_->alloc(options.scratch_bytes));
  impl_->gemv_counters = static_cast<int*>(impl_->alloc(cuda::kGemvMaxSplitTiles * sizeof(int)));
  CUDA_CHECK(cudaMemset(impl_->gemv_counters, 0, cuda::kGemvMaxSplitTiles * sizeof(int)));
  impl_->gdn_conv_counters = static_cast<int*>(impl_->alloc(cuda::kGdnConvCounters * sizeof(int)));
  CUDA_CHECK(cudaMemset(impl_->gdn_conv_counters, 0, cuda::kGdnConvCounters * sizeof(int)));
}

CudaOps::~CudaOps() {
  cudaStreamSynchronize(impl_->stream);
  impl_->clear_graphs();
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
  t.data = impl_->alloc(t.nbytes());
  weight_bytes_ += t.nbytes();
  if (host_dtype == want) {
    CUDA_CHECK(cudaMemcpy(t.data, host, t.nbytes(), cudaMemcpyHostToDevice));
    return t;
  }
  // Converted a piece at a time, so a vocabulary table (1.3 G values on the 27B) takes no
  // host copy of its own size.
  constexpr size_t kPiece = size_t(1) << 22;
  std::vector<float> f32(std::min(n, kPiece));
  std::vector<uint16_t> b(want == DType::kBF16 ? f32.size() : 0);
  const size_t host_elem = dtype_size(host_dtype), elem = dtype_size(want);
  for (size_t at = 0; at < n; at += kPiece) {
    const size_t m = std::min(kPiece, n - at);
    convert_to_f32(host_dtype, static_cast<const char*>(host) + at * host_elem, f32.data(), m);
    const void* src = f32.data();
    if (want == DType::kBF16) {
      for (size_t i = 0; i < m; ++i) b[i] = f32_to_bf16(f32[i]);
      src = b.data();
    }
    CUDA_CHECK(cudaMemcpy(static_cast<char*>(t.data) + at * elem, src, m * elem, cudaMemcpyHostToDevice));
  }
  return t;
}

Tensor CudaOps::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  DS_ASSERT(dtype == DType::kBF16 || dtype == DType::kF32 || dtype == DType::kI32 || dtype == DType::kI8,
            "CUDA tensors are BF16, F32, I32 or I8, not %s", dtype_name(dtype));
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
    DS_FATAL("step scratch of %zu bytes exhausted (asked %zu more); size CudaOpsOptions::scratch_bytes with "
             "step_scratch_bytes for the largest step",
             options_.scratch_bytes, bytes);
  t.data = impl_->scratch + scratch_used_;
  scratch_used_ += bytes;
  scratch_peak_ = std::max(scratch_peak_, scratch_used_);
  return t;
}

Tensor CudaOps::scratch_from_free(DType dtype, std::initializer_list<int64_t> shape) {
  const size_t peak = std::max(scratch_peak_, scratch_used_);
  Tensor t = scratch(dtype, shape);
  scratch_peak_ = peak;
  return t;
}

size_t CudaOps::device_bytes_used() const {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes - free_bytes;
}

void CudaOps::synchronize() { CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

void CudaOps::free_weight(Tensor t) {
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));  // queued kernels may still read it
  impl_->release(t.data);
  weight_bytes_ -= t.nbytes();
}

void CudaOps::prepare_weight(LinearWeight& w, WeightRole role) {
  if (w.quantized()) {
    if (w.format != WeightFormat::kW4A16) return;  // prepared already
    DS_ASSERT(w.packed.dtype == DType::kI32 && w.scales.dtype == DType::kF32, "W4A16 weight tensors");
    const int N = static_cast<int>(w.packed.dim(0)), K = static_cast<int>(w.packed.dim(1) * 8), group = w.group_size;
    if (!cuda::w4a16_tiled_supports(K, group)) {
      // Not a shape the GEMV tiles take (group < 64 or not a power of two): dequantised once, on the host.
      DS_LOG_WARN("cuda", "W4A16 group %d, K %d: stored dequantised as bf16", group, K);
      std::vector<uint32_t> packed(w.packed.numel());
      std::vector<float> scales(w.scales.numel()), dense(size_t(N) * K);
      CUDA_CHECK(cudaMemcpy(packed.data(), w.packed.data, w.packed.nbytes(), cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(scales.data(), w.scales.data, w.scales.nbytes(), cudaMemcpyDeviceToHost));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          dense[n * K + k] = float(int((packed[n * (K / 8) + k / 8] >> (4 * (k % 8))) & 15u) - 8) *
                             scales[n * (K / group) + k / group];
      free_weight(w.packed);
      free_weight(w.scales);
      const bool act_int8 = w.act_int8;
      w = LinearWeight{};
      w.dense = upload(dense.data(), DType::kF32, {N, K}, DType::kBF16);
      w.act_int8 = act_int8;  // read as the backend reads dense weights (Ops::act_int8_input)
      return;
    }
    // i32 [16-row blocks, words of a block], the scales inside (w4a16.cu)
    Tensor tiled = alloc(DType::kI32, {(N + 15) / 16, cuda::w4a16_tiled_block_words(K, group)});
    // A gate_up weight pairs its halves' rows in each block (linear_swiglu) where they fill whole blocks.
    const bool paired = role == WeightRole::kGateUp && N % 16 == 0;
    cuda::launch_w4a16_repack(static_cast<const uint32_t*>(w.packed.data), F(w.scales),
                              static_cast<uint32_t*>(tiled.data), N, K, group, paired, impl_->stream);
    free_weight(w.packed);
    free_weight(w.scales);
    w.packed = tiled;
    w.scales = Tensor{};
    w.format = WeightFormat::kW4A16Tiled;
    w.rows = N;
    w.paired = paired;
    return;
  }
  if (!is_vocab_role(role) || !keeps_int8_vocab(w.dense.dim(1))) return;
  expect_bf16(w.dense, "vocabulary table");
  const int64_t V = w.dense.dim(0);
  const int H = static_cast<int>(w.dense.dim(1));
  LinearWeight table = alloc_int8_rows(V, H);
  cuda::launch_int8_quantize_rows(B(w.dense), static_cast<int8_t*>(table.packed.data), F(table.scales), V, H,
                                  impl_->stream);
  free_weight(w.dense);
  w = table;
}

LinearWeight CudaOps::alloc_int8_rows(int64_t N, int64_t K) {
  LinearWeight w;
  const int64_t padded = cuda::int8_tiled_rows(N);
  w.packed = alloc(DType::kI8, {padded, K});
  w.scales = alloc(DType::kF32, {padded, K / 128});
  w.group_size = 128;
  w.format = WeightFormat::kInt8Tiled;
  w.rows = N;
  return w;
}

LinearWeight CudaOps::upload_int8_rows(const int8_t* q, const float* scales, int64_t N, int64_t K) {
  DS_ASSERT(keeps_int8_rows(K), "upload_int8_rows: K %lld is not whole groups of 128", (long long)K);
  LinearWeight w = alloc_int8_rows(N, K);
  cuda::upload_int8_tiled(q, scales, N, static_cast<int>(K), static_cast<int8_t*>(w.packed.data), F(w.scales));
  return w;
}

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
  // The attention kernels find a key's block by shifts (common.cuh's cache_row, block_row).
  DS_ASSERT(g.block_size >= 2 && (g.block_size & (g.block_size - 1)) == 0,
            "the CUDA backend takes KV blocks of a power of two tokens, at least 2 (block size %d)", g.block_size);
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
  // Decode and verify steps (every sequence the same 1..16 new tokens, one logit row per
  // sequence or per token) may run as recorded graphs. Their shape must not change with the
  // context length, so the block tables are padded to a power-of-two width and attention
  // splits the whole width.
  static const bool graphs_enabled = cuda::env_flag("DS_CUDA_GRAPHS", true);  // 0 turns step graphs off
  constexpr int kGraphMaxChunk = 16;
  bool uniform = plan.n_seqs() > 0 && max_chunk_ <= kGraphMaxChunk;
  for (int s = 0; uniform && s < plan.n_seqs(); ++s)
    uniform = plan.cu_seqlens[s + 1] - plan.cu_seqlens[s] == max_chunk_;
  graph_step_ = graphs_enabled && uniform && (plan.n_out() == plan.n_seqs() || plan.n_out() == plan.n_tokens());
  table_width_ = plan.max_blocks;
  std::vector<int32_t> padded;
  const std::vector<int32_t>* tables = &plan.block_tables;
  if (graph_step_) {
    table_width_ = 8;
    while (table_width_ < plan.max_blocks) table_width_ *= 2;
    padded.assign(size_t(plan.n_seqs()) * table_width_, -1);
    for (int s = 0; s < plan.n_seqs(); ++s)
      std::copy_n(plan.block_tables.begin() + size_t(s) * plan.max_blocks, plan.max_blocks,
                  padded.begin() + size_t(s) * table_width_);
    tables = &padded;
    max_ctx_ = table_width_ * geo_.block_size;
  }
  // One host buffer, one copy: [ids | positions | cu_seqlens | n_past | slots | tables | rows | seq_of_token]
  std::vector<int32_t> packed;
  std::vector<size_t> offsets;
  for (const std::vector<int32_t>* v : {&plan.token_ids, &plan.positions, &plan.cu_seqlens, &plan.n_past,
                                        &plan.state_slots, tables, &plan.logit_rows,
                                        static_cast<const std::vector<int32_t>*>(&seq_of_token)}) {
    offsets.push_back(packed.size());
    packed.insert(packed.end(), v->begin(), v->end());
  }
  if (packed.size() > impl_->plan_capacity) {
    CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
    impl_->clear_graphs();  // they read the old buffer
    if (impl_->plan_buf) CUDA_CHECK(cudaFree(impl_->plan_buf));
    impl_->plan_capacity = std::max<size_t>(packed.size() * 2, size_t(1) << 18);
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

std::vector<Tensor> CudaOps::run_step(const std::function<std::vector<Tensor>()>& record) {
  if (!graph_step_) return record();
  // Same shape, same plan-buffer offsets and same scratch layout: the recording reads this
  // step's plan arrays and writes the same scratch tensors.
  const std::array<int, 4> key{plan_.n_seqs(), max_chunk_, plan_.n_out(), table_width_};
  auto it = impl_->graphs.find(key);
  if (it == impl_->graphs.end() || it->second.scratch_begin != scratch_used_) {
    if (it != impl_->graphs.end()) {
      cudaGraphExecDestroy(it->second.exec);
      impl_->graphs.erase(it);
    }
    Impl::StepGraph g;
    g.scratch_begin = scratch_used_;
    CUDA_CHECK(cudaStreamBeginCapture(impl_->stream, cudaStreamCaptureModeThreadLocal));
    g.outputs = record();
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(impl_->stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    g.scratch_end = scratch_used_;
    it = impl_->graphs.emplace(key, std::move(g)).first;
  }
  CUDA_CHECK(cudaGraphLaunch(it->second.exec, impl_->stream));
  scratch_used_ = it->second.scratch_end;
  return it->second.outputs;
}

void CudaOps::embedding(const LinearWeight& table, Tensor out) {
  expect_bf16(out, "embedding out");
  if (table.quantized()) {
    DS_ASSERT(table.format == WeightFormat::kInt8Tiled, "quantized embedding tables are tiled int8 rows");
    cuda::launch_int8_embedding(static_cast<const int8_t*>(table.packed.data), F(table.scales), impl_->ids, B(out),
                                plan_.n_tokens(), static_cast<int>(table.packed.dim(1)), impl_->stream);
    return;
  }
  expect_bf16(table.dense, "embedding table");
  cuda::launch_embedding(B(table.dense), impl_->ids, B(out), plan_.n_tokens(), static_cast<int>(table.dense.dim(1)),
                         impl_->stream);
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
  if (cuda::small_gemv_supported(x.data, w.data, T, N, K)) {  // e.g. in_proj_a/b at decode: no split-K GEMM
    cuda::launch_small_gemv(B(x), B(w), cuda::GemvOut::whole(B(out), N), T, N, K, impl_->stream);
    return;
  }
  gemm(x.data, w.data, out.data, T, N, K, N);
}

void CudaOps::gemm(const void* x, const void* w, void* out, int T, int N, int K, int ldc) {
  // Row-major out [T, ldc] is column-major out^T [ldc, T]; its first N rows = W [N, K] . x^T.
  const float alpha = 1.f, beta = 0.f;
  CUBLAS_CHECK(cublasGemmEx(impl_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, w, CUDA_R_16BF, K, x, CUDA_R_16BF,
                            K, &beta, out, CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaOps::linear_quantized(Tensor x, const LinearWeight& w, Tensor out) {
  expect_bf16(x, "linear x");
  expect_bf16(out, "linear out");
  if (w.format == WeightFormat::kInt8Tiled) {
    DS_ASSERT(out.numel() == x.dim(0) * w.rows, "int8 linear shapes x%s (N %lld) out%s", x.shape_str().c_str(),
              static_cast<long long>(w.rows), out.shape_str().c_str());
    linear_int8(B(x), static_cast<int>(x.dim(0)), static_cast<int>(x.dim(1)), w,
                cuda::GemvOut::whole(B(out), static_cast<int>(w.rows)));
    return;
  }
  DS_ASSERT(w.format == WeightFormat::kW4A16Tiled, "W4A16 weights reach the CUDA linear through prepare_weight");
  DS_ASSERT(!w.paired, "a paired W4A16 weight (gate_up) is read through linear_parts or linear_swiglu");
  DS_ASSERT(out.numel() == x.dim(0) * w.rows, "W4A16 shapes x%s (N %lld) out%s", x.shape_str().c_str(),
            static_cast<long long>(w.rows), out.shape_str().c_str());
  linear_w4a16(B(x), static_cast<int>(x.dim(0)), static_cast<int>(x.dim(1)), w,
               cuda::GemvOut::whole(B(out), static_cast<int>(w.rows)), nullptr, cuda::GemvGate::kNone);
}

namespace {

// Steps of up to w4a16_gemv_step_tokens() tokens take the W4A16 GEMV in slices of up to
// w4a16_gemv_tokens() tokens (weights read once per slice); longer ones dequantise + cuBLAS,
// which moves about 9x the weight bytes but runs on tensor cores at full rate.
bool w4a16_takes_gemv(int T) { return cuda::w4a16_gemv_tokens() > 0 && T <= cuda::w4a16_gemv_step_tokens(); }

}  // namespace

void CudaOps::linear_parts(Tensor x, const LinearWeight& w, std::span<const Tensor> outs, bool after_same_input,
                           const RowScale& scale) {
  // Tiled W4A16 and int8 rows cannot be cut into row views: one GEMV writes every part. Small
  // dense weights (GDN b + a at decode) take one small-GEMV launch; other dense ones, and single
  // parts, the default (row views; a single part of any form through linear_weight).
  const int T = static_cast<int>(x.dim(0)), K = static_cast<int>(x.dim(1));
  const bool int8 = w.quantized() && w.format == WeightFormat::kInt8Tiled;
  const bool tiled = w.quantized() && w.format == WeightFormat::kW4A16Tiled;
  const bool small = !w.quantized() && cuda::small_gemv_supported(x.data, w.dense.data, T,
                                                                  static_cast<int>(w.dense.dim(0)), K);
  DS_ASSERT(!w.paired || (outs.size() == 2 && outs[0].dim(1) == outs[1].dim(1)),
            "a paired W4A16 weight (gate_up) is read as its two halves, not %zu parts", outs.size());
  if (outs.size() == 1 || outs.size() > size_t(cuda::kGemvMaxParts) || !(int8 || tiled || small)) {
    Ops::linear_parts(x, w, outs, after_same_input, scale);
    return;
  }
  check_parts(x, w, outs);
  expect_bf16(x, "linear_parts x");
  cuda::GemvOut o = gemv_out_of(outs, "linear_parts out");
  o.norm = norm_scale_of(scale, K);
  if (int8) {
    linear_int8(B(x), T, K, w, o);
  } else if (tiled && w.paired && w4a16_takes_gemv(T)) {
    linear_w4a16_paired_rows(B(x), T, K, w, o.ptr[0], o.ptr[1], false, scale);
  } else if (tiled) {
    linear_w4a16(B(x), T, K, w, o, nullptr, cuda::GemvGate::kNone, scale.twin, scale.half);
  } else {
    expect_bf16(w.dense, "linear_parts weight");
    cuda::launch_small_gemv(B(x), B(w.dense), o, T, static_cast<int>(w.dense.dim(0)), K, impl_->stream,
                            after_same_input);
  }
}

void CudaOps::gated_linear(Tensor a, Tensor b, GateAct act, const LinearWeight& w, Tensor out) {
  // A W4A16 GEMV whose launch stages its input in shared memory gates a SiLU-gated input there
  // (w4a16.cu); a sigmoid-gated one takes sigmoid_mul first (the default).
  const int T = static_cast<int>(a.dim(0)), K = static_cast<int>(a.dim(1));
  const bool fused = act == GateAct::kSiluMul && w.quantized() && w.format == WeightFormat::kW4A16Tiled &&
                     cuda::w4a16_gemv_gates_input(T, static_cast<int>(w.rows), K, w.group_size);
  if (!fused) {
    Ops::gated_linear(a, b, act, w, out);
    return;
  }
  expect_bf16(a, "gated_linear a");
  expect_bf16(b, "gated_linear b");
  expect_bf16(out, "gated_linear out");
  DS_ASSERT(b.numel() == a.numel() && out.numel() == int64_t(T) * w.rows, "gated_linear shapes a%s b%s out%s (N %lld)",
            a.shape_str().c_str(), b.shape_str().c_str(), out.shape_str().c_str(), static_cast<long long>(w.rows));
  linear_w4a16(B(a), T, K, w, cuda::GemvOut::whole(B(out), static_cast<int>(w.rows)), B(b), cuda::GemvGate::kSiluMul);
}

void CudaOps::linear_swiglu(Tensor x, const LinearWeight& w, Tensor gate, Tensor up, Tensor out,
                            const RowScale& scale, Tensor* half) {
  // A paired weight's GEMV computes silu(gate) * up in its epilogue where its launches take one
  // token tile (w4a16_gemv_writes_swiglu) and it can scale its sums there too, else writes its
  // rows for one kernel to take the product; the cuBLAS path of long inputs and other weights take
  // the default (gate and up, then silu_mul).
  const int T = static_cast<int>(x.dim(0)), K = static_cast<int>(x.dim(1));
  if (!(w.quantized() && w.format == WeightFormat::kW4A16Tiled && w.paired && w4a16_takes_gemv(T))) {
    Ops::linear_swiglu(x, w, gate, up, out, scale, half);
    return;
  }
  expect_bf16(x, "linear_swiglu x");
  expect_bf16(out, "linear_swiglu out");
  const int N = static_cast<int>(w.rows);
  DS_ASSERT(out.ndim == 2 && out.dim(0) == T && out.dim(1) == N / 2, "linear_swiglu: out %s for x%s and %d rows",
            out.shape_str().c_str(), x.shape_str().c_str(), N);
  if (cuda::w4a16_gemv_writes_swiglu(std::min(T, cuda::w4a16_gemv_tokens())) &&  // the largest launch
      (scale.empty() || cuda::w4a16_gemv_scales_output(T))) {
    cuda::GemvOut o = cuda::GemvOut::swiglu_of(B(out), N);
    o.norm = norm_scale_of(scale, K);
    o.f16 = half_copy_of(half, out, makes_half_copy(T, N / 2), "linear_swiglu");
    linear_w4a16(B(x), T, K, w, o, nullptr, cuda::GemvGate::kNone, scale.twin, scale.half);
    return;
  }
  half_copy_of(half, out, false, "linear_swiglu");  // the paired rows' kernel makes none
  linear_w4a16_paired_rows(B(x), T, K, w, B(out), nullptr, true, scale);
}

void CudaOps::linear_w4a16_paired_rows(const void* x, int T, int K, const LinearWeight& w, void* a, void* b,
                                       bool swiglu, const RowScale& scale) {
  const size_t mark = scratch_mark();
  Tensor rows = scratch(DType::kBF16, {T, w.rows});  // bf16 [T, N] in the paired row order
  cuda::GemvOut o = cuda::GemvOut::whole(B(rows), static_cast<int>(w.rows));
  o.norm = norm_scale_of(scale, K);
  linear_w4a16(x, T, K, w, o, nullptr, cuda::GemvGate::kNone, scale.twin, scale.half);
  cuda::launch_paired_rows(B(rows), static_cast<bf16*>(a), static_cast<bf16*>(b), T, static_cast<int>(w.rows / 2),
                           swiglu, impl_->stream);
  scratch_release(mark);
}

void CudaOps::linear_w4a16(const void* x_bf16, int T, int K, const LinearWeight& w, const cuda::GemvOut& out,
                           const void* xb, cuda::GemvGate gate, const Int8Twin& twin, const Tensor& half) {
  const auto* x = static_cast<const bf16*>(x_bf16);
  const int N = static_cast<int>(w.rows);
  DS_ASSERT(w.packed.dim(1) == cuda::w4a16_tiled_block_words(K, w.group_size), "W4A16 shapes: K %d, tiled%s", K,
            w.packed.shape_str().c_str());
  if (T == 0) return;
  const auto* tiled = static_cast<const uint32_t*>(w.packed.data);
  // A consumer's scale the GEMV cannot apply in its epilogue: scale_rows after it.
  const bool scale_after = out.norm.ss && !out.norm.x && !(w4a16_takes_gemv(T) && cuda::w4a16_gemv_scales_output(T));
  DS_ASSERT(!scale_after || !out.swiglu, "W4A16 GEMV: a swiglu output at %d tokens with a norm scale", T);
  DS_ASSERT(!out.norm.x || T <= cuda::w4a16_gemv_tokens(), "W4A16 GEMV: a norm output in one launch, not %d tokens", T);
  const size_t mark = scratch_mark();
  if (w4a16_takes_gemv(T)) {
    const int per_launch = cuda::w4a16_gemv_tokens();
    for (int t0 = 0; t0 < T; t0 += per_launch) {
      const int n = std::min(per_launch, T - t0);
      const int splits = cuda::w4a16_gemv_splits(n, N, K);
      scratch_release(mark);  // the slice before's partials (the launches run in stream order)
      float* partial = splits > 1 ? F(scratch(DType::kF32, {splits, n, N})) : nullptr;
      cuda::GemvOut o = out.from_token(t0);
      if (scale_after) o.norm = {};
      const bf16* xb_t = xb ? static_cast<const bf16*>(xb) + int64_t(t0) * K : nullptr;
      // W4A8: the producer's int8 twin of the whole input where there is one, else rounded by the launch.
      cuda::GemvInt8In a8;
      if (w.act_int8 && !twin.empty() && n == T && gate == cuda::GemvGate::kNone &&
          cuda::w4a16_gemv_takes_a8(n, N, K, w.group_size, false, true)) {
        DS_ASSERT(twin.q.numel() == int64_t(T) * K && twin.scale.numel() == int64_t(T) * (K / 64),
                  "an int8 twin %s / %s for x [%d, %d]", twin.q.shape_str().c_str(), twin.scale.shape_str().c_str(), T,
                  K);
        a8 = {true, static_cast<const int8_t*>(twin.q.data), F(twin.scale)};
      } else if (w.act_int8) {
        a8.on = cuda::w4a16_gemv_takes_a8(n, N, K, w.group_size, gate != cuda::GemvGate::kNone);
      }
      // F16: the producer's fp16 copy of the whole input where there is one.
      const __half* x_f16 = nullptr;
      if (half.data && n == T && gate == cuda::GemvGate::kNone && !a8.on && cuda::w4a16_gemv_reads_f16_copy(n)) {
        DS_ASSERT(half.dtype == DType::kF16 && half.numel() == int64_t(T) * K, "an fp16 copy %s for x [%d, %d]",
                  half.shape_str().c_str(), T, K);
        x_f16 = static_cast<const __half*>(half.data);
      }
      cuda::launch_w4a16_gemv(x + int64_t(t0) * K, tiled, o, partial, impl_->gemv_counters, splits, n, N, K,
                              w.group_size, impl_->stream, xb_t, gate, a8, x_f16);
    }
  } else {
    // Blocks of rows (a fused gate_up of the 27B is 357 MB dequantised) to bf16 for cuBLAS; each
    // block's rows go to the parts they belong to (a paired weight's block of n rows: n / 2 rows of
    // each half, dequantised as the two halves).
    DS_ASSERT(!out.swiglu && (!w.paired || (out.n_parts == 2 && out.rows[0] == out.rows[1])),
              "the cuBLAS path of a paired W4A16 weight writes its two halves");
    const int rows = dequant_block_rows(N, K);
    Tensor dense = scratch_from_free(DType::kBF16, {rows, K});
    const int64_t block_words = w.packed.dim(1);  // rows is a multiple of 16
    for (int r0 = 0; r0 < N; r0 += rows) {
      const int n = std::min(rows, N - r0);
      cuda::launch_w4a16_dequant(tiled + r0 / 16 * block_words, B(dense), n, K, w.group_size, w.paired,
                                 impl_->stream);
      if (w.paired) {
        for (int p = 0; p < 2; ++p)
          gemm(x, B(dense) + int64_t(p) * (n / 2) * K, out.ptr[p] + r0 / 2, T, n / 2, K, out.rows[p]);
        continue;
      }
      gemm_rows(x, B(dense), r0, n, T, K, out);
    }
  }
  if (scale_after) scale_parts(out, T, K);
  scratch_release(mark);
}

void CudaOps::gemm_rows(const void* x, const void* dense_bf16, int r0, int n, int T, int K,
                        const cuda::GemvOut& out) {
  const auto* dense = static_cast<const bf16*>(dense_bf16);
  for (int p = 0, row0 = 0; p < out.n_parts; row0 += out.rows[p], ++p) {
    const int lo = std::max(r0, row0), hi = std::min(r0 + n, row0 + out.rows[p]);  // the part's rows here
    if (lo < hi) gemm(x, dense + int64_t(lo - r0) * K, out.ptr[p] + (lo - row0), T, hi - lo, K, out.rows[p]);
  }
}

void CudaOps::scale_parts(const cuda::GemvOut& out, int T, int K) {
  for (int p = 0; p < out.n_parts; ++p)
    cuda::launch_scale_rows(out.ptr[p], out.norm.ss, T, out.rows[p], out.norm.parts, K, out.norm.eps, impl_->stream);
}

int CudaOps::dequant_block_rows(int N, int K) const {
  const size_t free_bytes = options_.scratch_bytes - scratch_used_;
  const int64_t fit = static_cast<int64_t>(free_bytes / 4 / (size_t(K) * 2)) / 128 * 128;
  return static_cast<int>(std::min<int64_t>(N, std::max<int64_t>(128, fit)));
}

void CudaOps::linear_int8(const void* x_bf16, int T, int K, const LinearWeight& w, const cuda::GemvOut& out) {
  const auto* x = static_cast<const bf16*>(x_bf16);
  const int N = static_cast<int>(w.rows);
  DS_ASSERT(w.packed.dim(1) == K, "int8 linear shapes: K %d, q%s", K, w.packed.shape_str().c_str());
  DS_ASSERT(!out.swiglu && !out.norm.x && !out.f16, "the int8 GEMV writes plain parts, scaled after where asked");
  if (T == 0) return;
  const auto* q = static_cast<const int8_t*>(w.packed.data);
  const size_t mark = scratch_mark();
  cuda::GemvOut o = out;
  o.norm = {};  // a consumer's scale: scale_parts after
  if (T <= cuda::kInt8GemvMaxTokens) {
    const int splits = cuda::int8_gemv_splits(T, N, K);
    const int64_t floats = cuda::int8_gemv_partial_floats(T, N, K);
    float* partial = floats > 0 ? F(scratch(DType::kF32, {floats})) : nullptr;
    cuda::launch_int8_gemv(x, q, F(w.scales), o, partial, floats, impl_->gemv_counters, splits, T, N, K,
                           impl_->stream);
  } else {
    // Blocks of rows dequantised to bf16 (within a quarter of the free scratch) for cuBLAS.
    const int block = dequant_block_rows(N, K);
    Tensor dense = scratch_from_free(DType::kBF16, {block, K});
    for (int r0 = 0; r0 < N; r0 += block) {
      const int n = std::min(block, N - r0);
      cuda::launch_int8_dequant_rows(q, F(w.scales), B(dense), r0, n, K, impl_->stream);
      gemm_rows(x, B(dense), r0, n, T, K, o);
    }
  }
  if (out.norm.ss) scale_parts(out, T, K);
  scratch_release(mark);
}

void CudaOps::add(Tensor x, Tensor y) {
  DS_ASSERT(x.numel() == y.numel(), "add shapes");
  cuda::launch_add(B(x), B(y), x.numel(), impl_->stream);
}

void CudaOps::add_rms_norm(Tensor x, Tensor y, Tensor w, float eps, Tensor out) {
  expect_f32(w, "add_rms_norm weight");
  DS_ASSERT(x.numel() == y.numel() && x.numel() == out.numel(), "add_rms_norm shapes");
  const int D = static_cast<int>(w.numel());
  if (!cuda::launch_add_rms_norm(B(x), B(y), F(w), B(out), static_cast<int>(x.numel() / D), D, eps, impl_->stream))
    Ops::add_rms_norm(x, y, w, eps, out);  // two passes
}

void CudaOps::scale_rows(Tensor out, const RowScale& s, int64_t D) {
  expect_bf16(out, "scale_rows out");
  expect_f32(s.ss, "scale_rows sums");
  const int T = static_cast<int>(out.dim(0));
  DS_ASSERT(s.ss.ndim == 2 && s.ss.dim(1) == T, "scale_rows: sums %s for %d rows", s.ss.shape_str().c_str(), T);
  cuda::launch_scale_rows(B(out), F(s.ss), T, static_cast<int>(out.numel() / std::max(T, 1)),
                          static_cast<int>(s.ss.dim(0)), static_cast<int>(D), s.eps, impl_->stream);
}

int64_t CudaOps::norm_parts(int64_t D) const { return (D + cuda::kGemvTileRows - 1) / cuda::kGemvTileRows; }

bool CudaOps::makes_int8_twin(int64_t T, int64_t D) const {
  return defer_norms() && T >= 1 && T <= 8 && T <= cuda::w4a16_gemv_tokens() && D % 64 == 0 && cuda::w4a16_gemv_tma();
}

bool CudaOps::makes_half_copy(int64_t T, int64_t D) const {
  return defer_norms() && cuda::w4a16_gemv_reads_f16_copy(static_cast<int>(T)) && D % 4 == 0;
}

void CudaOps::linear_add_rms_norm(Tensor a, const Tensor* b, GateAct act, const LinearWeight& w, Tensor x,
                                  Tensor norm_w, float eps, Tensor ss, NormedAct& out, Int8Twin twin, Tensor half,
                                  Tensor a_half) {
  const int T = static_cast<int>(x.dim(0)), D = static_cast<int>(x.dim(1)), K = static_cast<int>(a.dim(1));
  const bool fused = defer_norms() && ss.data && norm_parts(D) <= cuda::kGemvNormMaxParts && w.quantized() &&
                     w.format == WeightFormat::kW4A16Tiled && !w.paired && w.rows == D && w4a16_takes_gemv(T) &&
                     cuda::w4a16_gemv_norms_output(T, D, K, w.group_size, false);
  if (!fused) {
    Ops::linear_add_rms_norm(a, b, act, w, x, norm_w, eps, ss, out);
    return;
  }
  if (!makes_int8_twin(T, D)) twin = {};
  if (!makes_half_copy(T, D)) half = {};
  DS_ASSERT(!half.data || (half.dtype == DType::kF16 && half.numel() == int64_t(T) * D),
            "linear_add_rms_norm: an fp16 copy %s for out [%d, %d]", half.shape_str().c_str(), T, D);
  DS_ASSERT(twin.empty() || (twin.q.dtype == DType::kI8 && twin.q.numel() == int64_t(T) * D &&
                             twin.scale.dtype == DType::kF32 && twin.scale.numel() == int64_t(T) * (D / 64)),
            "linear_add_rms_norm: an int8 twin %s / %s for out [%d, %d]", twin.q.shape_str().c_str(),
            twin.scale.shape_str().c_str(), T, D);
  expect_bf16(a, "linear_add_rms_norm input");
  expect_bf16(x, "linear_add_rms_norm x");
  expect_bf16(out.h, "linear_add_rms_norm out");
  expect_f32(norm_w, "linear_add_rms_norm norm weight");
  expect_f32(ss, "linear_add_rms_norm sums");
  DS_ASSERT(out.h.numel() == int64_t(T) * D && norm_w.numel() == D && ss.ndim == 2 && ss.dim(0) == norm_parts(D) &&
                ss.dim(1) == T && (!b || b->numel() == a.numel()),
            "linear_add_rms_norm shapes: x%s out%s norm%s sums%s", x.shape_str().c_str(), out.h.shape_str().c_str(),
            norm_w.shape_str().c_str(), ss.shape_str().c_str());
  // A gated input (the ops contract's; the model's gated attention gates its own output): a
  // SiLU-gated one gated while the GEMV stages it where it can, else (and a sigmoid-gated one) by
  // its own kernel first, as gated_linear's default (at 5-8 tokens two inputs do not fit beside
  // the rings).
  Tensor in = a;
  const bf16* xb = nullptr;
  cuda::GemvGate gate = cuda::GemvGate::kNone;
  if (b && act == GateAct::kSiluMul && cuda::w4a16_gemv_norms_output(T, D, K, w.group_size, true)) {
    xb = B(*b);
    gate = cuda::GemvGate::kSiluMul;
  } else if (b) {
    in = gated_input(a, *b, act);
  }
  cuda::GemvOut o = cuda::GemvOut::whole(B(out.h), D);
  o.norm.x = B(x);
  o.norm.w = F(norm_w);
  o.norm.ss = F(ss);
  if (!twin.empty()) {
    o.norm.q8 = static_cast<int8_t*>(twin.q.data);
    o.norm.q8_scale = F(twin.scale);
  }
  if (half.data) o.f16 = static_cast<__half*>(half.data);
  // a's fp16 copy, where the input is a as it is.
  linear_w4a16(B(in), T, K, w, o, xb, gate, {}, b ? Tensor{} : a_half);
  out.scale = {ss, eps, twin, half};
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

void CudaOps::attention_prep(Tensor p, Tensor k, Tensor q_norm, Tensor k_norm, float eps, int rotary_dim, double theta,
                             Tensor q, Tensor gate) {
  const int T = static_cast<int>(q.dim(0)), nH = static_cast<int>(q.dim(1)), hd = static_cast<int>(q.dim(2));
  const int nKV = static_cast<int>(k.dim(1));
  if (!cuda::attention_prep_supported(hd, rotary_dim)) {
    Ops::attention_prep(p, k, q_norm, k_norm, eps, rotary_dim, theta, q, gate);
    return;
  }
  expect_bf16(p, "attention prep p");
  expect_f32(q_norm, "q_norm");
  expect_f32(k_norm, "k_norm");
  DS_ASSERT(p.numel() == int64_t(T) * nH * 2 * hd && k.numel() == int64_t(T) * nKV * hd && gate.numel() == q.numel(),
            "attention prep shapes p%s k%s q%s gate%s", p.shape_str().c_str(), k.shape_str().c_str(),
            q.shape_str().c_str(), gate.shape_str().c_str());
  cuda::launch_attention_prep(B(p), B(k), F(q_norm), F(k_norm), B(q), B(gate), impl_->positions, T, nH, nKV, hd,
                              rotary_dim, static_cast<float>(theta), eps, impl_->stream);
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
  cuda::launch_conv1d_silu(B(mixed), F(w), static_cast<bf16*>(conv_state(layer)), B(out), impl_->seq_of_token,
                           impl_->cu_seqlens, impl_->n_past, impl_->slots, plan_.n_tokens(), plan_.n_seqs(), C, K,
                           max_chunk_, impl_->stream);
}

void* CudaOps::conv_state(int layer) {
  DS_ASSERT(layer >= 0 && layer < geo_.n_state_layers, "state layer %d", layer);
  return impl_->conv_states + size_t(layer) * geo_.n_slots * geo_.conv_rows * geo_.conv_dim;
}

void* CudaOps::gdn_state(const GdnShape& sh, int layer) {
  DS_ASSERT(layer >= 0 && layer < geo_.n_state_layers, "state layer %d", layer);
  DS_ASSERT(sh.n_v_heads == geo_.n_v_heads && sh.k_head_dim == geo_.k_head_dim && sh.v_head_dim == geo_.v_head_dim,
            "GDN geometry");
  const size_t per_layer = size_t(geo_.n_slots) * sh.n_v_heads * sh.k_head_dim * sh.v_head_dim;
  return static_cast<char*>(impl_->rec_states) + layer * per_layer * state_elem_size(options_.state_dtype);
}

void CudaOps::gated_delta_rule(Tensor qkv, Tensor g, Tensor beta, const GdnShape& sh, int layer, Tensor out) {
  void* state = gdn_state(sh, layer);
  // Prefill-sized steps take the chunked tensor-core kernel (every sequence of the step, short
  // ones included); decode and verify steps keep the token-by-token one.
  constexpr int kChunkedMinTokens = 32;
  if (max_chunk_ >= kChunkedMinTokens && cuda::gdn_chunked_supported(sh.k_head_dim, sh.v_head_dim)) {
    const int T = static_cast<int>(qkv.dim(0));
    const size_t mark = scratch_mark();
    const size_t bytes = cuda::gdn_chunked_scratch_bytes(T, sh.n_k_heads, sh.n_v_heads);
    Tensor work = scratch(DType::kF32, {static_cast<int64_t>(bytes / sizeof(float))});
    cuda::launch_gdn_chunked(B(qkv), F(g), F(beta), state, state_code(options_.state_dtype), B(out), impl_->cu_seqlens,
                             impl_->n_past, impl_->slots, plan_.n_seqs(), T, max_chunk_, sh.n_k_heads, sh.n_v_heads,
                             sh.k_head_dim, sh.v_head_dim, work.data, impl_->stream);
    scratch_release(mark);  // stream order: later work reuses it only after these kernels
    return;
  }
  cuda::launch_gdn_recurrent(B(qkv), cuda::GdnGates{F(g), F(beta)}, state, state_code(options_.state_dtype), B(out),
                             impl_->cu_seqlens, impl_->n_past, impl_->slots, plan_.n_seqs(), sh.n_k_heads,
                             sh.n_v_heads, sh.k_head_dim, sh.v_head_dim,
                             /*short_chunks=*/max_chunk_ <= cuda::kGdnDecodeMaxTokens, impl_->stream);
}

void CudaOps::gdn_gates_delta_rule(Tensor qkv, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, const GdnShape& sh,
                                   int layer, Tensor out) {
  if (max_chunk_ > cuda::kGdnDecodeMaxTokens || !cuda::gdn_decode_supported(sh.k_head_dim)) {
    Ops::gdn_gates_delta_rule(qkv, a, b, a_log, dt_bias, sh, layer, out);  // a gates launch, then the rule
    return;
  }
  gdn_decode(qkv, a, b, a_log, dt_bias, sh, layer, out, cuda::GdnNorm{}, cuda::GdnConv{});
}

// The most sequences whose GDN heads (48 in the 27B) the decode kernel of a CTA a head runs in 4
// parts of a column's rows: 512 threads, one CTA an SM, so 96 CTAs at most keep one wave.
constexpr int kGdnFewSeqs = 2;

void CudaOps::gdn_gates_delta_rule_norm(Tensor qkv, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias,
                                        const GdnShape& sh, int layer, Tensor z, Tensor norm_w, float eps,
                                        bool sigmoid_gate, Tensor out, Tensor* half) {
  // The norm in the decode kernel of a CTA a head at decode steps (a token a sequence) of up to
  // kGdnNormMaxSeqs sequences; else the two ops. On the H200 (27B shape, docs/perf/
  // 2026-12-02-s18-cuda-27b.md): C1 6.01-6.05 against 6.10-6.12 ms, C4 6.44-6.47 against
  // 6.82-6.84, C8 7.31-7.32 against 7.43-7.45, C16 10.57-10.59 against 10.64-10.67; with the norm
  // at more sequences C64 24.60-24.78 against 24.13-24.19 (its extra time a CTA, paid once a wave);
  // with the norm at a verify step of 8 tokens 7.06-7.13 against 6.88-6.93 (the kernel of a CTA a
  // head against the register-state tiles); in clusters of those tiles, no gain at C1. Verify
  // steps of up to kGdnFewSeqs sequences take it with 4 parts of a column's rows
  // (gdn_verify_head). Decode steps that take the one-token kernel (gdn_head_parts) take the norm
  // in it at any count of sequences: on the H200 (1k context, three rounds, docs/perf/
  // 2026-12-04-s43-cuda-27b.md) C32 14.26-14.28 against 14.39-14.42 ms, C64 22.90 against
  // 23.01-23.07, fewer sequences unchanged.
  constexpr int kGdnNormMaxSeqs = 16;
  const int head_parts = gdn_head_parts(sh);
  const bool in_kernel = max_chunk_ == 1 ? head_parts == cuda::kGdnOneToken || plan_.n_seqs() <= kGdnNormMaxSeqs
                                         : head_parts == cuda::kGdnVerifyMma || gdn_verify_head();
  if (!in_kernel ||
      !cuda::gdn_decode_norm_supported(sh.k_head_dim, sh.v_head_dim, state_code(options_.state_dtype))) {
    Ops::gdn_gates_delta_rule_norm(qkv, a, b, a_log, dt_bias, sh, layer, z, norm_w, eps, sigmoid_gate, out, half);
    return;
  }
  gdn_decode(qkv, a, b, a_log, dt_bias, sh, layer, out, gdn_norm(z, norm_w, sh, eps, sigmoid_gate, out, half),
             cuda::GdnConv{});
}

cuda::GdnNorm CudaOps::gdn_norm(Tensor z, Tensor norm_w, const GdnShape& sh, float eps, bool sigmoid_gate, Tensor out,
                                Tensor* half) const {
  expect_bf16(z, "gdn norm z");
  expect_f32(norm_w, "gdn norm weight");
  DS_ASSERT(norm_w.numel() == sh.v_head_dim, "gdn norm weight: %lld values for head dim %d",
            static_cast<long long>(norm_w.numel()), sh.v_head_dim);
  cuda::GdnNorm norm;
  norm.z = B(z);
  norm.w = F(norm_w);
  norm.eps = eps;
  norm.sigmoid_gate = sigmoid_gate;
  if (!half) return norm;
  const int64_t T = out.dim(0);
  norm.f16 = half_copy_of(half, out,
                          T > 0 && cuda::gdn_norm_copies(gdn_head_parts(sh)) && makes_half_copy(T, out.numel() / T),
                          "gdn norm");
  return norm;
}

bool CudaOps::gdn_takes_conv(const GdnShape& sh, int conv_width) const {
  // H200, 27B shape, three rounds against DS_GDN_CONV=0 (docs/perf/2026-12-04-s46-cuda-27b.md): C1
  // at 1k 4.989-5.001 against 5.017-5.031 ms, C1 at 4k 5.054-5.066 against 5.074-5.103, C4
  // 5.614-5.617 against 5.685-5.713, C2 even; C8 (two waves of CTAs) lost before gdn_conv_fits.
  return max_chunk_ == 1 && cuda::gdn_conv_fused() && conv_width <= cuda::kGdnConvMaxK &&
         gdn_head_parts(sh) == cuda::kGdnOneToken &&
         cuda::gdn_decode_norm_supported(sh.k_head_dim, sh.v_head_dim, state_code(options_.state_dtype)) &&
         int64_t(plan_.n_seqs()) * sh.n_k_heads <= cuda::kGdnConvCounters &&
         cuda::gdn_conv_fits(plan_.n_seqs(), sh.n_v_heads);
}

void CudaOps::conv_gdn_norm(Tensor mixed, Tensor conv_w, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias,
                            const GdnShape& sh, int layer, Tensor z, Tensor norm_w, float eps, bool sigmoid_gate,
                            Tensor out, Tensor* half) {
  // Decode steps: the one-token kernel convolves its inputs itself (cuda::GdnConv), so the conv's
  // launch and the kernel boundary after it go.
  const int C = static_cast<int>(mixed.dim(1)), K = static_cast<int>(conv_w.dim(1));
  if (!gdn_takes_conv(sh, K)) {
    Ops::conv_gdn_norm(mixed, conv_w, a, b, a_log, dt_bias, sh, layer, z, norm_w, eps, sigmoid_gate, out, half);
    return;
  }
  expect_bf16(mixed, "gdn mixed");
  expect_f32(conv_w, "conv1d weight");
  DS_ASSERT(C == geo_.conv_dim && K - 1 == geo_.conv_rows &&
                C == 2 * sh.n_k_heads * sh.k_head_dim + sh.n_v_heads * sh.v_head_dim,
            "conv geometry: %d channels, width %d", C, K);
  cuda::GdnConv conv;
  conv.w = F(conv_w);
  conv.state = static_cast<bf16*>(conv_state(layer));
  conv.counters = impl_->gdn_conv_counters;
  conv.K = K;
  gdn_decode(mixed, a, b, a_log, dt_bias, sh, layer, out, gdn_norm(z, norm_w, sh, eps, sigmoid_gate, out, half),
             conv);
}

void CudaOps::gdn_decode(Tensor qkv, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, const GdnShape& sh, int layer,
                         Tensor out, const cuda::GdnNorm& norm, const cuda::GdnConv& conv) {
  expect_bf16(a, "gdn a");
  expect_bf16(b, "gdn b");
  void* state = gdn_state(sh, layer);
  cuda::GdnGates gates;
  gates.a = B(a);
  gates.b = B(b);
  gates.a_log = F(a_log);
  gates.dt_bias = F(dt_bias);
  cuda::launch_gdn_recurrent(B(qkv), gates, state, state_code(options_.state_dtype), B(out), impl_->cu_seqlens,
                             impl_->n_past, impl_->slots, plan_.n_seqs(), sh.n_k_heads, sh.n_v_heads, sh.k_head_dim,
                             sh.v_head_dim, /*short_chunks=*/true, impl_->stream, norm,
                             gdn_head_parts(sh), conv);
}

int CudaOps::gdn_head_parts(const GdnShape& sh) const {
  // Decode steps take the kernel of a CTA of 256 threads a head with its state in registers and no
  // barrier a token (cuda::kGdnOneToken). On the H200 (27B shape, 1k context, three rounds, docs/
  // perf/2026-12-04-s43-cuda-27b.md): the kernel 5.98 against 6.49 us a launch at C1 in place;
  // C1 5.158-5.166 against 5.195-5.224 ms, C8 6.368-6.386 against 6.474-6.502, C16
  // 10.015-10.031 against 10.226-10.254; C64 even. Otherwise (DS_GDN_TOKEN=0, or head dims it
  // lacks):
  // 4 parts of 32 rows at decode steps of up to kGdnFewSeqs sequences, whose CTAs have an SM each
  // with 2 parts too: a thread's rows and chains of dependent sums are half as long. On the H200
  // (27B shape, three interleaved rounds in each of two calls, docs/perf/
  // 2026-12-03-s30-cuda-27b.md): the kernel 7.05 -> 6.41 us a launch at C1; C1 at 1k
  // 5.49-5.52 against 5.53-5.58 ms, verify 1 at 4k 5.53-5.58 against 5.57-5.60; C2 even (5.68-5.72
  // both). Verify steps: gdn_verify_head.
  // Verify steps of kGdnPairMinTokens or more tokens whose CTA pairs fit one wave take a CTA pair a
  // head: its two SMs run half a head's token loop each. H200, 27B shape at 4k (docs/perf/
  // 2026-12-03-s35-cuda-27b.md): the kernel 8.80 against 10.50 us a launch at verify 8, verify 8
  // 6.396-6.437 against 6.460-6.482 ms, verify 4 5.900-5.922 against 5.913-5.921, but verify 2
  // 5.662-5.673 against 5.643-5.662; at decode steps even at one sequence (C1 5.289-5.293 against
  // 5.274-5.293) and slower at two, whose pairs take two waves (C2 5.84 against 5.56).
  // Verify steps whose heads the tensor-core kernel takes (dk = dv = 128, an fp16 state) take it
  // (cuda::kGdnVerifyMma): a step's tokens at once, no barrier a token. H200, 27B shape at 4k,
  // three rounds against DS_GDN_MMA=0 (docs/perf/2026-12-04-s46-cuda-27b.md): the kernel 6.54
  // against 8.85 us a launch in place at verify 8 (the CTA pair); verify 8 6.047-6.067 against
  // 6.190-6.199 ms, verify 16 9.508-9.517 against 9.813-9.835, verify 4 5.579-5.609 against
  // 5.649-5.658, verify 2 even (5.323-5.337 against 5.312-5.333).
  constexpr int kGdnPairMinTokens = 4;
  if (max_chunk_ == 1 && cuda::gdn_decode_token() && cuda::gdn_decode_token_supported(sh.k_head_dim, sh.v_head_dim))
    return cuda::kGdnOneToken;
  if (max_chunk_ > 1 && max_chunk_ <= cuda::kGdnDecodeMaxTokens && cuda::gdn_verify_mma() &&
      cuda::gdn_verify_mma_supported(sh.k_head_dim, sh.v_head_dim, state_code(options_.state_dtype)))
    return cuda::kGdnVerifyMma;
  if (max_chunk_ >= kGdnPairMinTokens && gdn_verify_head() &&
      cuda::gdn_decode_pair_fits(plan_.n_seqs(), sh.n_v_heads))
    return cuda::kGdnHeadPair;
  const bool few = max_chunk_ == 1 ? plan_.n_seqs() <= kGdnFewSeqs : gdn_verify_head();
  return few ? cuda::kGdnHeadFewSeqsParts : cuda::kGdnHeadParts;
}

bool CudaOps::gdn_verify_head() const {
  // 4 parts of 32 rows, at most kGdnFewSeqs sequences. On the H200 (27B shape, 4k context, three
  // rounds: docs/perf/2026-12-02-s22-cuda-27b.md, run 8): verify 2 6.23-6.26 against 6.33-6.34 ms
  // with the tiles and the norm launch, verify 4 6.47-6.50 against 6.53-6.56, verify 8 6.99-7.01
  // against 7.03-7.04;
  // with blocks of 16 tokens it lost (run 7: 10.15-10.21 against 10.10-10.12), so up to
  // kGdnVerifyHeadMaxTokens tokens a sequence.
  constexpr int kGdnVerifyHeadMaxTokens = 8;
  static const bool enabled = cuda::env_flag("DS_GDN_VERIFY_HEAD", true);
  return enabled && max_chunk_ > 1 && max_chunk_ <= kGdnVerifyHeadMaxTokens &&
         plan_.n_seqs() <= kGdnFewSeqs;
}

void CudaOps::attention(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor out) {
  attend(q, k, v, kv_layer, scale, out, nullptr, nullptr);
}

void CudaOps::gated_attention(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor gate, Tensor out,
                              Tensor* half) {
  expect_bf16(gate, "gated_attention gate");
  DS_ASSERT(gate.numel() == out.numel(), "gated_attention: gate%s for out%s", gate.shape_str().c_str(),
            out.shape_str().c_str());
  if (attend(q, k, v, kv_layer, scale, out, &gate, half)) return;
  half_copy_of(half, out, false, "gated_attention");
  sigmoid_mul(out, gate);
}

bool CudaOps::attend(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor out, const Tensor* gate,
                     Tensor* half) {
  const int T = static_cast<int>(q.dim(0)), nH = static_cast<int>(q.dim(1)), hd = static_cast<int>(q.dim(2));
  const int nKV = static_cast<int>(k.dim(1));
  DS_ASSERT(nKV == geo_.n_kv_heads && hd == geo_.head_dim, "attention geometry");
  DS_ASSERT(kv_layer >= 0 && kv_layer < geo_.n_kv_layers, "kv layer %d", kv_layer);
  const size_t layer_elems = size_t(geo_.n_blocks) * geo_.block_size * nKV * hd;
  bf16* kc = impl_->k_cache + kv_layer * layer_elems;
  bf16* vc = impl_->v_cache + kv_layer * layer_elems;
  // Sequences with more than kDecodeChunk new tokens take the tensor-core kernel, a CTA per query
  // head, when it has this head dim; the others take, over the token range holding them (the
  // scheduler puts decodes first, so in mixed steps that range is short), the tensor-core kernel
  // with each KV head's query heads packed into its rows, or with DS_ATTN_DECODE=simt the
  // split-KV CUDA-core kernel.
  constexpr int kDecodeChunk = 16;
  // Least keys per split: prefill; decode (up to 2 new tokens a sequence); steps whose short
  // sequences may have more (verify blocks, decodes beside a prefill chunk), whose partials are
  // larger (docs/perf/2026-12-01-s10-cuda-27b.md).
  // attention_decode_kernel splits keys in ranges of any length; at least kWarpsSplitKeys each.
  constexpr int kPrefillSplitKeys = 512, kDecodeSplitKeys = 128, kVerifySplitKeys = 256, kWarpsSplitKeys = 32;
  const bool tc = cuda::attention_prefill_supported(hd);
  const bool prefill = max_chunk_ > kDecodeChunk && tc;
  const int split_max_chunk = prefill ? kDecodeChunk : max_chunk_;
  int t_begin = T, t_end = 0, split_ctx = 1, n_short = 0;
  for (int s = 0; s < plan_.n_seqs(); ++s) {
    const int len = plan_.cu_seqlens[s + 1] - plan_.cu_seqlens[s];
    if (len == 0 || len > split_max_chunk) continue;
    t_begin = std::min(t_begin, plan_.cu_seqlens[s]);
    t_end = std::max(t_end, plan_.cu_seqlens[s + 1]);
    split_ctx = std::max(split_ctx, plan_.n_past[s] + len);
    ++n_short;
  }
  if (graph_step_) split_ctx = max_ctx_;  // the whole padded width: the recording must not depend on the context
  // Steps that attention_decode_kernel takes whole (every sequence short enough) let it append the
  // step's keys and values itself, so that it asks for the cached ones while attention prep runs
  // and no kv_append launch sits between them; the others append them first. On the H200 (27B
  // shape, three rounds): verify 4 at 4k 5.768-5.782 against 5.785-5.802 ms, C1 at 1k
  // 5.265-5.285 against 5.266-5.304, verify 8 (the flash kernel) unchanged; step spans 5,301
  // against 5,309 us at one token, 5,761 against 5,773 at 4 (docs/perf/2026-12-04-s40-cuda-27b.md).
  const int pack = nH / nKV;
  const bool in_kernel_append = !prefill && tc && cuda::attention_decode_tc() &&
                                cuda::attention_decode_takes(split_max_chunk, pack) &&
                                cuda::attention_decode_appends() && cuda::aligned16(k.data) && cuda::aligned16(v.data);
  if (!in_kernel_append)
    cuda::launch_kv_append(B(k), B(v), kc, vc, impl_->seq_of_token, impl_->cu_seqlens, impl_->n_past,
                           impl_->block_tables, table_width_, T, nKV, hd, geo_.block_size, impl_->stream);
  const size_t budget = (options_.scratch_bytes - scratch_used_) / 4;  // leave room for the rest of the layer
  if (prefill) {
    const size_t mark = scratch_mark();
    const int n_splits = cuda::attention_prefill_splits(plan_.n_seqs() - n_short, T, nH, hd, max_ctx_, 1,
                                                        kPrefillSplitKeys, 2, budget);
    float* partial =
        n_splits > 1 ? F(scratch_from_free(DType::kF32, {int64_t(T) * nH * n_splits, hd + 2})) : nullptr;
    cuda::launch_attention_prefill(B(q), kc, vc, nullptr, nullptr, B(out), partial, n_splits, impl_->seq_of_token,
                                   impl_->cu_seqlens, impl_->n_past, impl_->block_tables, table_width_, T,
                                   plan_.n_seqs(), kDecodeChunk, INT_MAX, 1, nH, nKV, hd, geo_.block_size, scale,
                                   impl_->stream);
    scratch_release(mark);  // queued work runs before the memory is handed out again
  }
  if (t_end <= t_begin) return false;
  if (tc && cuda::attention_decode_tc()) {
    // Partials are indexed by token from 0: t_end rows.
    // attention_decode_kernel's CTAs run in one wave (a second would double the chain of a CTA's
    // loads and arithmetic); the flash kernel's in two.
    const bool warps = cuda::attention_decode_takes(split_max_chunk, pack);
    const int least = warps ? kWarpsSplitKeys : split_max_chunk > 2 ? kVerifySplitKeys : kDecodeSplitKeys;
    const int n_splits = cuda::attention_prefill_splits(n_short, t_end, nH, hd, split_ctx, pack, least,
                                                        warps ? 1 : 2, budget);
    float* partial =
        n_splits > 1 ? F(scratch_from_free(DType::kF32, {int64_t(t_end) * nH * n_splits, hd + 2})) : nullptr;
    // The gate where the merge of the splits writes every row: no prefill rows beside.
    cuda::AttnGate attn_gate;
    const bool gated = gate && !prefill && n_splits > 1;
    if (gated) {
      attn_gate.gate = B(*gate);
      attn_gate.half = half_copy_of(half, out, makes_half_copy(T, out.numel() / T), "gated_attention");
    }
    cuda::launch_attention_prefill(B(q), kc, vc, in_kernel_append ? B(k) : nullptr,
                                   in_kernel_append ? B(v) : nullptr, B(out), partial, n_splits, impl_->seq_of_token,
                                   impl_->cu_seqlens, impl_->n_past, impl_->block_tables, table_width_, t_end,
                                   plan_.n_seqs(), 0, split_max_chunk, pack, nH, nKV, hd, geo_.block_size, scale,
                                   impl_->stream, attn_gate);
    return gated;
  }
  const int n_rows = t_end - t_begin;
  const int row_groups = cuda::attention_row_groups(split_max_chunk, nH, nKV);
  const int n_splits = cuda::attention_splits(plan_.n_seqs(), row_groups, nH, nKV, hd, n_rows, split_ctx, budget);
  float* partial =
      n_splits > 1 ? F(scratch_from_free(DType::kF32, {int64_t(n_rows) * nH * n_splits, hd + 2})) : nullptr;
  cuda::launch_attention(B(q), kc, vc, B(out), partial, n_splits, row_groups, split_ctx, impl_->seq_of_token,
                         impl_->cu_seqlens, impl_->n_past, impl_->block_tables, table_width_, t_begin, t_end,
                         plan_.n_seqs(), split_max_chunk, nH, nKV, hd, geo_.block_size, scale, impl_->stream);
  return false;
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
