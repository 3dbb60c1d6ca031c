// The W4A16 GEMV's K-slice form: unsplit launches of 1-8 tokens (one token tile) whose K is whole
// units (256 columns), at most kKSliceMaxWarps of them (gate_up's 5,120: 20); and its split form,
// split launches of 2-8 tokens whose splits hold 4-8 whole units (down, qkvz, qkv).
//
// The narrow blocks of qgemv_tma.cuh give each warp a 16-row block over all of K, so every warp
// reads every token's inputs for each unit it sums: at 8 tokens 1 KB of inputs a 512-byte chunk of
// weights, twice the weight bytes, through shared memory or L1. Here warp u of a block holds unit
// u of K of the inputs (as fp16 x / 16, the F16 form) in registers, loaded once after pdl_wait,
// and streams unit u of each of the block's row blocks through its ring of one-unit stages (the
// first asked for before pdl_wait). A row block's sum is its warps' partials (f32, 16 rows x 8
// tokens each, through shared memory), added in warp order by one warp in turn (row block j by
// warp j % warps, kKSliceLag row blocks later, when the others have most likely given theirs), which
// then stores it with the factors of the consumer's scale taken once (store_row_block_scaled).
// kKSliceSlots row blocks' partials are in flight, so a warp waits for the others only when it is
// that many row blocks ahead of the slowest.
//
// On an H100, gate_up at 8 tokens 37.39 against 38.22 us a launch and down after it 22.45 against
// 22.90: verify 8 at 4k 6.932 against 7.032 ms, verify 4 -0.05, C8 -0.08. The first form, where the
// warp giving a row block's last partial summed and stored it, taking the factors each time, took
// 55.8 against 37.4 us: that warp, delayed by the work, gave the next row block's last partial too.
// The split launches of no norm output (qkvz, qkv) on it as well gained nothing more (verify 8
// -0.096, C8 -0.062) (docs/perf/2026-12-06-s77-cuda-27b.md).
// At one token, where reading the inputs once saves nothing, it is the layout that pays: gate_up
// in 132 blocks of 20 warps, every SM the same 16-17 row blocks, where the narrow blocks (242 of 9
// warps) leave 110 SMs with two blocks and 22 with one. On an H100 C1 at 1k 5.936-5.945 against
// 6.062-6.071 ms. The split form at one token (down, qkvz, qkv) was no faster: 6.079
// (docs/perf/2026-12-07-s80-cuda-27b.md).
//
// Its split form (qgemv_kslice_split_kernel: split launches of 2-8 tokens whose splits hold 4-8
// units, down, qkvz and qkv) keeps the split launches' grid, tiles of 8 row blocks by splits of K,
// and their split-K epilogue (store_results: the partials, the tile's counter, the last block's
// sums and the norm), but turns each block around the same way: warp u holds unit u of the
// block's split of K of the inputs in registers, loaded once, and streams that unit of each of the
// tile's row blocks, rather than each warp a row block over the split, reading the staged inputs
// of every token for each unit (and the block first staging them). The warps' partials of the
// tile's row blocks meet in shared memory once, after the last; warp r then adds row block r's
// and hands it to store_results. On an H100 verify 8 at 4k 6.740 against 6.909 ms (down 19.92
// against 22.42 us a launch, qkvz 18.20 against 19.48), verify 4 6.424 against 6.526, C8 7.212
// against 7.377, one token even.
#pragma once

#include <algorithm>

#include "backend/cuda/qgemv_tma.cuh"

namespace ds::cuda::qgemv {

constexpr int kKSliceUnitCols = kUnitChunks * kChunk;  // 256
constexpr int kKSliceMaxWarps = 20;
constexpr int kKSliceStages = 2;  // one-unit stages a warp
constexpr int kKSliceSlots = 4;   // row blocks' partials in flight
constexpr int kKSliceLag = 2;     // row blocks between giving a partial and summing a row block
static_assert(kKSliceLag < kKSliceSlots, "a row block is summed before its slot is needed again");

// Whether a launch of K columns can take the K-slice kernel: one unit a warp, whole units.
inline bool kslice_fits(int K) { return K % kKSliceUnitCols == 0 && K / kKSliceUnitCols <= kKSliceMaxWarps; }

// A block's shared memory: mbarriers u64 [warps][stages] (a stage landed), [slots] (a slot's row
// block's partials all given) and [slots] (its row block stored), the rings u8 [warps][stages][unit]
// (kRingAlign-aligned), the partials f32x4 [slots][warps][32 lanes].
inline size_t kslice_smem_bytes(int warps, int unit_bytes) {
  return mbar_array_bytes(int64_t(warps) * kKSliceStages + 2 * kKSliceSlots) + kRingAlign +
         size_t(warps) * kKSliceStages * unit_bytes + size_t(kKSliceSlots) * warps * 32 * sizeof(float4);
}

// The lane's inputs of unit `unit` of K as the F16 form takes them: xv[u][0][h] = columns
// [8h, 8h + 8) of its 16 in chunk u, in the row of its token (lanes past T read the last token's;
// their columns are never stored). x: bf16 [T, K], or with Copy a producer's fp16 copy of x / 16.
template <bool Copy>
__device__ __forceinline__ void kslice_unit_inputs(const __nv_bfloat16* __restrict__ x, int T, int K, int unit,
                                                   int lane, uint4 (&xv)[kUnitChunks][1][2]) {
  const int t = min(lane / 4, T - 1);
  const __nv_bfloat16* const xs[1] = {x + int64_t(t) * K + unit * kKSliceUnitCols + 16 * (lane % 4)};
  load_inputs<1, kUnitChunks, false>(xs, 0, xv);
  if constexpr (!Copy) {
#pragma unroll
    for (int u = 0; u < kUnitChunks; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h) xv[u][0][h] = bf16x8_to_f16x8_16th(xv[u][0][h]);
  }
}

// A landed one-unit stage of a warp's ring summed into acc (zeroed here): its codes and scales
// into registers, then refill(after) (lane 0 asks for the slot's next unit, after as in
// qgemv_tma_kernel: the narrow blocks' early refill), then the sums. soff: chunk u's scales.
template <class Refill>
__device__ __forceinline__ void kslice_stage_sums(const W4Tiled& w, const unsigned char* stage, int lane, int T,
                                                  const int (&soff)[kUnitChunks],
                                                  const uint4 (&xv)[kUnitChunks][1][2], Refill refill,
                                                  float (&acc)[1][4]) {
  uint4 wv[kUnitChunks];
  float2 sv[kUnitChunks];
  chunk_codes<kUnitChunks>(reinterpret_cast<const uint4*>(stage + w.slots * kSlotBytes),
                           reinterpret_cast<const float2*>(stage), 0, lane, soff, wv, sv);
  __syncwarp();
  refill(landed_zero(wv, sv, T));
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[0][i] = 0.f;
#pragma unroll
  for (int c = 0; c < kUnitChunks; c += 2)
    chunk_sums<1, 2, true>(reinterpret_cast<const uint4(&)[2]>(wv[c]), reinterpret_cast<const float2(&)[2]>(sv[c]),
                           reinterpret_cast<const uint4(&)[2][1][2]>(xv[c]), acc);
}

// x: bf16 [T, K], or with Copy a producer's fp16 copy of x / 16 [T, K]. K / 256 warps a block; the
// blocks take consecutive ranges of the (N + 15) / 16 row blocks.
template <bool Copy>
__global__ void __launch_bounds__(kKSliceMaxWarps * 32, 1)
    qgemv_kslice_kernel(W4Tiled w, const __nv_bfloat16* __restrict__ x, OutParts out, int T, int N, int K) {
  constexpr int S = kKSliceStages, D = kKSliceSlots, L = kKSliceLag;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_raw);  // [warps][S]
  uint64_t* given = full + warps * S;                      // [D]
  uint64_t* stored = given + D;                            // [D]
  const uint32_t smem_base = smem_u32(smem_raw);
  unsigned char* rings =
      smem_raw +
      (((smem_base + mbar_array_bytes(warps * S + 2 * D) + kRingAlign - 1) & ~(kRingAlign - 1)) - smem_base);
  float4* parts = reinterpret_cast<float4*>(rings + warps * S * w.unit_bytes);  // [D][warps][32]
  const int row_blocks = (N + 15) / 16;
  const int rb0 = static_cast<int>(int64_t(blockIdx.x) * row_blocks / gridDim.x);
  const int n_rb = static_cast<int>(int64_t(blockIdx.x + 1) * row_blocks / gridDim.x) - rb0;
  uint64_t* const my_full = full + warp * S;
  unsigned char* const my_ring = rings + warp * S * w.unit_bytes;
  // Unit `warp` of the block's row block j into slot j % S (after: as in qgemv_tma_kernel): the
  // warp's first unit and the step between row blocks taken once, not the unit's offset each time.
  const unsigned char* const my_units = w.unit(rb0, warp);
  const int64_t rb_step = w.unit_offset(1, 0);  // bytes from a unit to the next row block's
  auto request = [&](int j, uint32_t after = 0) {
    const int slot = j % S;
    const uint32_t bytes = static_cast<uint32_t>(w.unit_bytes) + after;
    mbar_arrive_expect_tx(&my_full[slot], bytes);
    bulk_copy_g2s(my_ring + slot * w.unit_bytes, my_units + j * rb_step, bytes, &my_full[slot]);
  };
  if (lane == 0) {
    for (int i = 0; i < S; ++i) mbar_init(&my_full[i], 1);
    if (warp == 0) {
      for (int d = 0; d < D; ++d) {
        mbar_init(&given[d], warps);
        mbar_init(&stored[d], 1);
      }
    }
    mbar_init_fence();
    for (int j = 0; j < min(S, n_rb); ++j) request(j);
  }
  __syncthreads();  // the slots' barriers before any warp gives a partial
  pdl_wait();       // x and the norm's sums come from the previous kernel; out may still be read by it
  pdl_trigger();

  uint4 xv[kUnitChunks][1][2];  // the lane's inputs of the warp's unit
  kslice_unit_inputs<Copy>(x, T, K, warp, lane, xv);
  float r0, r1;  // the consumer's factors of the lane's tokens 2 q4 and 2 q4 + 1
  lane_row_scales(out, T, lane, r0, r1);
  int soff[kUnitChunks];
#pragma unroll
  for (int u = 0; u < kUnitChunks; ++u) soff[u] = (u >> w.slot_shift) * 8;

  // Row block j's sum, once every warp has given its partial, stored; its slot then freed.
  auto sum_and_store = [&](int j) {
    const int d = j % D;
    mbar_wait(&given[d], (j / D) & 1);
    const float4* const slot_parts = parts + d * warps * 32;
    float4 s = slot_parts[lane];
    for (int v = 1; v < warps; ++v) {
      const float4 p = slot_parts[v * 32 + lane];
      s.x += p.x;
      s.y += p.y;
      s.z += p.z;
      s.w += p.w;
    }
    const float sum[1][4] = {{s.x, s.y, s.z, s.w}};
    store_row_block_scaled(sum, out, T, N, rb0 + j, lane, r0, r1);
    __syncwarp();  // every lane has read the slot
    if (lane == 0) mbar_arrive(&stored[d]);
  };
  // The next j at which the warp sums row block j - L: row blocks warp, warp + warps, ... (a count
  // carried, not (j - L) % warps each row block: an integer division by a value known at run time).
  int next_sum = warp + L;
  for (int j = 0; j < n_rb; ++j) {
    const int slot = j % S;
    mbar_wait(&my_full[slot], (j / S) & 1);
    float acc[1][4];
    kslice_stage_sums(w, my_ring + slot * w.unit_bytes, lane, T, soff, xv, [&](uint32_t after) {
      if (lane == 0 && j + S < n_rb) request(j + S, after);
    }, acc);
    // The partial into row block j's slot, once the row block D before it there is stored.
    const int d = j % D;
    if (j >= D) mbar_wait(&stored[d], (j / D - 1) & 1);
    parts[(d * warps + warp) * 32 + lane] = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
    __syncwarp();  // the lanes' partials before lane 0's arrival releases them
    if (lane == 0) mbar_arrive(&given[d]);
    if (j == next_sum) {
      sum_and_store(j - L);
      next_sum += warps;
    }
  }
  for (int j = max(0, n_rb - L); j < n_rb; ++j)
    if (j % warps == warp) sum_and_store(j);
}

// Blocks of the kernel of `warps` warps and `smem` bytes an SM (its shared-memory limit raised on
// first use).
template <bool Copy>
int kslice_blocks_per_sm(int warps, size_t smem) {
  static const int ready = raise_dynamic_smem_limit(reinterpret_cast<const void*>(qgemv_kslice_kernel<Copy>));
  (void)ready;
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_kslice_kernel<Copy>, 32 * warps, smem));
  DS_ASSERT(per_sm >= 1, "W4A16 K-slice GEMV: no block of %d warps and %zu bytes fits an SM", warps, smem);
  return per_sm;
}

// A launch: K / 256 warps a block, as many blocks as fit on the GPU at once (at most one a row
// block), the whole of the shared memory as carveout (the inputs are read through L1 but once).
inline void launch_kslice(const W4Tiled& w, const __nv_bfloat16* x, const __half* x_f16, const OutParts& out, int T,
                          int N, int K, cudaStream_t s) {
  DS_ASSERT(T >= 1 && T <= 8 && kslice_fits(K), "W4A16 K-slice GEMV: T %d, K %d", T, K);
  const int warps = K / kKSliceUnitCols, row_blocks = (N + 15) / 16;
  const size_t smem = kslice_smem_bytes(warps, w.unit_bytes);
  auto go = [&](auto copy) {
    constexpr bool Copy = decltype(copy)::value;
    const dim3 grid(std::min(row_blocks, sm_count() * kslice_blocks_per_sm<Copy>(warps, smem)));
    const __nv_bfloat16* in = Copy ? reinterpret_cast<const __nv_bfloat16*>(x_f16) : x;
    launch_kernel_carveout("qgemv_kslice", qgemv_kslice_kernel<Copy>, grid, dim3(32 * warps), smem, kOneTokenCarveout,
                           s, w, in, out, T, N, K);
  };
  if (x_f16) go(std::true_type{});
  else go(std::false_type{});
}

// The split form: whether a split launch of K columns in `splits` splits takes it: whole units, at
// most kWarps and at least kKSliceSplitMinUnits a split. On the 27B: down (9 splits of 7-8
// units), qkvz and qkv (3 of 6-7), not out_proj and o_proj (9 of 2-3: with them too verify 8 at 4k
// 6.852 against 6.740 ms; and in 3 splits of 8 units, 120 blocks, they took 12.70 and 16.50 us a
// launch against 9.50 and 10.40, H100, docs/perf/2026-12-07-s78-cuda-27b.md).
constexpr int kKSliceSplitMinUnits = 4;
inline bool kslice_split_fits(int K, int splits) {
  const int units = K / kKSliceUnitCols;
  return K % kKSliceUnitCols == 0 && splits > 1 && (units + splits - 1) / splits <= kWarps &&
         units / splits >= kKSliceSplitMinUnits;
}
constexpr int kKSliceSplitStages = 2;

// The split form's shared memory: mbarriers u64 [kWarps][stages], the rings u8 [kWarps][stages]
// [unit] (kRingAlign-aligned), the partials f32x4 [kWarps row blocks][kWarps warps][32 lanes].
inline size_t kslice_split_smem_bytes(int unit_bytes) {
  constexpr int S = kKSliceSplitStages;
  return mbar_array_bytes(kWarps * S) + kRingAlign + size_t(kWarps) * S * unit_bytes +
         size_t(kWarps) * kWarps * 32 * sizeof(float4);
}

// x: bf16 [T, K], or with Copy a producer's fp16 copy of x / 16 [T, K]. Grid (tiles of kWarps row
// blocks, splits of K in whole units); kWarps warps a block, warp u streaming unit u of the
// block's split (warps past the split's units only sum). partial f32 [gridDim.y, T, N] and
// counters as store_results takes them.
template <bool Copy>
__global__ void __launch_bounds__(kWarps * 32, 3)
    qgemv_kslice_split_kernel(W4Tiled w, const __nv_bfloat16* __restrict__ x, OutParts out,
                              float* __restrict__ partial, int* __restrict__ counters, int T, int N, int K) {
  constexpr int S = kKSliceSplitStages;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_raw);  // [kWarps][S]
  const uint32_t smem_base = smem_u32(smem_raw);
  unsigned char* rings =
      smem_raw + (((smem_base + mbar_array_bytes(kWarps * S) + kRingAlign - 1) & ~(kRingAlign - 1)) - smem_base);
  float4* parts = reinterpret_cast<float4*>(rings + kWarps * S * w.unit_bytes);  // [row block][warp][32]
  const int units = K / kKSliceUnitCols;
  const int u0 = static_cast<int>(int64_t(blockIdx.y) * units / gridDim.y);
  const int n_units = static_cast<int>(int64_t(blockIdx.y + 1) * units / gridDim.y) - u0;
  const int rb0 = blockIdx.x * kWarps, n_rb = min(kWarps, (N + 15) / 16 - rb0);
  const bool streams = warp < n_units;
  uint64_t* const my_full = full + warp * S;
  unsigned char* const my_ring = rings + warp * S * w.unit_bytes;
  // Unit u0 + warp of the tile's row block j into slot j % S (after: as in qgemv_tma_kernel).
  auto request = [&](int j, uint32_t after = 0) {
    const int slot = j % S;
    const uint32_t bytes = static_cast<uint32_t>(w.unit_bytes) + after;
    mbar_arrive_expect_tx(&my_full[slot], bytes);
    bulk_copy_g2s(my_ring + slot * w.unit_bytes, w.unit(rb0 + j, u0 + warp), bytes, &my_full[slot]);
  };
  if (lane == 0 && streams) {
    for (int i = 0; i < S; ++i) mbar_init(&my_full[i], 1);
    mbar_init_fence();
    for (int j = 0; j < min(S, n_rb); ++j) request(j);
  }
  __syncwarp();
  pdl_wait();  // x and the norm's sums come from the previous kernel; out may still be read by it
  pdl_trigger();

  if (streams) {
    uint4 xv[kUnitChunks][1][2];  // the lane's inputs of the warp's unit
    kslice_unit_inputs<Copy>(x, T, K, u0 + warp, lane, xv);
    int soff[kUnitChunks];
#pragma unroll
    for (int u = 0; u < kUnitChunks; ++u) soff[u] = (u >> w.slot_shift) * 8;
    for (int j = 0; j < n_rb; ++j) {
      const int slot = j % S;
      mbar_wait(&my_full[slot], (j / S) & 1);
      float acc[1][4];
      kslice_stage_sums(w, my_ring + slot * w.unit_bytes, lane, T, soff, xv, [&](uint32_t after) {
        if (lane == 0 && j + S < n_rb) request(j + S, after);
      }, acc);
      parts[(j * kWarps + warp) * 32 + lane] = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
    }
  }
  __syncthreads();  // every warp's partials of the tile's row blocks
  // Row block rb0 + warp: its split's sum, in warp order, to store_results.
  float acc[1][4] = {};
  if (warp < n_rb) {
    const float4* const rb_parts = parts + warp * kWarps * 32 + lane;
    for (int v = 0; v < n_units; ++v) {
      const float4 p = rb_parts[v * 32];
      acc[0][0] += p.x;
      acc[0][1] += p.y;
      acc[0][2] += p.z;
      acc[0][3] += p.w;
    }
  }
  store_results<1, true>(acc, out, partial, counters, T, N, rb0 + warp, lane);
}

// A split launch of 2-8 tokens on the split form: a block a tile and split.
inline void launch_kslice_split(const W4Tiled& w, const __nv_bfloat16* x, const __half* x_f16, const OutParts& out,
                                float* partial, int* counters, int splits, int T, int N, int K, cudaStream_t s) {
  DS_ASSERT(T >= 1 && T <= 8 && kslice_split_fits(K, splits) && partial,
            "W4A16 K-slice split GEMV: T %d, K %d, %d splits", T, K, splits);
  const size_t smem = kslice_split_smem_bytes(w.unit_bytes);
  const dim3 grid((N + kTileRows - 1) / kTileRows, splits);
  DS_ASSERT(grid.x <= unsigned(kGemvMaxSplitTiles), "W4A16 K-slice split GEMV: %u tiles", grid.x);
  auto go = [&](auto copy) {
    constexpr bool Copy = decltype(copy)::value;
    static const int ready =
        raise_dynamic_smem_limit(reinterpret_cast<const void*>(qgemv_kslice_split_kernel<Copy>));
    (void)ready;
    const __nv_bfloat16* in = Copy ? reinterpret_cast<const __nv_bfloat16*>(x_f16) : x;
    launch_kernel("qgemv_kslice_split", qgemv_kslice_split_kernel<Copy>, grid, dim3(kWarps * 32), smem, s, w, in,
                  out, partial, counters, T, N, K);
  };
  if (x_f16) go(std::true_type{});
  else go(std::false_type{});
}

}  // namespace ds::cuda::qgemv
