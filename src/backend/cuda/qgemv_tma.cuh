// Device code of the W4A16 GEMV whose weights are streamed by the copy unit (TMA, sm_90): the
// same work split, fragments and results as the register GEMV (qgemv_kernel.cuh), fed from a ring
// of shared-memory stages instead of registers.
//
// Each warp streams its own 16-row block: in the tiled layout (w4a16.cu) a block's chunks are
// contiguous, 512 bytes each, and so are its scales, 64 bytes per group. Lane 0 of the warp
// copies kStageChunks chunks and their scales into a stage with two bulk copies completing on
// the stage's mbarrier, and keeps kStages stages in flight: a stage is refilled as soon as the
// warp has read it. So the loads never wait for the arithmetic, no registers hold weights in
// flight, and the first stages are requested before pdl_wait (no kernel writes weights), while
// the previous kernel still runs.
//
// Inputs: with XSmem (one token tile, when they fit beside the ring with 3 blocks an SM) the block first copies its inputs for its chunk range into shared
// memory, which every warp reads; otherwise each lane reads them through L1, at 4 or more tiles a
// stage's before its wait.
#pragma once

#include "backend/cuda/qgemv_kernel.cuh"

namespace ds::cuda::qgemv {

constexpr int kStageChunks = 4;  // chunks per stage (2 KB of weights)
// Stages per warp: 4, or 3 with the inputs in shared memory (3 stages keep 2 x 24 warps x 2 KB in
// flight an SM, several times what the copy rate needs).
__host__ __device__ constexpr int stages_for(bool x_smem) { return x_smem ? 3 : 4; }

// One warp's ring. Scales: the groups a stage's chunks touch, at most one per chunk.
template <int S>
struct TmaWarpRing {
  uint4 w[S][kStageChunks * 32];   // u32 [stage][chunk][lane][4]: the tiled words
  float2 s[S][kStageChunks * 8];   // f32 [stage][group][g][2]: the tiled scales
  uint64_t bar[S];
};
template <int S>
constexpr size_t kRingBytes = sizeof(TmaWarpRing<S>) * kWarps;
// The most a block may take for 3 blocks an SM (228 KiB, each block also holding 1 KiB for the
// system and a few bytes of static shared memory).
constexpr size_t kTmaSmemPerBlock3 = 74 * 1024;

// Chunks [c_begin, c_end) of this block's split, in whole stages: every stage but a warp's last
// starts at a multiple of kStageChunks, so chunk u of a stage has its scales at group (u >> shift)
// of the stage's copy (groups are powers of two of at least one chunk).
__device__ __forceinline__ void stage_split_range(int K, int& c_begin, int& c_end) {
  const int n_chunks = K / kChunk, units = (n_chunks + kStageChunks - 1) / kStageChunks;
  c_begin = min(n_chunks, static_cast<int>(int64_t(blockIdx.y) * units / gridDim.y) * kStageChunks);
  c_end = min(n_chunks, static_cast<int>(int64_t(blockIdx.y + 1) * units / gridDim.y) * kStageChunks);
}

// xv[v][nt][h] = the lane's input columns [8h, 8h + 8) of its 16 in chunk u0 + v of a stage, in
// the row of its token of tile nt; xs[nt]: those of the stage's first chunk.
// XSmem: xs point into shared memory.
template <int NT, int V, bool XSmem>
__device__ __forceinline__ void load_inputs(const __nv_bfloat16* const (&xs)[NT], int u0, uint4 (&xv)[V][NT][2]) {
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4* p = reinterpret_cast<const uint4*>(xs[nt] + (u0 + v) * kChunk + 8 * h);
        xv[v][nt][h] = XSmem ? *p : __ldg(p);
      }
}

// acc += V chunks of a stage (from chunk u0 of ring slot `slot`), their k-steps interleaved so the
// V accumulator chains of the tensor cores overlap. xv: their inputs (load_inputs); soff: the
// stage's scale offset of chunk u (u >> shift groups of 8).
template <int NT, int V, class Ring>
__device__ __forceinline__ void stage_chunks(const Ring& ring, int slot, int u0, int lane,
                                             const uint4 (&xv)[V][NT][2], const int (&soff)[kStageChunks],
                                             float (&acc)[NT][4]) {
  uint4 wv[V];
  float2 sv[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    wv[v] = ring.w[slot][(u0 + v) * 32 + lane];
    sv[v] = ring.s[slot][soff[u0 + v] + lane / 4];
  }
  float p[V][NT][4] = {};
#pragma unroll
  for (int j = 0; j < 4; ++j)  // k-step j: columns 4j.. of the lane's x words (h = j / 2)
#pragma unroll
    for (int v = 0; v < V; ++v) {
      uint32_t a[4];
      const uint32_t word = word_of(wv[v], j);
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = nibbles_to_bf16x2(word >> (4 * r));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        mma_bf16(p[v][nt], a, word_of(xv[v][nt][j / 2], 2 * (j % 2)), word_of(xv[v][nt][j / 2], 2 * (j % 2) + 1));
    }
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      acc[nt][0] += sv[v].x * p[v][nt][0];
      acc[nt][1] += sv[v].x * p[v][nt][1];
      acc[nt][2] += sv[v].y * p[v][nt][2];
      acc[nt][3] += sv[v].y * p[v][nt][3];
    }
}

// The inputs a block copies with XSmem: bf16 [T][x_stride] from the block's first chunk, the rows
// 16 bytes longer than the most chunks a block of `splits` takes from K, so the 8 rows a warp
// reads at once fall in different banks.
inline int tma_x_stride(int K, int splits) {
  const int units = (K / kChunk + kStageChunks - 1) / kStageChunks;
  return (units + splits - 1) / splits * kStageChunks * kChunk + 8;
}
// A block's shared memory with XSmem: the ring and T rows of inputs.
inline size_t tma_x_smem_bytes(int T, int K, int splits) {
  return kRingBytes<stages_for(true)> + size_t(T) * tma_x_stride(K, splits) * sizeof(__nv_bfloat16);
}

// partial f32 [gridDim.y, T, N] and counters i32 [gridDim.x] as in qgemv_kernel. XAhead: a full
// stage's inputs are loaded before its weights are waited for, else per V chunks (without XSmem).
// x_stride: tma_x_stride (XSmem).
template <int NT, int MinBlocks, bool XAhead, bool XSmem>
__global__ void __launch_bounds__(kWarps * 32, MinBlocks)
    qgemv_tma_kernel(W4Tiled w, const __nv_bfloat16* __restrict__ x, OutParts out, float* __restrict__ partial,
                     int* __restrict__ counters, int T, int N, int K, int x_stride) {
  constexpr int V = NT <= 2 ? 2 : 1;  // chunks interleaved (more tiles bring their own chains)
  constexpr int kStages = stages_for(XSmem);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  TmaWarpRing<kStages>& ring = reinterpret_cast<TmaWarpRing<kStages>*>(smem_raw)[warp];
  __nv_bfloat16* x_smem = reinterpret_cast<__nv_bfloat16*>(smem_raw + kRingBytes<kStages>);
  const int rb = blockIdx.x * kWarps + warp;
  int c_begin, c_end;
  stage_split_range(K, c_begin, c_end);
  const int n_stages = rb * 16 < N ? (c_end - c_begin + kStageChunks - 1) / kStageChunks : 0;
  const uint4* block_q = w.q + int64_t(rb) * w.n_chunks * 32;
  const float2* block_s = w.scales + int64_t(rb) * w.n_groups * 8;

  // Stage i (chunks from c_begin + i kStageChunks) into slot i % kStages; lane 0 only.
  auto request = [&](int i) {
    const int c0 = c_begin + i * kStageChunks, n = min(kStageChunks, c_end - c0), slot = i % kStages;
    const int g0 = c0 >> w.group_shift, groups = ((c0 + n - 1) >> w.group_shift) - g0 + 1;
    mbar_arrive_expect_tx(&ring.bar[slot], n * 512 + groups * 64);
    bulk_copy_g2s(ring.w[slot], block_q + int64_t(c0) * 32, n * 512, &ring.bar[slot]);
    bulk_copy_g2s(ring.s[slot], block_s + int64_t(g0) * 8, groups * 64, &ring.bar[slot]);
  };
  if (lane == 0 && n_stages > 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(&ring.bar[i], 1);
    mbar_init_fence();
    for (int i = 0; i < min(kStages, n_stages); ++i) request(i);
  }
  __syncwarp();
  pdl_wait();  // x comes from the previous kernel; out and partial may still be read by it
  pdl_trigger();

  // Input rows: tiles' lanes past T read the last token's row (their columns are never stored).
  const __nv_bfloat16* xs[NT];
  if constexpr (XSmem) {
    const int row = (c_end - c_begin) * kChunk / 8;  // 16-byte pieces of a row
    for (int i = threadIdx.x; i < T * row; i += blockDim.x) {
      const int t = i / row, e = i % row * 8;
      *reinterpret_cast<uint4*>(x_smem + t * x_stride + e) =
          __ldg(reinterpret_cast<const uint4*>(x + int64_t(t) * K + int64_t(c_begin) * kChunk + e));
    }
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xs[nt] = x_smem + min(nt * 8 + lane / 4, T - 1) * x_stride + 16 * (lane % 4);
  } else {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      xs[nt] = x + int64_t(min(nt * 8 + lane / 4, T - 1)) * K + int64_t(c_begin) * kChunk + 16 * (lane % 4);
  }
  int soff[kStageChunks];
#pragma unroll
  for (int u = 0; u < kStageChunks; ++u) soff[u] = (u >> w.group_shift) * 8;

  float acc[NT][4] = {};
  for (int i = 0; i < n_stages; ++i) {
    const int slot = i % kStages, n = min(kStageChunks, c_end - c_begin - i * kStageChunks);
    if (n == kStageChunks) {
      if constexpr (XAhead) {
        uint4 xv[kStageChunks][NT][2];
        load_inputs<NT, kStageChunks, XSmem>(xs, 0, xv);
        mbar_wait(&ring.bar[slot], (i / kStages) & 1);
#pragma unroll
        for (int u0 = 0; u0 < kStageChunks; u0 += V)
          stage_chunks<NT, V>(ring, slot, u0, lane, reinterpret_cast<const uint4(&)[V][NT][2]>(xv[u0]), soff, acc);
      } else {
        mbar_wait(&ring.bar[slot], (i / kStages) & 1);
#pragma unroll
        for (int u0 = 0; u0 < kStageChunks; u0 += V) {
          uint4 xv[V][NT][2];
          load_inputs<NT, V, XSmem>(xs, u0, xv);
          stage_chunks<NT, V>(ring, slot, u0, lane, xv, soff, acc);
        }
      }
    } else {  // a warp's last stage, at the end of K: n < kStageChunks
      mbar_wait(&ring.bar[slot], (i / kStages) & 1);
#pragma unroll
      for (int u0 = 0; u0 < kStageChunks - 1; ++u0)
        if (u0 < n) {
          uint4 xv[1][NT][2];
          load_inputs<NT, 1, XSmem>(xs, u0, xv);
          stage_chunks<NT, 1>(ring, slot, u0, lane, xv, soff, acc);
        }
    }
    __syncwarp();  // every lane has read the slot before it is refilled
    if (lane == 0 && i + kStages < n_stages) request(i + kStages);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xs[nt] += kStageChunks * kChunk;
  }
  store_results<NT>(acc, out, partial, counters, T, N, rb, lane);
}

// The kernel's dynamic shared-memory limit raised to what an SM's opt-in allows beside its static
// shared memory; once per kernel. Returns the GPU's SM count.
template <int NT, int MinBlocks, bool XAhead, bool XSmem>
int tma_kernel_ready() {
  static const int sms = [] {
    int dev = 0, max_smem = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaFuncAttributes attr{};
    CUDA_CHECK(cudaFuncGetAttributes(&attr, qgemv_tma_kernel<NT, MinBlocks, XAhead, XSmem>));
    CUDA_CHECK(cudaFuncSetAttribute(qgemv_tma_kernel<NT, MinBlocks, XAhead, XSmem>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    max_smem - static_cast<int>(attr.sharedSizeBytes)));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}

// Blocks of the kernel with the inputs read through L1 resident on the whole GPU (which decides
// the splits; the inputs then fit in shared memory or not); asked once.
template <int NT, int MinBlocks, bool XAhead>
int tma_resident_blocks() {
  static const int n = [] {
    const int sms = tma_kernel_ready<NT, MinBlocks, XAhead, false>();
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_tma_kernel<NT, MinBlocks, XAhead, false>,
                                                             kWarps * 32, kRingBytes<stages_for(false)>));
    return sms * std::max(per_sm, 1);
  }();
  return n;
}

// XSmem is taken at one token tile when the block's inputs fit beside the ring with 3 blocks an SM
// (and x_smem_allowed).
template <int NT, int MinBlocks, bool XAhead>
void launch_tma(const W4Tiled& w, const __nv_bfloat16* x, const OutParts& out, float* partial, int* counters,
                int splits, int T, int N, int K, bool x_smem_allowed, cudaStream_t s) {
  const dim3 grid((N + kTileRows - 1) / kTileRows, splits);
  if constexpr (NT == 1) {
    const size_t x_smem = tma_x_smem_bytes(T, K, splits);
    if (x_smem_allowed && x_smem <= kTmaSmemPerBlock3) {
      tma_kernel_ready<NT, MinBlocks, XAhead, true>();
      launch_kernel("qgemv_tma", qgemv_tma_kernel<NT, MinBlocks, XAhead, true>, grid, dim3(kWarps * 32), x_smem, s,
                    w, x, out, partial, counters, T, N, K, tma_x_stride(K, splits));
      return;
    }
  }
  tma_kernel_ready<NT, MinBlocks, XAhead, false>();
  launch_kernel("qgemv_tma", qgemv_tma_kernel<NT, MinBlocks, XAhead, false>, grid, dim3(kWarps * 32),
                kRingBytes<stages_for(false)>, s, w, x, out, partial, counters, T, N, K, 0);
}

}  // namespace ds::cuda::qgemv
