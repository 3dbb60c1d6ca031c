// Read-only streaming probes: how fast the GPU's SMs can read a buffer far larger than L2 by each
// way a GEMV may feed itself, with no arithmetic on the data, so a GEMV's rate can be read against
// the ceiling of its own feeding method rather than against a device copy only:
//   kBulk:  each warp streams its share through a ring of `stages` shared-memory slots of `bytes`
//           each, lane 0 issuing one bulk copy (TMA) per slot on an mbarrier and refilling a slot
//           as soon as the warp has read it (qgemv_tma.cuh's scheme). Its share is contiguous
//           (kStreams: one stream a warp, as the tiled W4A16 layout gives) or every W-th piece of
//           the buffer for W warps (kFront: the GPU's reads at a time are one contiguous range);
//   kLoads: each thread keeps `unroll` 16-byte loads in flight (qgemv_kernel.cuh's scheme).
#include <algorithm>
#include <cstdint>
#include <functional>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/event_timing.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"

namespace ds::cuda {

namespace {

// Warp w of the grid reads n = share / bytes pieces of src: piece i at byte (w * n + i) * bytes
// (front false) or (i * W + w) * bytes for W warps (front true); sink gets a word that depends on
// every slot (never equal to the magic value in practice).
__global__ void probe_bulk_kernel(const unsigned char* src, int64_t share, int bytes, int stages, bool front,
                                  uint32_t* sink) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem) + warp * stages;
  unsigned char* ring = smem + mbar_array_bytes(warps * stages) + size_t(warp) * stages * bytes;
  const int64_t gw = int64_t(blockIdx.x) * warps + warp, n_warps = int64_t(gridDim.x) * warps;
  const int n = static_cast<int>(share / bytes);
  auto piece = [&](int i) { return src + (front ? int64_t(i) * n_warps + gw : gw * n + i) * bytes; };
  if (lane == 0) {
    for (int i = 0; i < stages; ++i) mbar_init(&full[i], 1);
    mbar_init_fence();
    for (int i = 0; i < min(stages, n); ++i) {
      mbar_arrive_expect_tx(&full[i], bytes);
      bulk_copy_g2s(ring + size_t(i) * bytes, piece(i), bytes, &full[i]);
    }
  }
  __syncwarp();
  uint32_t acc = 0;
  for (int i = 0; i < n; ++i) {
    const int slot = i % stages;
    mbar_wait(&full[slot], (i / stages) & 1);
    acc ^= reinterpret_cast<const uint32_t*>(ring + size_t(slot) * bytes)[lane];
    __syncwarp();
    if (lane == 0 && i + stages < n) {
      mbar_arrive_expect_tx(&full[slot], bytes);
      bulk_copy_g2s(ring + size_t(slot) * bytes, piece(i + stages), bytes, &full[slot]);
    }
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

template <int U>
__global__ void probe_loads_kernel(const uint4* src, int64_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n16; i += stride * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = i + u * stride;
      v[u] = j < n16 ? src[j] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

}  // namespace

double stream_probe_gbps(const StreamProbe& p) {
  const int sms = sm_count();
  const int64_t total = int64_t(p.megabytes) << 20;
  unsigned char* buf = nullptr;
  uint32_t* sink = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, total));
  CUDA_CHECK(cudaMalloc(&sink, 4));
  launch_fill_random_bits(reinterpret_cast<uint32_t*>(buf), total / 4, 7, nullptr);
  const int blocks = sms * p.blocks_per_sm;
  int64_t bytes_read = 0;
  std::function<void()> run;
  if (p.method == StreamProbe::kBulk) {
    const int warps = p.threads / 32;
    const int64_t share = total / (int64_t(blocks) * warps) / p.bytes * p.bytes;
    const size_t smem = mbar_array_bytes(warps * p.stages) + size_t(warps) * p.stages * p.bytes;
    CUDA_CHECK(cudaFuncSetAttribute(probe_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    bytes_read = share * blocks * warps;
    const bool front = p.order == StreamProbe::kFront;
    run = [=] { probe_bulk_kernel<<<blocks, p.threads, smem>>>(buf, share, p.bytes, p.stages, front, sink); };
  } else {
    const int64_t n16 = total / 16;
    bytes_read = total;
    run = [=] {
      if (p.unroll == 8) probe_loads_kernel<8><<<blocks, p.threads>>>(reinterpret_cast<const uint4*>(buf), n16, sink);
      else probe_loads_kernel<4><<<blocks, p.threads>>>(reinterpret_cast<const uint4*>(buf), n16, sink);
    };
  }
  const float ms = median_ms(run, p.reps);
  CUDA_CHECK(cudaFree(buf));
  CUDA_CHECK(cudaFree(sink));
  return double(bytes_read) / (ms * 1e-3) / 1e9;
}

}  // namespace ds::cuda
