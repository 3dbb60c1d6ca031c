// Device code of the W4A16 GEMV whose weights are streamed by the copy unit (TMA, sm_90): the
// fragments and arithmetic of the register GEMV (qgemv_kernel.cuh), its work split "stream-K".
//
// Work split: in the tiled layout (w4a16.cu) the weight is one run of equal units (16 rows x 256
// columns and their scales), row block after row block. One block runs on each SM and every warp
// of the grid takes an equal, contiguous range of that run, so every SM streams the same bytes
// and all finish together, whatever N and K (a grid of row tiles leaves SMs with 2 blocks and
// others with 3). A warp's range may end inside a row block or cover several; each row block's
// pieces ("segments", fixed by the split alone) are summed in segment order by the warp that
// finishes its segment last, through fp32 partials and a counter per row block, so results do
// not depend on scheduling.
//
// Feeding: lane 0 of each warp keeps kStages copies of kStageUnits units in flight (one bulk copy
// each, completing on the slot's mbarrier), the first requested before pdl_wait (no kernel writes
// weights) and each refilled as soon as the warp has read it. (Read-only probes of such rings,
// stream_probe.cu, reach 98-99% of the copy rate with 24 warps of 2 x 4,352 bytes an SM.)
//
// Inputs: with XSmem the block first copies x [T, K] into shared memory (when it fits beside the
// rings), which every warp reads; otherwise each lane reads them through L1, with XAhead a unit's
// before its stage's wait.
#pragma once

#include "backend/cuda/qgemv_kernel.cuh"

namespace ds::cuda::qgemv {

constexpr int kStageUnits = 2;  // units a copy (4,352 bytes at group 128)
// Warps of a block and stages a warp: 24 x 2 at up to 2 token tiles (80 registers a thread),
// 8 x 4 at more (their accumulators need about 200).
__host__ __device__ constexpr int tma_warps(int nt) { return nt <= 2 ? 24 : 8; }
__host__ __device__ constexpr int tma_stages(int nt) { return nt <= 2 ? 2 : 4; }

// A block's shared memory: mbarriers u64 [warps][stages], the rings u8 [warps][stages][stage bytes]
// (16-byte aligned after the barriers), then with XSmem x bf16 [T][K + 8].
__host__ __device__ inline size_t tma_ring_bytes(int nt, int unit_bytes) {
  return size_t(tma_warps(nt)) * tma_stages(nt) * (sizeof(uint64_t) + size_t(kStageUnits) * unit_bytes);
}
inline size_t tma_x_bytes(int T, int K) { return size_t(T) * (K + 8) * sizeof(__nv_bfloat16); }

// The stream-K split of `units` units over `warps` warps (at most `units`, so no range is empty):
// warp w takes [begin(w), begin(w + 1)).
__host__ __device__ __forceinline__ int64_t sk_warps(int64_t grid_warps, int64_t units) {
  return grid_warps < units ? grid_warps : units;
}
__host__ __device__ __forceinline__ int64_t sk_begin(int64_t w, int64_t units, int64_t warps) {
  return w * units / warps;
}
// The warp whose range holds unit i.
__host__ __device__ __forceinline__ int64_t sk_owner(int64_t i, int64_t units, int64_t warps) {
  return ((i + 1) * warps + units - 1) / units - 1;
}

// xv[v][nt][h] = the lane's input columns [8h, 8h + 8) of its 16 in chunk c0 + v, in the row of its
// token of tile nt (xs[nt]: the lane's columns of chunk 0).
template <int NT, int V, bool XSmem>
__device__ __forceinline__ void load_inputs(const __nv_bfloat16* const (&xs)[NT], int c0, uint4 (&xv)[V][NT][2]) {
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4* p = reinterpret_cast<const uint4*>(xs[nt] + (c0 + v) * kChunk + 8 * h);
        xv[v][nt][h] = XSmem ? *p : __ldg(p);
      }
}

// acc += V chunks of a unit (from chunk u0; chunks: the unit's u32 [kUnitChunks][32][4], scales:
// its slots f32 [slots][8][2]), their k-steps interleaved so the V accumulator chains of the tensor
// cores overlap. xv: their inputs (load_inputs); soff[u]: chunk u's scales, in float2 of `scales`.
template <int NT, int V>
__device__ __forceinline__ void unit_chunks(const uint4* chunks, const float2* scales, int u0, int lane,
                                            const uint4 (&xv)[V][NT][2], const int (&soff)[kUnitChunks],
                                            float (&acc)[NT][4]) {
  uint4 wv[V];
  float2 sv[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    wv[v] = chunks[(u0 + v) * 32 + lane];
    sv[v] = scales[soff[u0 + v] + lane / 4];
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

// A warp's result for row block rb (16 rows): stored when the warp's segment is the block's only
// one, else written to the partials; the warp finishing the block's last segment sums them in
// segment order and stores. partial f32 [max segments][T][NB * 16]; counters i32 [NB], zero
// between launches (the summing warp resets its block's).
template <int NT>
__device__ __forceinline__ void flush_row_block(const float (&acc)[NT][4], const OutParts& out, float* partial,
                                                int* counters, int T, int N, int64_t rb, int64_t gw, int64_t units,
                                                int64_t warps, int n_units, int lane) {
  const int g = lane / 4, q4 = lane % 4;
  const int64_t first = sk_owner(rb * n_units, units, warps);
  const int n_seg = static_cast<int>(sk_owner((rb + 1) * n_units - 1, units, warps) - first + 1);
  const int rows = ((N + 15) / 16) * 16;
  if (n_seg == 1) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = nt * 8 + 2 * q4 + (i & 1), n = static_cast<int>(rb * 16) + g + (i >= 2 ? 8 : 0);
        if (t < T && n < N) out.store(t, n, acc[nt][i]);
      }
    return;
  }
  float* mine = partial + (gw - first) * T * int64_t(rows);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int t = nt * 8 + 2 * q4 + (i & 1), n = static_cast<int>(rb * 16) + g + (i >= 2 ? 8 : 0);
      if (t < T) mine[int64_t(t) * rows + n] = acc[nt][i];
    }
  __threadfence();  // the partials visible device-wide before the counter moves
  __syncwarp();
  int last = 0;
  if (lane == 0) last = atomicAdd(&counters[rb], 1) == n_seg - 1;
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  __threadfence();
  for (int e = lane; e < T * 16; e += 32) {
    const int t = e / 16, n = static_cast<int>(rb * 16) + e % 16;
    float s = 0.f;
    for (int seg = 0; seg < n_seg; ++seg) s += __ldcg(partial + (int64_t(seg) * T + t) * rows + n);
    if (n < N) out.store(t, n, s);
  }
  if (lane == 0) counters[rb] = 0;  // ready for the next launch
}

// One block an SM (gridDim.x = the SM count), tma_warps(NT) warps. XSmem: x_stride = K + 8.
template <int NT, bool XSmem>
__global__ void __launch_bounds__(tma_warps(NT) * 32, 1)
    qgemv_tma_kernel(W4Tiled w, const __nv_bfloat16* __restrict__ x, OutParts out, float* __restrict__ partial,
                     int* __restrict__ counters, int T, int N, int K) {
  constexpr int W = tma_warps(NT), S = tma_stages(NT);
  constexpr int V = NT <= 2 ? 2 : 1;        // chunks interleaved (more tiles bring their own chains)
  constexpr bool XAhead = NT == 4 && !XSmem;  // a unit's inputs loaded before its stage's wait (NT 8: spills)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int stage_bytes = kStageUnits * w.unit_bytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_raw) + warp * S;  // [S]: the slot's copy has landed
  unsigned char* ring = smem_raw + W * S * sizeof(uint64_t) + size_t(warp) * S * stage_bytes;
  __nv_bfloat16* x_smem = reinterpret_cast<__nv_bfloat16*>(smem_raw + tma_ring_bytes(NT, w.unit_bytes));

  const int64_t units = int64_t((N + 15) / 16) * w.n_units;
  const int64_t warps = sk_warps(int64_t(gridDim.x) * W, units), gw = int64_t(blockIdx.x) * W + warp;
  const int64_t begin = gw < warps ? sk_begin(gw, units, warps) : units;  // warps past `warps` have no range
  const int64_t end = gw < warps ? sk_begin(gw + 1, units, warps) : units;
  const int n_stages = static_cast<int>((end - begin + kStageUnits - 1) / kStageUnits);

  // Stage i (units begin + kStageUnits i ..) into slot i % S; lane 0 only.
  auto request = [&](int i) {
    const int64_t first = begin + int64_t(i) * kStageUnits;
    const uint32_t bytes = static_cast<uint32_t>(end - first < kStageUnits ? end - first : kStageUnits) * w.unit_bytes;
    mbar_arrive_expect_tx(&full[i % S], bytes);
    bulk_copy_g2s(ring + (i % S) * stage_bytes, w.base + first * w.unit_bytes, bytes, &full[i % S]);
  };
  if (lane == 0 && n_stages > 0) {
    for (int i = 0; i < S; ++i) mbar_init(&full[i], 1);
    mbar_init_fence();
    for (int i = 0; i < min(S, n_stages); ++i) request(i);
  }
  __syncwarp();
  pdl_wait();  // x comes from the previous kernel; out and partial may still be read by it
  pdl_trigger();

  const int x_stride = XSmem ? K + 8 : K;
  if constexpr (XSmem) {  // the whole block copies x
    const int row = K / 8;  // 16-byte pieces of a row
    for (int i = threadIdx.x; i < T * row; i += blockDim.x) {
      const int t = i / row, e = i % row * 8;
      *reinterpret_cast<uint4*>(x_smem + t * x_stride + e) =
          __ldg(reinterpret_cast<const uint4*>(x + int64_t(t) * K + e));
    }
    __syncthreads();
  }
  // Input rows: tiles' lanes past T read the last token's row (their columns are never stored).
  const __nv_bfloat16* xs[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    xs[nt] = (XSmem ? x_smem : x) + int64_t(min(nt * 8 + lane / 4, T - 1)) * x_stride + 16 * (lane % 4);
  int soff[kUnitChunks];
#pragma unroll
  for (int u = 0; u < kUnitChunks; ++u) soff[u] = (u >> w.slot_shift) * 8;

  int64_t rb = begin / w.n_units;  // the row block and unit of the next unit
  int u = static_cast<int>(begin % w.n_units);
  float acc[NT][4] = {};
  for (int i = 0; i < n_stages; ++i) {
    const int slot = i % S;
    const int64_t left = end - begin - int64_t(i) * kStageUnits;
    const int n_units_here = left < kStageUnits ? static_cast<int>(left) : kStageUnits;
#pragma unroll
    for (int su = 0; su < kStageUnits; ++su) {
      if (su >= n_units_here) break;
      const unsigned char* unit = ring + slot * stage_bytes + su * w.unit_bytes;
      const float2* scales = reinterpret_cast<const float2*>(unit);
      const uint4* chunks = reinterpret_cast<const uint4*>(unit + w.slots * kSlotBytes);
      const int c0 = u * kUnitChunks, n = min(kUnitChunks, w.n_chunks - c0);  // chunks of this unit
      if (n == kUnitChunks) {
        if constexpr (XAhead) {
          uint4 xv[kUnitChunks][NT][2];
          load_inputs<NT, kUnitChunks, XSmem>(xs, c0, xv);
          if (su == 0) mbar_wait(&full[slot], (i / S) & 1);
#pragma unroll
          for (int q = 0; q < kUnitChunks; ++q)
            unit_chunks<NT, 1>(chunks, scales, q, lane, reinterpret_cast<const uint4(&)[1][NT][2]>(xv[q]), soff, acc);
        } else {
          if (su == 0) mbar_wait(&full[slot], (i / S) & 1);
#pragma unroll
          for (int q = 0; q < kUnitChunks; q += V) {
            uint4 xv[V][NT][2];
            load_inputs<NT, V, XSmem>(xs, c0 + q, xv);
            unit_chunks<NT, V>(chunks, scales, q, lane, xv, soff, acc);
          }
        }
      } else {  // the short last unit of a row block (K not a multiple of 256)
        if (su == 0) mbar_wait(&full[slot], (i / S) & 1);
#pragma unroll
        for (int q = 0; q < kUnitChunks - 1; ++q)
          if (q < n) {
            uint4 xv[1][NT][2];
            load_inputs<NT, 1, XSmem>(xs, c0 + q, xv);
            unit_chunks<NT, 1>(chunks, scales, q, lane, xv, soff, acc);
          }
      }
      if (++u == w.n_units) {  // the row block is done (for this warp)
        flush_row_block<NT>(acc, out, partial, counters, T, N, rb, gw, units, warps, w.n_units, lane);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
        ++rb;
        u = 0;
      }
    }
    __syncwarp();  // every lane has read the slot before it is refilled
    if (lane == 0 && i + S < n_stages) request(i + S);
  }
  if (n_stages > 0 && u != 0)  // the range ended inside a row block
    flush_row_block<NT>(acc, out, partial, counters, T, N, rb, gw, units, warps, w.n_units, lane);
}

// The largest number of segments a row block has for this split (1: no partials), for the
// partials' size: scratch f32 [tma_max_segments, T, NB * 16].
inline int tma_max_segments(int N, int n_units, int sms, int nt) {
  const int64_t nb = (N + 15) / 16, units = nb * n_units, warps = sk_warps(int64_t(sms) * tma_warps(nt), units);
  int most = 1;
  for (int64_t rb = 0; rb < nb; ++rb)
    most = std::max<int>(most, static_cast<int>(sk_owner((rb + 1) * n_units - 1, units, warps) -
                                                sk_owner(rb * n_units, units, warps) + 1));
  return most;
}

// The kernel's dynamic shared-memory limit raised to the SM's opt-in one; once per kernel.
template <int NT, bool XSmem>
void tma_kernel_ready() {
  static const bool done = [] {
    auto* kernel = qgemv_tma_kernel<NT, XSmem>;
    int dev = 0, max_smem = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaFuncAttributes attr{};
    CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    max_smem - static_cast<int>(attr.sharedSizeBytes)));
    return true;
  }();
  (void)done;
}

// The opt-in shared memory of a block beside the kernel's static shared memory (asked once).
inline size_t tma_smem_limit() {
  static const size_t n = [] {
    int dev = 0, max_smem = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return static_cast<size_t>(max_smem) - 64;  // the static `is_last` of store_results and alignment
  }();
  return n;
}

// XSmem where x fits beside the rings (and x_smem_allowed). partial: scratch of tma_max_segments.
template <int NT>
void launch_tma(const W4Tiled& w, const __nv_bfloat16* x, const OutParts& out, float* partial, int* counters, int sms,
                int T, int N, int K, bool x_smem_allowed, cudaStream_t s) {
  const size_t ring = tma_ring_bytes(NT, w.unit_bytes), with_x = ring + tma_x_bytes(T, K);
  const dim3 grid(sms), block(tma_warps(NT) * 32);
  if (x_smem_allowed && with_x <= tma_smem_limit()) {
    tma_kernel_ready<NT, true>();
    launch_kernel("qgemv_tma", qgemv_tma_kernel<NT, true>, grid, block, with_x, s, w, x, out, partial, counters, T, N,
                  K);
    return;
  }
  tma_kernel_ready<NT, false>();
  launch_kernel("qgemv_tma", qgemv_tma_kernel<NT, false>, grid, block, ring, s, w, x, out, partial, counters, T, N, K);
}

}  // namespace ds::cuda::qgemv
