// Int8 group-128 rows: vocabulary tables (embedding and lm_head), quantised at load from bf16 with
// the values of ops/int8_rows.h, and linears published as int8 (the seed's MTP head), both stored
// in the tile layout of the GEMV (int8_tile_offset below), so that each warp of the GEMV reads its
// 16 rows as one contiguous stream: 1,024-byte chunks of 16 rows x 64 columns, one after the other
// along K, instead of 16 rows 5 KB apart (the 27B
// lm_head at one token read in this order: 367.6 against 389.3 us a launch in place on the
// H200, docs/perf/2026-12-03-s27-cuda-27b.md). Linears run the tensor-core GEMV of
// qgemv_kernel.cuh for up to 8 tokens, and for up to 64 on GPUs without the copy engine's box
// copies (or with DS_INT8_WIDE=0); on those with it, 9-64 tokens take the wide GEMV
// (qgemv_wide.cuh), whose blocks share each stage's inputs: in the one-tile kernel every warp
// reads its own, 2 T bytes of inputs a column of 16 one-byte rows (8 times the codes at 64 tokens;
// the 27B's lm_head at 64 tokens took 1.37 ms for 0.3 ms of bytes, H200,
// docs/perf/2026-12-04-s42-cuda-27b.md). The wide GEMV took C64 at 1k from 20.95-21.00 to
// 20.19-20.21 ms and C32 from 13.48 to 13.33-13.39 on an H100 (its lm_head 0.56 ms at 64 tokens;
// docs/perf/2026-12-06-s66-cuda-27b.md). Larger batches dequantise blocks of rows to bf16 for
// cuBLAS; the embedding dequantises on gather.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/qgemv_kernel.cuh"
#include "backend/cuda/qgemv_wide.cuh"
#include "backend/cuda/tensor_map.h"

namespace ds::cuda {

namespace {

using qgemv::Int8Tiled;
// Chunks of 1 KB a warp keeps in flight: 4 at up to 8 tokens (one token tile: the lm_head of
// decode and verify steps; the 27B's at one token 333.3 against 365.0 us a launch in place with
// 2, 3.87 TB/s, on the H200: docs/perf/2026-12-03-s28-cuda-27b.md), 2 at more tokens, whose
// accumulators take the registers.
template <int NT>
constexpr int kChunksInFlight = NT == 1 ? 4 : 2;

using qgemv::int8_scale_index;
using qgemv::int8_tile_offset;

// One warp per (row, group of 128): lane l quantises columns 4l .. 4l + 3 (4 bytes of one lane's
// 16 in the tile layout). Rows past `rows` up to the padded row blocks are left as they are (zero).
__global__ void int8_quantize_rows_kernel(const bf16* w, int8_t* q, float* scales, int64_t n_groups_total, int H) {
  const int lane = threadIdx.x % 32;
  const int groups = H / 128;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; i < n_groups_total; i += warps) {
    const int64_t r = i / groups;
    const int k = static_cast<int>(i % groups) * 128 + 4 * lane;
    float v[4], m = 0.f;
    for (int e = 0; e < 4; ++e) {
      v[e] = to_f32(w[r * H + k + e]);
      m = fmaxf(m, fabsf(v[e]));
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float scale = m / 127.f;
    uint32_t packed = 0;
    for (int e = 0; e < 4; ++e) {
      const float rq = m > 0.f ? fminf(fmaxf(rintf(v[e] / scale), -127.f), 127.f) : 0.f;
      packed |= (static_cast<uint32_t>(static_cast<int>(rq)) & 0xFFu) << (8 * e);
    }
    *reinterpret_cast<uint32_t*>(q + int8_tile_offset(r, k, H)) = packed;
    if (lane == 0) scales[int8_scale_index(r, k, H)] = scale;
  }
}

// Columns k .. k + 3 of row r (k % 4 == 0), dequantised to f32.
__device__ __forceinline__ void int8_dequant4(const int8_t* q, const float* scales, int64_t r, int k, int H,
                                              float (&out)[4]) {
  const uint32_t v = *reinterpret_cast<const uint32_t*>(q + int8_tile_offset(r, k, H));
  const float s = scales[int8_scale_index(r, k, H)];
  for (int m = 0; m < 4; ++m) out[m] = static_cast<float>(static_cast<int8_t>(v >> (8 * m))) * s;
}

// Rows [row0, row0 + rows) of the table -> bf16 [rows, H]; one thread per 4 columns.
__global__ void int8_dequant_rows_kernel(const int8_t* q, const float* scales, bf16* w, int64_t row0, int64_t n4, int H) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = 4 * i, r = e / H;
    const int k = static_cast<int>(e % H);
    float v[4];
    int8_dequant4(q, scales, row0 + r, k, H, v);
    for (int m = 0; m < 4; ++m) w[e + m] = to_bf16(v[m]);
  }
}

// One block per token: out[t, :] = q[ids[t], :] * scale, 4 columns per thread and step.
__global__ void int8_embedding_kernel(const int8_t* q, const float* scales, const int32_t* ids, bf16* out, int H) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int t = blockIdx.x;
  const int64_t row = ids[t];
  for (int k4 = threadIdx.x; k4 < H / 4; k4 += blockDim.x) {
    float v[4];
    int8_dequant4(q, scales, row, 4 * k4, H, v);
    __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(out + int64_t(t) * H + 4 * k4);
    dst[0] = __floats2bfloat162_rn(v[0], v[1]);
    dst[1] = __floats2bfloat162_rn(v[2], v[3]);
  }
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535 * 8)); }

template <int NT>
void launch_nt(const Int8Tiled& w, const bf16* x, const OutParts& o, float* partial, int* counters, int splits, int T,
               int N, int K, cudaStream_t s) {
  qgemv::launch<Int8Tiled, NT, kChunksInFlight<NT>>(w, x, o, partial, counters, splits, T, N, K, s);
}

template <int NT>
int resident() {
  return qgemv::resident_blocks<Int8Tiled, NT, kChunksInFlight<NT>>();
}

bool g_wide = env_flag("DS_INT8_WIDE", true);

// Whether a launch of T tokens over N rows and K columns takes the wide kernel: 9 or more tokens,
// a GPU with box copies (compute capability 9.0 and up), and a counter for each tile.
bool takes_wide(int T, int N, int K) {
  return g_wide && compute_capability_major() >= 9 && T > 8 &&
         qgemv::wide_deal(N, K, sm_count()).tiles <= kGemvMaxSplitTiles;
}

// The wide kernel's dynamic shared-memory limit raised to the opt-in maximum, once per instance.
template <int NT>
int wide_ready() {
  static const int max_smem =
      raise_dynamic_smem_limit(reinterpret_cast<const void*>(qgemv::qgemv_wide_kernel<NT, Int8Tiled>));
  return max_smem;
}

template <int NT>
void launch_wide(const Int8Tiled& w, const bf16* x, const OutParts& parts, float* partial, int64_t partial_floats,
                 int* counters, int T, int N, int K, cudaStream_t s) {
  const int max_smem = wide_ready<NT>();
  const qgemv::WideDeal deal = qgemv::wide_deal(N, K, sm_count());
  const int64_t need = qgemv::wide_partial_floats(deal, NT);
  DS_ASSERT(need == 0 || (partial && partial_floats >= need),
            "int8 wide GEMV: partials of %lld floats given, %lld needed (N %d, K %d)",
            static_cast<long long>(partial ? partial_floats : 0), static_cast<long long>(need), N, K);
  const size_t smem =
      qgemv::wide_launch_smem(qgemv::wide_smem_bytes(T, Int8Tiled::unit_bytes, Int8Tiled::kStagedScaleBytes), max_smem);
  DS_ASSERT(smem <= size_t(max_smem), "int8 wide GEMV: %zu bytes of shared memory, the GPU allows %d", smem,
            max_smem);
  // The codes as u32 [n_rb][n_chunks * 16][16] (a chunk of a row block: 16 rows of 64 bytes), a
  // box one unit of 16 row blocks; the scales as f32 [n_rb][n_groups][16], a box the unit's 2
  // groups of 16 row blocks (rows past the table's padded blocks zero-filled).
  const int n_rb = (N + 15) / 16;
  const cuuint64_t wdims[3] = {16, cuuint64_t(w.n_chunks) * 16, cuuint64_t(n_rb)};
  const cuuint64_t wstrides[2] = {64, cuuint64_t(w.n_chunks) * 1024};
  const cuuint32_t wbox[3] = {16, Int8Tiled::unit_bytes / 64, qgemv::kWideTileBlocks};
  const CUtensorMap wmap =
      tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, w.q, wdims, wstrides, wbox, CU_TENSOR_MAP_SWIZZLE_NONE);
  const cuuint64_t sdims[3] = {16, cuuint64_t(w.n_groups), cuuint64_t(n_rb)};
  const cuuint64_t sstrides[2] = {64, cuuint64_t(w.n_groups) * 64};
  const cuuint32_t sbox[3] = {16, 2, qgemv::kWideTileBlocks};
  const CUtensorMap smap =
      tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, w.scales, sdims, sstrides, sbox, CU_TENSOR_MAP_SWIZZLE_NONE);
  const CUtensorMap xmap = wide_input_map(x, T, K);
  launch_kernel("int8_wide", qgemv::qgemv_wide_kernel<NT, Int8Tiled>, dim3(deal.blocks), dim3(qgemv::kWideThreads),
                smem, s, wmap, xmap, smap, w, parts, partial, counters, deal, T, N, qgemv::kWideStages);
}

}  // namespace

bool int8_gemv_wide() { return g_wide; }
void set_int8_gemv_wide(bool on) { g_wide = on; }

int64_t int8_tiled_rows(int64_t rows) { return (rows + 15) / 16 * 16; }

void upload_int8_tiled(const int8_t* q_host, const float* scales_host, int64_t rows, int H, int8_t* q, float* scales) {
  DS_ASSERT(H % 128 == 0, "int8 rows need whole groups of 128 (H %d)", H);
  // A row block is contiguous in the tile layout (16 H codes, 16 H / 128 scales), so blocks
  // [b0, b0 + n) are tiled on the host into one piece, padding rows zero, and copied as one.
  constexpr int64_t kBlocksAPiece = 1024;
  const int64_t blocks = int8_tiled_rows(rows) / 16, groups = H / 128;
  std::vector<int8_t> tq;
  std::vector<float> ts;
  for (int64_t b0 = 0; b0 < blocks; b0 += kBlocksAPiece) {
    const int64_t n = std::min(kBlocksAPiece, blocks - b0), r0 = 16 * b0;
    tq.assign(static_cast<size_t>(16 * n * H), 0);
    ts.assign(static_cast<size_t>(16 * n * groups), 0.f);
    for (int64_t r = r0; r < std::min(rows, r0 + 16 * n); ++r) {
      for (int k = 0; k < H; k += 16)  // 16 columns of a row are contiguous in a tile
        std::memcpy(&tq[int8_tile_offset(r - r0, k, H)], q_host + r * H + k, 16);
      for (int64_t g = 0; g < groups; ++g) ts[int8_scale_index(r - r0, 128 * g, H)] = scales_host[r * groups + g];
    }
    CUDA_CHECK(cudaMemcpy(q + r0 * H, tq.data(), tq.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(scales + r0 * groups, ts.data(), ts.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
}

void launch_int8_quantize_rows(const bf16* w, int8_t* q, float* scales, int64_t rows, int H, cudaStream_t s) {
  DS_ASSERT(H % 128 == 0, "int8 rows need whole groups of 128 (H %d)", H);
  // The last row block zeroed first where it has padding rows: the GEMV reads them (into output
  // rows it does not store), and zeros keep those reads defined; the kernel writes only rows
  // below `rows`. A row block is contiguous in the tile layout: 16 H codes, 16 H / 128 scales.
  const int64_t padded = int8_tiled_rows(rows);
  if (padded != rows) {
    const int64_t last = padded - 16;
    CUDA_CHECK(cudaMemsetAsync(q + last * H, 0, size_t(16) * H, s));
    CUDA_CHECK(cudaMemsetAsync(scales + last * (H / 128), 0, size_t(16) * (H / 128) * sizeof(float), s));
  }
  const int64_t n_groups_total = rows * (H / 128);
  const int blocks = static_cast<int>(std::min<int64_t>((n_groups_total + 7) / 8, 65535 * 8));
  int8_quantize_rows_kernel<<<blocks, 256, 0, s>>>(w, q, scales, n_groups_total, H);
  cuda_check_launch("int8_quantize_rows", s);
}

int int8_gemv_splits(int T, int N, int K) {
  if (takes_wide(T, N, K)) return 1;  // one wave of stream-K blocks
  const int r = T <= 8 ? resident<1>() : T <= 16 ? resident<2>() : T <= 32 ? resident<4>() : resident<8>();
  return qgemv::choose_splits(r, T, N, K, kGemvMaxSplitTiles);
}

int64_t int8_gemv_partial_floats(int T, int N, int K) {
  if (takes_wide(T, N, K))
    return qgemv::wide_partial_floats(qgemv::wide_deal(N, K, sm_count()), qgemv::wide_token_tiles(T));
  const int splits = int8_gemv_splits(T, N, K);
  return splits > 1 ? int64_t(splits) * T * N : 0;
}

void launch_int8_gemv(const bf16* x, const int8_t* q, const float* scales, const GemvOut& out, float* partial,
                      int64_t partial_floats, int* counters, int splits, int T, int N, int K, cudaStream_t s) {
  if (T == 0) return;
  DS_ASSERT(T <= kInt8GemvMaxTokens && K % 128 == 0, "int8 GEMV: T %d, K %d", T, K);
  DS_ASSERT(aligned16(x) && aligned16(partial),
            "int8 GEMV: x and the partials must be 16-byte aligned");
  DS_ASSERT(!out.swiglu && !out.norm.ss && !out.f16, "int8 GEMV: plain output parts only");
  const Int8Tiled w{q, scales, K / qgemv::kChunk, K / 128};
  const OutParts o = out_parts(out, N);
  if (takes_wide(T, N, K)) {
    const int nt = qgemv::wide_token_tiles(T);
    if (nt == 2) launch_wide<2>(w, x, o, partial, partial_floats, counters, T, N, K, s);
    else if (nt == 4) launch_wide<4>(w, x, o, partial, partial_floats, counters, T, N, K, s);
    else launch_wide<8>(w, x, o, partial, partial_floats, counters, T, N, K, s);
    return;
  }
  DS_ASSERT(splits == 1 || (partial && partial_floats >= int64_t(splits) * T * N),
            "int8 GEMV: partials of %lld floats for %d splits of [%d, %d]", static_cast<long long>(partial_floats),
            splits, T, N);
  if (T <= 8) launch_nt<1>(w, x, o, partial, counters, splits, T, N, K, s);
  else if (T <= 16) launch_nt<2>(w, x, o, partial, counters, splits, T, N, K, s);
  else if (T <= 32) launch_nt<4>(w, x, o, partial, counters, splits, T, N, K, s);
  else launch_nt<8>(w, x, o, partial, counters, splits, T, N, K, s);
}

void launch_int8_dequant_rows(const int8_t* q, const float* scales, bf16* w, int64_t row0, int rows, int H,
                              cudaStream_t s) {
  const int64_t n4 = int64_t(rows) * H / 4;
  if (n4 == 0) return;
  int8_dequant_rows_kernel<<<grid_for(n4), 256, 0, s>>>(q, scales, w, row0, n4, H);
  cuda_check_launch("int8_dequant_rows", s);
}

void launch_int8_embedding(const int8_t* q, const float* scales, const int32_t* ids, bf16* out, int T, int H,
                           cudaStream_t s) {
  if (T == 0) return;
  launch_kernel("int8_embedding", int8_embedding_kernel, T, 256, 0, s, q, scales, ids, out, H);
}

}  // namespace ds::cuda
