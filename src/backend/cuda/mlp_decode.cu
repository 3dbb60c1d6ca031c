// The post-mixer half of a decoder layer at one token (Ops::residual_mlp) in one persistent launch:
//   x += y;  h = rms_norm(x) * norm_w;  gated = silu(gate) * up, [gate | up] = h . gate_up^T;
//   out = gated . down^T
// for a paired W4A16 gate_up [2I, H] (WeightRole::kGateUp) and a W4A16 down [H, I], both tiled
// (w4a16.cu). Three launches (the norm, gate_up, down) become one whose weight stream does not stop
// at the boundary between the two linears: each warp's ring of bulk copies runs on from its share
// of gate_up into its share of down while the last gate_up sums are still being made, where separate
// launches drain and refill every ring (the probe of a step's weight stream: docs/perf/
// 2026-12-02-s18-cuda-27b.md).
//
// Work: one block of kMlpWarps warps an SM, all resident (the blocks wait for each other). Each
// linear's units (one 16-row block's 4 chunks, 2,176 bytes at group 128, in the tiled layout's row
// block then unit order) are cut into equal contiguous shares, one a warp, so no SM has twice the
// rows of another. A share may begin or end inside a row block: a warp then leaves its sums of the
// row block in a slot of the partials, and the last of the row block's warps to arrive (a counter a
// row block) adds the slots in warp order, so results do not depend on scheduling. Before gate_up
// every block computes the norm itself from x and y (H values, in shared memory); gate_up's rows are
// paired, so a row block's sums give silu(gate) * up of 8 outputs, stored to `gated` (global). Down
// reads `gated` once every block has counted itself done with gate_up (one arrival a block); block
// 0 then writes x + y back to x, which no block reads any more.
//
// Off by default (mlp_decode_tokens): on the H200 the 27B's C1 step took 6.72-6.75 ms with it
// against 6.00-6.05 with the separate kernels, verify 8 7.89 against 6.91 (docs/perf/
// 2026-12-02-s19-cuda-27b.md). Timed inside the kernel: gate_up streams at 85% of the copy rate
// without its arithmetic and 75% with it; the release comes 2.8-3.3 us after the last block's
// arrival; the rings, full at the barrier, stop asking for copies, so down's stream starts again
// after it and its arithmetic is exposed (about 0.8 us a unit a warp).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/qgemv_tma.cuh"

namespace ds::cuda {

namespace {

using qgemv::kChunk;
using qgemv::kChunkBytes;
using qgemv::kSlotBytes;
using qgemv::kUnitChunks;
using qgemv::W4Tiled;

constexpr int kMlpWarps = 16;      // a block an SM (the probe's best form: 16 warps x 6 stages)
constexpr int kMlpMaxStages = 6;   // a warp's ring, at most
constexpr int kMlpMinStages = 3;
constexpr int kMlpMaxTokens = kMlpDecodeMaxTokens;  // one mma tile
constexpr int kMlpNormPieces = 2;  // 8-column pieces of the norm a thread: H <= 2 x 8 x 512 = 8,192

// One linear of the launch: its weight, its row blocks and where their sums meet.
struct MlpLinear {
  W4Tiled w;
  int rows;         // N
  int row_blocks;   // ceil(N / 16)
  int warps;        // the warps that share it: all, or one a unit where it has fewer units
  int64_t total;    // row_blocks * w.n_units: the units the warps share
  float* partial;   // f32 [row_blocks][max_contrib][T][16]
  int max_contrib;  // the most warps a row block has
  int* counters;    // i32 [row_blocks], zero between launches
};

// Warp g of the W that share a linear takes units [total g / W, total (g + 1) / W) (at least one,
// as W <= total); owner(f) is the warp whose share holds unit f.
__host__ __device__ __forceinline__ int64_t share_begin(int64_t total, int64_t g, int64_t W) { return total * g / W; }
__host__ __device__ __forceinline__ int owner_of(int64_t f, int64_t total, int64_t W) {
  return static_cast<int>(((f + 1) * W - 1) / total);
}

// A warp's place in a linear: unit u of row block rb, moved on a unit at a time (no division).
struct UnitCursor {
  int rb, u;
  __device__ __forceinline__ void next(int units) {
    if (++u == units) u = 0, ++rb;
  }
};
// Warp gw's share of L: its first unit and its count (0 past L.warps).
__device__ __forceinline__ UnitCursor share_of(const MlpLinear& L, int gw, int& count) {
  if (gw >= L.warps) {
    count = 0;
    return UnitCursor{0, 0};
  }
  const int64_t b = share_begin(L.total, gw, L.warps);
  count = static_cast<int>(share_begin(L.total, gw + 1, L.warps) - b);
  return UnitCursor{static_cast<int>(b / L.w.n_units), static_cast<int>(b % L.w.n_units)};
}

// Chunks of unit u of a weight (the last may be short).
__device__ __forceinline__ int unit_chunks_of(const W4Tiled& w, int u) {
  return min(kUnitChunks, w.n_chunks - u * kUnitChunks);
}

// 8 bf16 values of x + y, each sum rounded to bf16 (the residual add as add_rms_norm stores it).
__device__ __forceinline__ uint4 add8(uint4 x, uint4 y) {
  return map_bf16x8(x, y, [](float a, float b) { return to_bf16(a + b); });
}

// The lane's inputs for the chunks of unit u: columns [64 c + 16 q4, + 16) of its chunks c, in its
// token's row (xin: already there), from shared memory (gate_up's normed x) or from global memory
// (down's gated inputs, written by other blocks in this launch before the release the warp has
// acquired: through L1, which holds none of them from before, as no block reads them earlier in
// the launch).
__device__ __forceinline__ void unit_inputs(const __nv_bfloat16* xin, int u, int nc, int lane,
                                            uint4 (&xv)[kUnitChunks][1][2]) {
#pragma unroll
  for (int v = 0; v < kUnitChunks; ++v)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      xv[v][0][h] = *reinterpret_cast<const uint4*>(xin + (u * kUnitChunks + min(v, nc - 1)) * kChunk +
                                                    16 * (lane % 4) + 8 * h);
}

// acc += a unit of nc chunks in a ring slot (its scales, then its chunks), with the lane's inputs xv.
__device__ __forceinline__ void unit_chunks(const unsigned char* unit, const W4Tiled& w, int nc, int lane,
                                            const uint4 (&xv)[kUnitChunks][1][2], const int (&soff)[kUnitChunks],
                                            float (&acc)[1][4]) {
  const auto* scales = reinterpret_cast<const float2*>(unit);
  const auto* chunks = reinterpret_cast<const uint4*>(unit + w.slots * kSlotBytes);
  if (nc == kUnitChunks) {
    qgemv::stage_chunks<1, 2>(chunks, scales, 0, lane, reinterpret_cast<const uint4(&)[2][1][2]>(xv[0]), soff, acc);
    qgemv::stage_chunks<1, 2>(chunks, scales, 2, lane, reinterpret_cast<const uint4(&)[2][1][2]>(xv[2]), soff, acc);
  } else {
#pragma unroll
    for (int q = 0; q < kUnitChunks - 1; ++q)
      if (q < nc)
        qgemv::stage_chunks<1, 1>(chunks, scales, q, lane, reinterpret_cast<const uint4(&)[1][1][2]>(xv[q]), soff, acc);
  }
}

// The warp's sums of row block rb to their outputs: acc[0][i] of lane (g, q4) holds row 16 rb + g
// (+ 8 for i >= 2) of token 2 q4 + (i & 1). Directly when the warp has the whole row block, else
// through the partials f32 [max_contrib][T][16] of the row block (the last of its warps to arrive
// adds them in warp order). Swiglu: rows g and g + 8 are the gate and up of output 8 rb + g (a
// paired weight), stored as silu(gate) * up to out bf16 [T][rows / 2]; else out bf16 [T][rows].
template <bool Swiglu>
__device__ __forceinline__ void flush_row_block(const MlpLinear& L, int rb, const float (&acc)[1][4], int gw, int T,
                                                int lane, __nv_bfloat16* out) {
  const int U = L.w.n_units, g = lane / 4, q4 = lane % 4;
  const int first = owner_of(int64_t(rb) * U, L.total, L.warps);
  const int last = owner_of(int64_t(rb) * U + U - 1, L.total, L.warps);
  auto store = [&](int t, int r, float a, float b) {  // rows r, r + 8 of the row block, token t
    if constexpr (Swiglu) {
      out[int64_t(t) * (L.rows / 2) + rb * 8 + r] = swiglu_bf16(to_f32(to_bf16(a)), to_f32(to_bf16(b)));
    } else {
      __nv_bfloat16* o = out + int64_t(t) * L.rows + rb * 16 + r;
      if (rb * 16 + r < L.rows) o[0] = to_bf16(a);
      if (rb * 16 + r + 8 < L.rows) o[8] = to_bf16(b);
    }
  };
  if (first == last) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (2 * q4 + i < T) store(2 * q4 + i, g, acc[0][i], acc[0][i + 2]);
    return;
  }
  float* slots = L.partial + int64_t(rb) * L.max_contrib * T * 16;
  float* mine = slots + (gw - first) * T * 16;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int t = 2 * q4 + i;
    if (t < T) {
      mine[t * 16 + g] = acc[0][i];
      mine[t * 16 + g + 8] = acc[0][i + 2];
    }
  }
  __syncwarp();  // the lanes' partials before lane 0's release
  int is_last = 0;
  if (lane == 0) {
    is_last = atomic_add_acq_rel_gpu(&L.counters[rb], 1) == last - first;
    if (is_last) L.counters[rb] = 0;  // every warp of the row block has arrived: ready for the next launch
  }
  if (!__shfl_sync(0xffffffffu, is_last, 0)) return;
  const int n = last - first + 1, stride = T * 16;
  // Pair (r, r + 8) of token t a lane, each summed in warp order with kSumBatch partials loaded at
  // once, as the split GEMVs' last block does (down's row blocks have up to 8 warps at the 27B's
  // shapes).
  for (int i = lane; i < T * 8; i += 32) {
    const int t = i / 8, r = i % 8;
    const float a = qgemv::sum_splits<qgemv::kSumBatch>(slots + t * 16 + r, stride, n);
    const float b = qgemv::sum_splits<qgemv::kSumBatch>(slots + t * 16 + r + 8, stride, n);
    store(t, r, a, b);
  }
}

// One block an SM, kMlpWarps warps, for T <= 8 tokens (one mma tile: token t in column t).
// smem: mbarriers u64 [warps][S], the rings u8 [warps][S][slot_bytes], then h bf16 [T][H + 8]
// (16-byte aligned; the rows 16 bytes longer than H so a warp's 8 tokens fall in different banks).
// x, y, out bf16 [T, H]; gated bf16 [T, I]. sync i32 [2]: blocks done with gate_up, blocks done;
// zero between launches (the last block resets them).
template <int S>
__global__ void __launch_bounds__(kMlpWarps * 32, 1)
    mlp_decode_kernel(MlpLinear gu, MlpLinear dn, __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ y,
                      const float* __restrict__ norm_w, float eps, __nv_bfloat16* gated, __nv_bfloat16* __restrict__ out,
                      int* sync, int T, int slot_bytes) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float tok_sums[kMlpWarps][kMlpMaxTokens];
  __shared__ float tok_inv[kMlpMaxTokens];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int H = gu.w.n_chunks * kChunk, I = dn.w.n_chunks * kChunk, nv = H / 8, h_stride = H + 8;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_raw) + warp * S;
  unsigned char* ring = smem_raw + mbar_array_bytes(kMlpWarps * S) + size_t(warp) * S * slot_bytes;
  auto* h = reinterpret_cast<__nv_bfloat16*>(smem_raw + mbar_array_bytes(kMlpWarps * S) +
                                             size_t(kMlpWarps) * S * slot_bytes);
  const int gw = blockIdx.x * kMlpWarps + warp;
  int n0, n1;
  const UnitCursor start0 = share_of(gu, gw, n0), start1 = share_of(dn, gw, n1);
  const int n = n0 + n1;

  // The warp's units in order (its gate_up share, then its down share), unit j into slot j % S.
  int rq_j = 0;
  UnitCursor rq = start0;
  auto request_next = [&] {  // lane 0
    if (rq_j == n0) rq = start1;
    auto issue = [&](const W4Tiled& w) {
      const uint32_t bytes = w.copy_bytes(unit_chunks_of(w, rq.u));
      uint64_t* bar = &full[rq_j % S];
      mbar_arrive_expect_tx(bar, bytes);
      bulk_copy_g2s(ring + (rq_j % S) * slot_bytes, w.unit(rq.rb, rq.u), bytes, bar);
      rq.next(w.n_units);
    };
    if (rq_j < n0) issue(gu.w);  // two calls, not a reference chosen at run time (which puts both in local memory)
    else issue(dn.w);
    ++rq_j;
  };
  if (lane == 0) {
    for (int i = 0; i < S; ++i) mbar_init(&full[i], 1);
    mbar_init_fence();
    while (rq_j < min(S, n)) request_next();  // weights: no kernel writes them
  }
  // The norm weights of the thread's 8-column pieces c = threadIdx.x + k blockDim.x, before pdl_wait
  // (no kernel writes them).
  float4 wv[kMlpNormPieces][2];
#pragma unroll
  for (int k = 0; k < kMlpNormPieces; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < nv) {
      wv[k][0] = __ldg(reinterpret_cast<const float4*>(norm_w) + 2 * c);
      wv[k][1] = __ldg(reinterpret_cast<const float4*>(norm_w) + 2 * c + 1);
    }
  }
  __syncwarp();
  pdl_wait();  // x and y come from the kernels before

  // h = rms_norm(x + y) * norm_w for each token, the sum rounded to bf16 as stored (add_rms_norm's
  // order): each token's sum of squares over the thread's pieces (4 tokens' loads in flight at a
  // time), then the warp's, then the block's in warp order.
  float ss[kMlpMaxTokens] = {};
#pragma unroll
  for (int k = 0; k < kMlpNormPieces; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c >= nv) continue;
#pragma unroll
    for (int t0 = 0; t0 < kMlpMaxTokens; t0 += 4) {
      if (t0 >= T) break;
      uint4 xv[4], yv[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (t0 + q < T) {
          xv[q] = reinterpret_cast<const uint4*>(x)[(t0 + q) * nv + c];
          yv[q] = reinterpret_cast<const uint4*>(y)[(t0 + q) * nv + c];
        }
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (t0 + q < T) {
          const uint4 sv = add8(xv[q], yv[q]);
          const auto* sa = reinterpret_cast<const __nv_bfloat16*>(&sv);
#pragma unroll
          for (int e = 0; e < 8; ++e) ss[t0 + q] += to_f32(sa[e]) * to_f32(sa[e]);
          *reinterpret_cast<uint4*>(h + (t0 + q) * h_stride + 8 * c) = sv;
        }
    }
  }
#pragma unroll
  for (int tt = 0; tt < kMlpMaxTokens; ++tt)
    if (tt < T) {
      const float w_sum = warp_sum(ss[tt]);
      if (lane == 0) tok_sums[warp][tt] = w_sum;
    }
  __syncthreads();
  if (threadIdx.x < T) {
    float sum = 0.f;
    for (int w = 0; w < kMlpWarps; ++w) sum += tok_sums[w][threadIdx.x];
    tok_inv[threadIdx.x] = rsqrtf(sum / H + eps);
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kMlpNormPieces; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c >= nv) continue;
    const float wk[8] = {wv[k][0].x, wv[k][0].y, wv[k][0].z, wv[k][0].w, wv[k][1].x, wv[k][1].y, wv[k][1].z, wv[k][1].w};
    for (int t = 0; t < T; ++t) {
      uint4* p = reinterpret_cast<uint4*>(h + t * h_stride + 8 * c);
      uint4 sv = *p;
      auto* sa = reinterpret_cast<__nv_bfloat16*>(&sv);
      const float inv = tok_inv[t];
#pragma unroll
      for (int e = 0; e < 8; ++e) sa[e] = to_bf16(to_f32(sa[e]) * inv * wk[e]);
      *p = sv;
    }
  }
  __syncthreads();

  const int my_token = min(lane / 4, T - 1);  // the lane's column of the mma: lanes past T repeat the last token
  int soff[kUnitChunks];                      // chunk u's scales, in float2 of its unit
  float acc[1][4] = {};
  auto zero = [&] {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[0][i] = 0.f;
  };
  // Unit j's copy: waited for, then its slot refilled with unit j + S once every lane has read it.
  auto slot_of = [&](int j) {
    mbar_wait(&full[j % S], (j / S) & 1);
    return ring + (j % S) * slot_bytes;
  };
  auto refill = [&](int j) {
    __syncwarp();
    if (lane == 0 && j + S < n) request_next();
  };

  // gate_up: inputs from h (shared memory), outputs silu(gate) * up to gated.
#pragma unroll
  for (int u = 0; u < kUnitChunks; ++u) soff[u] = (u >> gu.w.slot_shift) * 8;
  const __nv_bfloat16* h_row = h + my_token * h_stride;
  UnitCursor c = start0;
  for (int j = 0; j < n0; ++j) {
    if (j > 0 && c.u == 0) {
      flush_row_block<true>(gu, c.rb - 1, acc, gw, T, lane, gated);
      zero();
    }
    const int nc = unit_chunks_of(gu.w, c.u);
    uint4 xv[kUnitChunks][1][2];
    unit_inputs(h_row, c.u, nc, lane, xv);
    unit_chunks(slot_of(j), gu.w, nc, lane, xv, soff, acc);
    refill(j);
    c.next(gu.w.n_units);
  }
  if (n0 > 0) flush_row_block<true>(gu, c.u == 0 ? c.rb - 1 : c.rb, acc, gw, T, lane, gated);
  zero();

  // The block is done with gate_up: one arrival; then every block's gated outputs are waited for.
  __syncthreads();
  if (threadIdx.x == 0) atomic_add_acq_rel_gpu(&sync[0], 1);
  if (lane == 0)
    while (load_acquire_gpu(&sync[0]) < static_cast<int>(gridDim.x)) __nanosleep(32);
  __syncwarp();
  pdl_trigger();  // every block is resident: the next kernel may be scheduled beside the rest
  if (blockIdx.x == 0)  // the residual add, now that no block reads x
    for (int i = threadIdx.x; i < T * nv; i += blockDim.x)
      reinterpret_cast<uint4*>(x)[i] = add8(reinterpret_cast<const uint4*>(x)[i], reinterpret_cast<const uint4*>(y)[i]);

  // down: inputs from gated (global memory), loaded a unit ahead; outputs to out.
#pragma unroll
  for (int u = 0; u < kUnitChunks; ++u) soff[u] = (u >> dn.w.slot_shift) * 8;
  const __nv_bfloat16* gated_row = gated + int64_t(my_token) * I;
  c = start1;
  uint4 xv[kUnitChunks][1][2];
  if (n1 > 0) unit_inputs(gated_row, c.u, unit_chunks_of(dn.w, c.u), lane, xv);
  for (int j = n0; j < n; ++j) {
    if (j > n0 && c.u == 0) {
      flush_row_block<false>(dn, c.rb - 1, acc, gw, T, lane, out);
      zero();
    }
    const int nc = unit_chunks_of(dn.w, c.u);
    UnitCursor after = c;
    after.next(dn.w.n_units);
    uint4 xn[kUnitChunks][1][2];
    if (j + 1 < n) unit_inputs(gated_row, after.u, unit_chunks_of(dn.w, after.u), lane, xn);
    unit_chunks(slot_of(j), dn.w, nc, lane, xv, soff, acc);
    refill(j);
#pragma unroll
    for (int v = 0; v < kUnitChunks; ++v) xv[v][0][0] = xn[v][0][0], xv[v][0][1] = xn[v][0][1];
    c = after;
  }
  if (n1 > 0) flush_row_block<false>(dn, c.u == 0 ? c.rb - 1 : c.rb, acc, gw, T, lane, out);

  // The last block to finish resets the launch's counters (every block has passed the wait above).
  __syncthreads();
  if (threadIdx.x == 0 && atomic_add_acq_rel_gpu(&sync[1], 1) == static_cast<int>(gridDim.x) - 1) {
    sync[0] = 0;
    sync[1] = 0;
  }
}

// The launch's geometry for H, I and T: blocks, ring stages, the largest unit, partial slots.
struct MlpGeometry {
  int blocks = 0, stages = 0, slot_bytes = 0;
  size_t smem = 0;
  int max_contrib_gu = 0, max_contrib_dn = 0;
  int row_blocks_gu = 0, row_blocks_dn = 0, units_gu = 0, units_dn = 0;
  int warps_gu = 0, warps_dn = 0;  // MlpLinear::warps
};

// The most warps any row block of a linear of `row_blocks` x `units` units has, among W warps.
int max_contributors(int row_blocks, int units, int64_t W) {
  const int64_t total = int64_t(row_blocks) * units;
  int most = 1;
  for (int rb = 0; rb < row_blocks; ++rb)
    most = std::max(most, owner_of(int64_t(rb) * units + units - 1, total, W) - owner_of(int64_t(rb) * units, total, W) +
                              1);
  return most;
}

// The kernel of S stages a warp (the most that fit, from kMlpMaxStages down to kMlpMinStages).
template <class F>
void with_stages(int stages, F&& f) {
  switch (stages) {
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: DS_FATAL("mlp_decode: %d stages", stages);
  }
}

// The kernels' dynamic shared-memory limit, raised once (the same for every S).
int smem_limit() {
  static const int limit = [] {
    int l = 0;
    for (int st = kMlpMinStages; st <= kMlpMaxStages; ++st)
      with_stages(st, [&](auto S) { l = raise_dynamic_smem_limit(reinterpret_cast<const void*>(mlp_decode_kernel<S()>)); });
    return l;
  }();
  return limit;
}

MlpGeometry compute_geometry(int H, int I, int group_gu, int group_dn, int T) {
  MlpGeometry g;
  g.slot_bytes = std::max(qgemv::tiled_weight(nullptr, H, group_gu).unit_bytes,
                          qgemv::tiled_weight(nullptr, I, group_dn).unit_bytes);
  const size_t h_bytes = size_t(T) * (H + 8) * sizeof(bf16);
  const size_t per_stage = size_t(kMlpWarps) * (g.slot_bytes + sizeof(uint64_t));
  const size_t limit = smem_limit();
  g.stages = static_cast<int>(std::min<size_t>(kMlpMaxStages, limit > h_bytes + 16 ? (limit - h_bytes - 16) / per_stage : 0));
  g.smem = mbar_array_bytes(int64_t(kMlpWarps) * g.stages) + size_t(kMlpWarps) * g.stages * g.slot_bytes + h_bytes;
  g.blocks = sm_count();
  const int64_t W = int64_t(g.blocks) * kMlpWarps;
  g.row_blocks_gu = 2 * I / 16;
  g.row_blocks_dn = (H + 15) / 16;
  g.units_gu = (H / 64 + kUnitChunks - 1) / kUnitChunks;
  g.units_dn = (I / 64 + kUnitChunks - 1) / kUnitChunks;
  g.warps_gu = static_cast<int>(std::min<int64_t>(W, int64_t(g.row_blocks_gu) * g.units_gu));
  g.warps_dn = static_cast<int>(std::min<int64_t>(W, int64_t(g.row_blocks_dn) * g.units_dn));
  g.max_contrib_gu = max_contributors(g.row_blocks_gu, g.units_gu, g.warps_gu);
  g.max_contrib_dn = max_contributors(g.row_blocks_dn, g.units_dn, g.warps_dn);
  return g;
}

// The geometry of a shape, computed once (max_contributors walks every row block).
MlpGeometry mlp_geometry(int H, int I, int group_gu, int group_dn, int T) {
  static std::mutex mutex;
  static std::map<std::array<int, 5>, MlpGeometry> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const std::array<int, 5> key{H, I, group_gu, group_dn, T};
  auto it = known.find(key);
  if (it == known.end()) it = known.emplace(key, compute_geometry(H, I, group_gu, group_dn, T)).first;
  return it->second;
}

size_t gated_bytes(int I, int T) { return (size_t(T) * I * sizeof(bf16) + 255) / 256 * 256; }

int g_mlp_decode_tokens = [] {
  const char* env = std::getenv("DS_MLP_DECODE_TOKENS");
  const int v = env ? std::atoi(env) : 0;  // off: slower than the separate kernels so far (header)
  DS_ASSERT(v >= 0 && v <= kMlpMaxTokens, "DS_MLP_DECODE_TOKENS must be 0 to %d, not '%s'", kMlpMaxTokens, env);
  return v;
}();

}  // namespace

int mlp_decode_tokens() { return g_mlp_decode_tokens; }
void set_mlp_decode_tokens(int n) {
  DS_ASSERT(n >= 0 && n <= kMlpMaxTokens, "mlp_decode tokens: %d", n);
  g_mlp_decode_tokens = n;
}

bool mlp_decode_supported(int H, int I, int group_gu, int group_dn, int T) {
  if (T < 1 || T > g_mlp_decode_tokens || !w4a16_gemv_tma() || H % 64 != 0 || I % 64 != 0 ||
      H / 8 > kMlpNormPieces * kMlpWarps * 32 ||
      !w4a16_tiled_supports(H, group_gu) || !w4a16_tiled_supports(I, group_dn))
    return false;
  const MlpGeometry g = mlp_geometry(H, I, group_gu, group_dn, T);
  return g.stages >= kMlpMinStages && g.row_blocks_gu + g.row_blocks_dn + 2 <= kMlpDecodeSyncInts;
}

size_t mlp_decode_scratch_bytes(int H, int I, int group_gu, int group_dn, int T) {
  const MlpGeometry g = mlp_geometry(H, I, group_gu, group_dn, T);
  const size_t slots = size_t(g.row_blocks_gu) * g.max_contrib_gu + size_t(g.row_blocks_dn) * g.max_contrib_dn;
  return slots * T * 16 * sizeof(float) + gated_bytes(I, T);
}

void launch_mlp_decode(bf16* x, const bf16* y, const float* norm_w, float eps, const uint32_t* gate_up, int group_gu,
                       const uint32_t* down, int group_dn, int H, int I, int T, bf16* out, void* scratch, int* sync,
                       cudaStream_t s) {
  DS_ASSERT(mlp_decode_supported(H, I, group_gu, group_dn, T), "mlp_decode: H %d, I %d, groups %d, %d, T %d not supported",
            H, I, group_gu, group_dn, T);
  DS_ASSERT(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(scratch) % 16 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(down) % 16 == 0,
            "mlp_decode: x, y, the weights and the scratch must be 16-byte aligned");
  const MlpGeometry g = mlp_geometry(H, I, group_gu, group_dn, T);
  auto* gated = static_cast<bf16*>(scratch);
  float* partial = reinterpret_cast<float*>(static_cast<char*>(scratch) + gated_bytes(I, T));
  const MlpLinear gu{qgemv::tiled_weight(gate_up, H, group_gu),
                     2 * I,
                     g.row_blocks_gu,
                     g.warps_gu,
                     int64_t(g.row_blocks_gu) * g.units_gu,
                     partial,
                     g.max_contrib_gu,
                     sync + 2};
  const MlpLinear dn{qgemv::tiled_weight(down, I, group_dn),
                     H,
                     g.row_blocks_dn,
                     g.warps_dn,
                     int64_t(g.row_blocks_dn) * g.units_dn,
                     partial + size_t(g.row_blocks_gu) * g.max_contrib_gu * T * 16,
                     g.max_contrib_dn,
                     sync + 2 + g.row_blocks_gu};
  with_stages(g.stages, [&](auto S) {
    launch_kernel("mlp_decode", mlp_decode_kernel<S()>, dim3(g.blocks), dim3(kMlpWarps * 32), g.smem, s, gu, dn, x, y,
                  norm_w, eps, gated, out, sync, T, g.slot_bytes);
  });
}

}  // namespace ds::cuda
