// Read-only streaming probes: how fast the GPU's SMs can read a buffer far larger than L2 by each
// way a GEMV may feed itself, with no arithmetic on the data, so a GEMV's rate can be read against
// the ceiling of its own feeding method rather than against a device copy only:
//   kBulk:  each warp streams its share through a ring of `stages` shared-memory slots of `bytes`
//           each, lane 0 issuing one bulk copy (TMA) per slot on an mbarrier and refilling a slot
//           as soon as the warp has read it (qgemv_tma.cuh's scheme). Its share is contiguous
//           (kStreams: one stream a warp, as the tiled W4A16 layout gives) or every W-th piece of
//           the buffer for W warps (kFront: the GPU's reads at a time are one contiguous range);
//   kAsync: as kBulk, each slot filled by the warp's lanes with 16-byte cp.async (LDGSTS);
//   kLoads: each thread keeps `unroll` 16-byte loads in flight (qgemv_kernel.cuh's scheme).
// And step_stream_probe_ms: the ceiling of a decode step's weight stream read by one persistent
// launch whose rings run ahead across the step's linears (no launch boundaries), each linear
// read only once every warp has finished the one before (its input's dependency).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/event_timing.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"

namespace ds::cuda {

namespace {

// Warp w of the grid reads n = share / bytes pieces of src: piece i at byte (w * n + i) * bytes
// (front false) or (i * W + w) * bytes for W warps (front true); sink gets a word that depends on
// every slot (never equal to the magic value in practice).
// Async: each slot filled by the warp's 32 lanes with 16-byte cp.async (LDGSTS) instead of one
// bulk copy, each lane arriving on the slot's barrier once its copies have landed.
// ring_offset: the rings start right after the barriers (-1), or that many bytes (a multiple of
// 16) past the first 128-byte boundary after them (StreamProbe::ring_offset). window: piece i is
// piece i % window of src (pieces; 0: none), so a window smaller than L2 is read from L2.
template <bool Async>
__global__ void probe_bulk_kernel(const unsigned char* src, int64_t share, int bytes, int stages, bool front,
                                  int ring_offset, int64_t window, uint32_t* sink) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem) + warp * stages;
  const uint32_t base = smem_u32(smem), after_bars = base + mbar_array_bytes(warps * stages);
  const uint32_t rings = ring_offset < 0 ? after_bars : ((after_bars + 127) & ~127u) + ring_offset;
  unsigned char* ring = smem + (rings - base) + size_t(warp) * stages * bytes;
  const int64_t gw = int64_t(blockIdx.x) * warps + warp, n_warps = int64_t(gridDim.x) * warps;
  const int n = static_cast<int>(share / bytes);
  auto piece = [&](int i) {
    const int64_t p = front ? int64_t(i) * n_warps + gw : gw * n + i;
    return src + (window > 0 ? p % window : p) * bytes;
  };
  auto fill = [&](int slot, int i) {  // Async: the whole warp; else lane 0
    unsigned char* dst = ring + size_t(slot) * bytes;
    if constexpr (Async) {
      for (int o = 16 * lane; o < bytes; o += 16 * 32) cp_async16(dst + o, piece(i) + o);
      cp_async_mbar_arrive(&full[slot]);
    } else {
      mbar_arrive_expect_tx(&full[slot], bytes);
      bulk_copy_g2s(dst, piece(i), bytes, &full[slot]);
    }
  };
  if (lane == 0) {
    for (int i = 0; i < stages; ++i) mbar_init(&full[i], Async ? 32 : 1);
    mbar_init_fence();
  }
  __syncwarp();
  if (Async || lane == 0)
    for (int i = 0; i < min(stages, n); ++i) fill(i, i);
  uint32_t acc = 0;
  for (int i = 0; i < n; ++i) {
    const int slot = i % stages;
    mbar_wait(&full[slot], (i / stages) & 1);
    acc ^= reinterpret_cast<const uint32_t*>(ring + size_t(slot) * bytes)[lane];
    __syncwarp();
    if ((Async || lane == 0) && i + stages < n) fill(slot, i + stages);
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

// A warp's place in the step: unit u of phase p, its claimed units of p being [u, end).
struct PhaseCursor {
  int p, u, end;
};
// probe_step_kernel's phases: phase p holds units[p] pieces of `bytes` from byte off[p]. Static
// (grab 0): warp gw of W reads pieces [units gw / W, units (gw + 1) / W) of each. Dynamic: a
// warp claims `grab` pieces at a time from next[p] (zero at launch), and moves on to phase p + 1
// once none are left.
struct StepPhases {
  const int64_t* off;
  const int* units;
  int* next;
  int n, grab;
};
// Moves c to its next claimed piece at phase c.p or later (c.p == n: none left). Every lane calls
// it; lane 0 claims.
__device__ __forceinline__ void cursor_claim(const StepPhases& ph, int64_t gw, int64_t W, int lane, PhaseCursor& c) {
  for (; c.p < ph.n; ++c.p) {
    const int units = ph.units[c.p];
    if (ph.grab == 0) {
      c.u = static_cast<int>(units * gw / W);
      c.end = static_cast<int>(units * (gw + 1) / W);
    } else {
      int start = 0;
      if (lane == 0) start = atomicAdd(&ph.next[c.p], ph.grab);
      c.u = __shfl_sync(0xffffffffu, start, 0);
      c.end = min(c.u + ph.grab, units);
    }
    if (c.u < c.end) return;
  }
}
__device__ __forceinline__ void cursor_next(const StepPhases& ph, int64_t gw, int64_t W, int lane, PhaseCursor& c) {
  if (++c.u < c.end) return;
  if (ph.grab == 0) ++c.p;  // a static share is done; a dynamic phase may have more to claim
  cursor_claim(ph, gw, W, lane, c);
}

// One persistent launch, every block resident: each warp streams its pieces of every phase in
// order through its ring (lane 0 refills a slot as soon as the warp has read it, the next pieces
// whatever their phase), but reads a piece of phase p only once `ready` >= p: every warp has
// arrived at phase p - 1 (a warp arrives at a phase once it has read its last piece of it, or
// skips it; the block's last warp to arrive counts the block in arrived[p - 1]), and the last
// block to arrive has waited gap_ns (a dependent small op) before raising `ready` (a maximum:
// phases may complete out of order, each after the ones before). arrived [n], ready: zero at
// launch; n <= kMaxStepPhases.
constexpr int kMaxStepPhases = 1024;
__global__ void probe_step_kernel(const unsigned char* src, StepPhases ph, int bytes, int stages, int gap_ns,
                                  int* arrived, int* ready, uint32_t* sink) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int block_arrived[kMaxStepPhases];  // warps of this block arrived at each phase
  for (int i = threadIdx.x; i < ph.n; i += blockDim.x) block_arrived[i] = 0;
  __syncthreads();
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem) + warp * stages;
  int* slot_phase = reinterpret_cast<int*>(smem + mbar_array_bytes(warps * stages)) + warp * stages;
  unsigned char* ring = smem + mbar_array_bytes(warps * stages) + size_t(warps) * stages * sizeof(int) +
                        size_t(warp) * stages * bytes;
  const int64_t gw = int64_t(blockIdx.x) * warps + warp, W = int64_t(gridDim.x) * warps;
  PhaseCursor rq{0, 0, 0};
  cursor_claim(ph, gw, W, lane, rq);
  int issued = 0;
  auto request = [&] {  // the piece at rq into slot issued % stages
    const int slot = issued % stages;
    if (lane == 0) {
      slot_phase[slot] = rq.p;
      mbar_arrive_expect_tx(&full[slot], bytes);
      bulk_copy_g2s(ring + size_t(slot) * bytes, src + ph.off[rq.p] + int64_t(rq.u) * bytes, bytes, &full[slot]);
    }
    ++issued;
    cursor_next(ph, gw, W, lane, rq);
  };
  if (lane == 0) {
    for (int i = 0; i < stages; ++i) mbar_init(&full[i], 1);
    mbar_init_fence();
  }
  __syncwarp();
  while (issued < stages && rq.p < ph.n) request();
  __syncwarp();
  // This warp's arrival at phase p: the block's last counts the block, and the last block's
  // releases phase p + 1 after gap_ns (one global atomic a block and phase: one a warp, 2,112 on
  // one address, took the H200 probe from 89% to 83% of the copy rate).
  auto arrive = [&](int p) {
    if (lane != 0) return;
    if (atomicAdd(&block_arrived[p], 1) != warps - 1) return;
    if (atomic_add_acq_rel_gpu(&arrived[p], 1) != static_cast<int>(gridDim.x) - 1) return;
    const uint64_t t0 = globaltimer_ns();
    while (globaltimer_ns() - t0 < uint64_t(gap_ns)) {
    }
    asm volatile("red.release.gpu.global.max.s32 [%0], %1;\n" ::"l"(ready), "r"(p + 1) : "memory");
  };
  uint32_t acc = 0;
  int arrived_at = 0, seen = 0;  // phases this warp has arrived at; `ready` as last read
  for (int j = 0; j < issued; ++j) {
    const int slot = j % stages, p = slot_phase[slot];
    for (; arrived_at < p; ++arrived_at) arrive(arrived_at);
    if (p > seen) {
      if (lane == 0)
        while ((seen = load_acquire_gpu(ready)) < p) __nanosleep(32);
      seen = __shfl_sync(0xffffffffu, seen, 0);
    }
    mbar_wait(&full[slot], (j / stages) & 1);
    acc ^= reinterpret_cast<const uint32_t*>(ring + size_t(slot) * bytes)[lane];
    __syncwarp();
    if (rq.p < ph.n) request();
    __syncwarp();
  }
  for (; arrived_at < ph.n; ++arrived_at) arrive(arrived_at);
  if (acc == 0x9E3779B9u) *sink = acc;
}

}  // namespace

double step_stream_probe_ms(const StepStreamProbe& p) {
  const int n = static_cast<int>(p.phase_bytes.size());
  DS_ASSERT(n > 0 && n <= kMaxStepPhases && p.bytes % 16 == 0 && p.threads % 32 == 0,
            "step stream probe: %d phases, pieces of %d bytes", n, p.bytes);
  std::vector<int64_t> off(n);
  std::vector<int> units(n);
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    off[i] = total;
    units[i] = static_cast<int>(p.phase_bytes[i] / p.bytes);
    total += int64_t(units[i]) * p.bytes;
  }
  const int warps = p.threads / 32;
  const size_t smem = mbar_array_bytes(warps * p.stages) + size_t(warps) * p.stages * (sizeof(int) + p.bytes);
  CUDA_CHECK(cudaFuncSetAttribute(probe_step_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, probe_step_kernel, p.threads, smem));
  DS_ASSERT(per_sm >= p.blocks_per_sm, "step stream probe: %d blocks of %zu bytes an SM fit, %d asked", per_sm, smem,
            p.blocks_per_sm);  // every block must be resident: warps wait for each other
  unsigned char* buf = nullptr;
  int64_t* d_off = nullptr;
  int *d_units = nullptr, *flags = nullptr;
  uint32_t* sink = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, total));
  CUDA_CHECK(cudaMalloc(&d_off, n * sizeof(int64_t)));
  CUDA_CHECK(cudaMalloc(&d_units, n * sizeof(int)));
  CUDA_CHECK(cudaMalloc(&flags, (1 + 2 * n) * sizeof(int)));  // ready, arrived[n], next[n]
  CUDA_CHECK(cudaMalloc(&sink, 4));
  CUDA_CHECK(cudaMemcpy(d_off, off.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_units, units.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  const StepPhases ph{d_off, d_units, flags + 1 + n, n, p.grab};
  const int blocks = sm_count() * p.blocks_per_sm;
  const float ms = median_ms(
      [&] {
        CUDA_CHECK(cudaMemsetAsync(flags, 0, (1 + 2 * n) * sizeof(int)));
        probe_step_kernel<<<blocks, p.threads, smem>>>(buf, ph, p.bytes, p.stages, p.gap_ns, flags + 1, flags, sink);
      },
      p.reps);
  CUDA_CHECK(cudaFree(buf));
  CUDA_CHECK(cudaFree(d_off));
  CUDA_CHECK(cudaFree(d_units));
  CUDA_CHECK(cudaFree(flags));
  CUDA_CHECK(cudaFree(sink));
  return ms;
}

double stream_probe_gbps(const StreamProbe& p) {
  const int sms = p.sms > 0 ? std::min(p.sms, sm_count()) : sm_count();
  const int64_t total = int64_t(p.megabytes) << 20;
  unsigned char* buf = nullptr;
  uint32_t* sink = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, total));
  CUDA_CHECK(cudaMalloc(&sink, 4));
  launch_fill_random_bits(reinterpret_cast<uint32_t*>(buf), total / 4, 7, nullptr);
  const int blocks = sms * p.blocks_per_sm;
  int64_t bytes_read = 0;
  std::function<void()> run;
  if (p.method == StreamProbe::kBulk || p.method == StreamProbe::kAsync) {
    const int warps = p.threads / 32;
    const int64_t share = total / (int64_t(blocks) * warps) / p.bytes * p.bytes;
    DS_ASSERT(p.ring_offset < 0 || p.ring_offset % 16 == 0, "stream probe: ring offset %d", p.ring_offset);
    const size_t smem = mbar_array_bytes(warps * p.stages) + (p.ring_offset < 0 ? 0 : 128 + p.ring_offset) +
                        size_t(warps) * p.stages * p.bytes;
    auto* kernel = p.method == StreamProbe::kAsync ? probe_bulk_kernel<true> : probe_bulk_kernel<false>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    bytes_read = share * blocks * warps;
    const bool front = p.order == StreamProbe::kFront;
    const int64_t window = (int64_t(p.window_mb) << 20) / p.bytes;
    DS_ASSERT(p.window_mb >= 0 && p.window_mb <= p.megabytes, "stream probe: window %d MB of %d", p.window_mb,
              p.megabytes);
    run = [=] {
      kernel<<<blocks, p.threads, smem>>>(buf, share, p.bytes, p.stages, front, p.ring_offset, window, sink);
    };
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
