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
#pragma once

#include "backend/cuda/qgemv_kernel.cuh"

namespace ds::cuda::qgemv {

constexpr int kStageChunks = 4;  // chunks per stage (2 KB of weights)
constexpr int kStages = 4;       // stages per warp

// One warp's ring. Scales: the groups a stage's chunks touch, at most one per chunk.
struct TmaWarpRing {
  uint4 w[kStages][kStageChunks * 32];   // u32 [stage][chunk][lane][4]: the tiled words
  float2 s[kStages][kStageChunks * 8];   // f32 [stage][group][g][2]: the tiled scales
  uint64_t bar[kStages];
};
constexpr size_t kTmaSmemBytes = sizeof(TmaWarpRing) * kWarps;

// partial f32 [gridDim.y, T, N] and counters i32 [gridDim.x] as in qgemv_kernel.
template <int NT, int MinBlocks>
__global__ void __launch_bounds__(kWarps * 32, MinBlocks)
    qgemv_tma_kernel(W4Tiled w, const __nv_bfloat16* __restrict__ x, OutParts out, float* __restrict__ partial,
                     int* __restrict__ counters, int T, int N, int K) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  TmaWarpRing& ring = reinterpret_cast<TmaWarpRing*>(smem_raw)[warp];
  const int rb = blockIdx.x * kWarps + warp;
  int c_begin, c_end;
  split_range(K, c_begin, c_end);
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

  float acc[NT][4] = {};
  for (int i = 0; i < n_stages; ++i) {
    const int slot = i % kStages, c0 = c_begin + i * kStageChunks, g0 = c0 >> w.group_shift;
    mbar_wait(&ring.bar[slot], (i / kStages) & 1);
#pragma unroll
    for (int u = 0; u < kStageChunks; ++u) {
      const int c = c0 + u;
      if (c < c_end) {
        W4Tiled::Frag f;
        f.w = ring.w[slot][u * 32 + lane];
        f.s = ring.s[slot][((c >> w.group_shift) - g0) * 8 + lane / 4];
        accumulate_chunk<W4Tiled, NT>(w, f, x, c * kChunk + 16 * (lane % 4), T, K, lane / 4, acc);
      }
    }
    __syncwarp();  // every lane has read the slot before it is refilled
    if (lane == 0 && i + kStages < n_stages) request(i + kStages);
  }
  store_results<NT>(acc, out, partial, counters, T, N, rb, lane);
}

// The kernel's shared-memory limit raised once; then its blocks resident on the whole GPU.
template <int NT, int MinBlocks>
int tma_resident_blocks() {
  static const int n = [] {
    CUDA_CHECK(cudaFuncSetAttribute(qgemv_tma_kernel<NT, MinBlocks>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kTmaSmemBytes)));
    int dev = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_tma_kernel<NT, MinBlocks>, kWarps * 32,
                                                             kTmaSmemBytes));
    return sms * std::max(per_sm, 1);
  }();
  return n;
}

template <int NT, int MinBlocks>
void launch_tma(const W4Tiled& w, const __nv_bfloat16* x, const OutParts& out, float* partial, int* counters,
                int splits, int T, int N, int K, cudaStream_t s) {
  tma_resident_blocks<NT, MinBlocks>();  // the shared-memory attribute, before the first launch
  launch_kernel("qgemv_tma", qgemv_tma_kernel<NT, MinBlocks>, dim3((N + kTileRows - 1) / kTileRows, splits),
                dim3(kWarps * 32), kTmaSmemBytes, s, w, x, out, partial, counters, T, N, K);
}

}  // namespace ds::cuda::qgemv
