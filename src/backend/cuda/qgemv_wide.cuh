// Device code of the W4A16 GEMV for 9 to 64 tokens (verify blocks and batched decode), and of the
// int8 one (the lm_head of such steps): out bf16 [T, N] = x bf16 [T, K] . W^T on bf16 tensor
// cores (mma.m16n8k16, fp32 accumulation), the same fragments and tiled layouts as the one-tile
// GEMVs (qgemv_tma.cuh, qgemv_kernel.cuh), but with the inputs shared by the whole thread block.
//
// Why a kernel of its own: in the one-tile GEMV each warp reads its inputs itself, 2 T bytes per
// 16 rows x 1 column of weights (8x the weight bytes at 32 tokens), and they come from L2, since
// a warp's K range of inputs does not fit the L1 beside the weight rings. Here a tile of 256 rows
// (8 warps of 2 row blocks) takes each stage's inputs once into shared memory, so the block reads
// as many input bytes from L2 as weight bytes from DRAM at 64 tokens.
//
// Work: a stage is one unit (4 chunks, 256 columns) of K for the tile's 16 row blocks: their
// weights (one box copy of a tensor map over the tiled layout) and the inputs' 256 columns of
// all T tokens (a box copy a chunk). (One bulk copy a row block and one a token row, 80 a stage
// at 64 tokens, gave C64 36.1 ms against 30.4.) The (tile, unit) stages of a launch are dealt to
// one block an SM in equal contiguous stretches (stream-K), so a launch takes one wave however N
// falls on the tiles. A tile cut between blocks is summed by the block holding its first units,
// which reaches them last: it adds the others' fp32 partials in block order (results do not
// depend on scheduling). A ring of kWideStages stages stays in flight (full / empty mbarriers):
// thread 0 requests the first, and lane 0 of the warps in turn refills a slot once all eight have
// read it. (A ninth, producer warp would cap the registers at 168 a thread: three warps then
// share a quarter of the register file.)
#pragma once

#include <cuda.h>

#include <algorithm>

#include "backend/cuda/qgemv_kernel.cuh"

namespace ds::cuda::qgemv {

constexpr int kWideWarps = 8;                            // warps a block
constexpr int kWideR = 2;                                // row blocks a warp
constexpr int kWideTileBlocks = kWideWarps * kWideR;     // 16 row blocks: 256 rows a tile
constexpr int kWideThreads = kWideWarps * 32;
// Stages in flight: 2 was faster than 3 or 4 at every token count (C64 29.9 ms against 30.6 with
// 3 and 30.5 with 4 on the H200: docs/perf/2026-12-01-s12-cuda-27b.md).
constexpr int kWideStages = 2;

// The stream-K deal: F = tiles * units stages over G blocks, block b taking [F b / G, F (b + 1) / G).
struct WideDeal {
  int tiles, units, blocks;
  __host__ __device__ int64_t begin(int b) const { return int64_t(tiles) * units * b / blocks; }
  // The block whose stretch holds stage f.
  __host__ __device__ int block_of(int64_t f) const {
    return static_cast<int>(((f + 1) * blocks - 1) / (int64_t(tiles) * units));
  }
  __host__ __device__ int first_block(int tile) const { return block_of(int64_t(tile) * units); }
  __host__ __device__ int n_blocks(int tile) const {
    return block_of(int64_t(tile) * units + units - 1) - first_block(tile) + 1;
  }
};

// A stage: the tile's weights of one unit (rounded up to 1024 bytes), the scales of a format that
// keeps them apart (int8: Int8Tiled::kStagedScaleBytes, a multiple of 1024; 0 for W4A16, whose
// units hold theirs), then the inputs of its 4 chunks, each [x_rows][128 bytes] (the 128-byte
// swizzle wants 1024-byte aligned boxes).
static_assert(Int8Tiled::kStagedScaleBytes == kWideTileBlocks * 2 * 64 && Int8Tiled::kStagedScaleBytes % 1024 == 0,
              "an int8 stage's scales: 2 groups of 16 rows for each of the tile's row blocks");
__host__ __device__ inline int wide_x_rows(int T) { return (T + 7) / 8 * 8; }
__host__ __device__ inline int wide_weight_bytes(int unit_bytes) {
  return (kWideTileBlocks * unit_bytes + 1023) / 1024 * 1024;
}
inline size_t wide_stage_bytes(int T, int unit_bytes, int scale_bytes) {
  return size_t(wide_weight_bytes(unit_bytes)) + scale_bytes + size_t(kUnitChunks) * wide_x_rows(T) * 128;
}
// A block's shared memory: the mbarriers, up to 1024 bytes of alignment, the stages.
inline size_t wide_smem_bytes(int T, int unit_bytes, int scale_bytes = 0) {
  return mbar_array_bytes(2 * kWideStages) + 1024 + kWideStages * wide_stage_bytes(T, unit_bytes, scale_bytes);
}
// What a launch asks for (max_smem: a block's opt-in limit): its stages' `ring` bytes, but at least
// half an SM's, so that no SM takes two blocks while another has none (the deal gives each SM one;
// at 16 tokens two blocks fit an SM by registers and stages alone).
inline size_t wide_launch_smem(size_t ring, int max_smem) { return std::max(ring, size_t(max_smem) / 2 + 1024); }
// The token tiles of 8 of a launch of 9-64 tokens (the kernel's instances: 2, 4, 8).
inline int wide_token_tiles(int T) { return T <= 16 ? 2 : T <= 32 ? 4 : 8; }

// Box copies of a tensor map (cp.async.bulk.tensor) into shared memory, completed on bar.
__device__ __forceinline__ void tensor_copy_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tensor_copy_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2,
                                               uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}

// A launch's stages and its block's stretch of the deal, shared by this kernel and its wgmma form
// (qgemv_wgmma.cuh): S slots after 2 S mbarriers (full: the slot's copies have landed; empty:
// the block's `warps` warps have read it), 1024-byte aligned for the swizzled inputs, each the
// tile's weights of a unit ([16 row blocks][unit_bytes], rounded up to 1024 bytes), then
// scale_bytes of scales (smap's box: int8 weights), then the inputs of its 4 chunks ([x_rows][128
// bytes] each). Stage i of the block is deal stage f0 + i, in slot i % S.
struct WideStages {
  const CUtensorMap* wmap;
  const CUtensorMap* xmap;
  const CUtensorMap* smap;
  WideDeal deal;
  int unit_bytes, n_chunks, scale_bytes;
  int T, S, x_rows, warps, wbytes, stage_bytes, n_steps;
  int64_t f0;
  uint64_t* full;
  uint64_t* empty;
  unsigned char* ring;

  // unit_bytes: a row block's weights of one unit; n_chunks: K / 64.
  __device__ __forceinline__ WideStages(unsigned char* smem, const CUtensorMap* wmap_, const CUtensorMap* xmap_,
                                        const CUtensorMap* smap_, int unit_bytes_, int n_chunks_, int scale_bytes_,
                                        const WideDeal& deal_, int T_, int S_, int x_rows_, int warps_)
      : wmap(wmap_),
        xmap(xmap_),
        smap(smap_),
        deal(deal_),
        unit_bytes(unit_bytes_),
        n_chunks(n_chunks_),
        scale_bytes(scale_bytes_),
        T(T_),
        S(S_),
        x_rows(x_rows_),
        warps(warps_),
        wbytes(wide_weight_bytes(unit_bytes_)),
        stage_bytes(wbytes + scale_bytes_ + kUnitChunks * x_rows_ * 128),
        n_steps(static_cast<int>(deal_.begin(blockIdx.x + 1) - deal_.begin(blockIdx.x))),
        f0(deal_.begin(blockIdx.x)),
        full(reinterpret_cast<uint64_t*>(smem)),
        empty(full + S_),
        // An offset from the shared array rather than an address made from an integer, so that
        // the compiler reads the stages with LDS, not generic loads (C32 14.44-14.53 ms against
        // 14.97-15.02, verify 16 9.69-9.71 against 9.96-9.98; H100, docs/perf/
        // 2026-12-05-s63-cuda-27b.md).
        ring(smem + (((smem_u32(smem) + mbar_array_bytes(2 * S_) + 1023) & ~1023u) - smem_u32(smem))) {}

  __device__ __forceinline__ unsigned char* weights(int slot, int b) const {
    return ring + slot * stage_bytes + b * unit_bytes;
  }
  // Row block b's staged scales (int8: its 2 groups, float2 [2][8 g]).
  __device__ __forceinline__ const float2* scales(int slot, int b) const {
    return reinterpret_cast<const float2*>(ring + slot * stage_bytes + wbytes) + b * 16;
  }
  __device__ __forceinline__ unsigned char* inputs(int slot, int c) const {
    return ring + slot * stage_bytes + wbytes + scale_bytes + c * x_rows * 128;
  }
  __device__ __forceinline__ int chunks(int64_t f) const {
    return min(kUnitChunks, n_chunks - static_cast<int>(f % deal.units) * kUnitChunks);
  }
  // Stage i into slot i % S, by one thread: the tile's weights of the unit (and their scales),
  // then the inputs of its chunks.
  __device__ __forceinline__ void issue_weights(int i) const {
    const int64_t f = f0 + i;
    const int tile = static_cast<int>(f / deal.units), u = static_cast<int>(f % deal.units);
    mbar_arrive_expect_tx(&full[i % S], kWideTileBlocks * unit_bytes + scale_bytes + chunks(f) * T * 128);
    tensor_copy_3d(weights(i % S, 0), wmap, 0, u * (unit_bytes / 64), tile * kWideTileBlocks, &full[i % S]);
    if (scale_bytes)  // smap: f32 [row blocks][groups][16], a box of the unit's 2 groups of 16 row blocks
      tensor_copy_3d(ring + (i % S) * stage_bytes + wbytes, smap, 0, 2 * u, tile * kWideTileBlocks, &full[i % S]);
  }
  __device__ __forceinline__ void issue_inputs(int i) const {
    const int64_t f = f0 + i;
    const int u = static_cast<int>(f % deal.units), nch = chunks(f);
    for (int c = 0; c < nch; ++c)
      tensor_copy_2d(inputs(i % S, c), xmap, (u * kUnitChunks + c) * kChunk, 0, &full[i % S]);
  }
  // The barriers, then the first S stages by thread 0: their weights at once (no kernel writes
  // weights), their inputs after pdl_wait (x comes from the previous kernel; out and partial may
  // still be read by it).
  __device__ __forceinline__ void start() const {
    if (threadIdx.x == 0) {
      for (int i = 0; i < S; ++i) {
        mbar_init(&full[i], 1);
        mbar_init(&empty[i], warps);
      }
      mbar_init_fence();
    }
    __syncthreads();
    const int first = min(S, n_steps);
    if (threadIdx.x == 0)
      for (int i = 0; i < first; ++i) issue_weights(i);
    pdl_wait();
    pdl_trigger();
    if (threadIdx.x == 0)
      for (int i = 0; i < first; ++i) issue_inputs(i);
  }
  __device__ __forceinline__ void wait_full(int i) const { mbar_wait(&full[i % S], (i / S) & 1); }
  // The warp is done with stage i (every lane has read the slot): lane 0 arrives on its empty
  // barrier, and lane 0 of the warps in turn refills the slot with stage i + S once all have.
  __device__ __forceinline__ void release(int i, int warp, int lane) const {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[i % S]);
    if (warp == i % warps && lane == 0 && i + S < n_steps) {
      mbar_wait(&empty[i % S], (i / S) & 1);
      issue_weights(i + S);
      issue_inputs(i + S);
    }
  }
};

// A tile's results, acc[r] the warp's accumulators (m16n8 layout) of row block row_block(r), when
// the block's stretch reaches its last unit or ends. A block holding all of its K stores them.
// Else the block holding its first units (the owner: it reaches them last in its stretch, so the
// others are done by then) waits for the other blocks' partials, adds them to its own in block
// order and stores; the others write partials and arrive on the tile's counter. The accumulators
// are zero after. R: row blocks a warp (the block's threads: kWideTileBlocks / R warps). AllLoads:
// all of a partial's loads in flight at once, else one at a time.
template <int NT, bool AllLoads, int R, class RowBlock>
__device__ __forceinline__ void wide_flush(float (&acc)[R][NT][4], int tile, const WideDeal& deal,
                                           float* __restrict__ partial, int* __restrict__ counters,
                                           const OutParts& out, int T, int N, int lane, RowBlock row_block) {
  constexpr int kThreads = kWideTileBlocks / R * 32;
  const int first = deal.first_block(tile), seg = blockIdx.x - first, segs = deal.n_blocks(tile);
  // A partial is the block's accumulators as they lie in registers: float4 [R * NT][kThreads]
  // (each thread's four of a tile nt), in the slot of the block that writes it. A block writes at
  // most one: every tile of its stretch but the first starts in it, and so is its own.
  auto slot_of = [&](int sg) {
    return reinterpret_cast<float4*>(partial) + int64_t(first + sg) * (R * NT * kThreads) + threadIdx.x;
  };
  if (seg > 0) {
    float4* mine = slot_of(seg);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        mine[(r * NT + nt) * kThreads] = make_float4(acc[r][nt][0], acc[r][nt][1], acc[r][nt][2], acc[r][nt][3]);
    // As store_results: one release arrival for the block after a block barrier.
    __syncthreads();
    if (threadIdx.x == 0) atomic_add_acq_rel_gpu(&counters[tile], 1);
  } else {
    if (segs > 1) {
      if (threadIdx.x == 0) {
        while (load_acquire_gpu(&counters[tile]) < segs - 1) __nanosleep(64);
        counters[tile] = 0;  // every other block has arrived: ready for the next launch
      }
      __syncthreads();  // the other blocks' partials are visible to every thread after it
      for (int sg = 1; sg < segs; ++sg) {
        const float4* theirs = slot_of(sg);
        if constexpr (AllLoads) {
          float4 v[R][NT];
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) v[r][nt] = __ldcg(theirs + (r * NT + nt) * kThreads);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              acc[r][nt][0] += v[r][nt].x;
              acc[r][nt][1] += v[r][nt].y;
              acc[r][nt][2] += v[r][nt].z;
              acc[r][nt][3] += v[r][nt].w;
            }
        } else {
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const float4 v = __ldcg(theirs + (r * NT + nt) * kThreads);
              acc[r][nt][0] += v.x;
              acc[r][nt][1] += v.y;
              acc[r][nt][2] += v.z;
              acc[r][nt][3] += v.w;
            }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) store_row_block<NT>(acc[r], out, T, N, row_block(r), lane);
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][nt][i] = 0.f;
}

// Fmt: W4Tiled or Int8Tiled (qgemv_kernel.cuh: unit_bytes, kStagedScaleBytes, stage_frag,
// a_frag). wmap: the weight's units as u32 [n_rb][units * unit_bytes / 64][16], box
// [16][unit_bytes / 64][16] (one unit of a tile's 16 row blocks; rows past N zero-filled). smap
// (int8 only; else unused): the scales as f32 [n_rb][K / 128][16], box [16][2][16]. xmap: x bf16
// [T][K], box [T][64] (one chunk of every token) with the 128-byte swizzle. partial f32
// [wide_partial_floats], counters i32 [tiles], zero between launches. S = kWideStages (a
// parameter: as a constant, ptxas spills at 8 token tiles). Every block of the launch must be
// resident at once (one an SM, as many as SMs): a tile's owner waits for the other blocks.
template <int NT, class Fmt>
__global__ void __launch_bounds__(kWideWarps * 32, 1)
    qgemv_wide_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                      const __grid_constant__ CUtensorMap smap, Fmt w, OutParts out, float* __restrict__ partial,
                      int* __restrict__ counters, WideDeal deal, int T, int N, int S) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const WideStages st(smem_raw, &wmap, &xmap, &smap, w.unit_bytes, w.n_chunks, Fmt::kStagedScaleBytes, deal, T, S,
                      wide_x_rows(T), kWideWarps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_rb = (N + 15) / 16;
  st.start();

  const int g = lane / 4, q4 = lane % 4;
  // The lane's token rows in a chunk's inputs (lanes past T read the last token's row; their
  // columns are never stored): byte offsets, and the 128-byte swizzle's 16-byte XOR of the row.
  int xrow[NT], xsw[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int t = min(nt * 8 + g, T - 1);
    xrow[nt] = t * 128;
    xsw[nt] = t & 7;
  }
  float acc[kWideR][NT][4] = {};

  for (int i = 0; i < st.n_steps; ++i) {
    const int64_t f = st.f0 + i;
    const int tile = static_cast<int>(f / deal.units), u = static_cast<int>(f % deal.units), slot = i % S;
    const int nch = st.chunks(f);
    const int rb0 = tile * kWideTileBlocks + warp * kWideR;  // the warp's first row block
    st.wait_full(i);
    if (rb0 < n_rb) {
#pragma unroll
      for (int c = 0; c < kUnitChunks; ++c) {
        if (c >= nch) break;
        typename Fmt::Frag fr[kWideR];
#pragma unroll
        for (int r = 0; r < kWideR; ++r)
          fr[r] = w.stage_frag(st.weights(slot, warp * kWideR + r), st.scales(slot, warp * kWideR + r), c, lane);
        float p[kWideR][NT][4] = {};
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // the lane's columns [8h, 8h + 8) of its 16: k-steps 2h, 2h + 1
          uint4 xv[NT];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            xv[nt] = *reinterpret_cast<const uint4*>(st.inputs(slot, c) + xrow[nt] +
                                                     (((2 * q4 + h) ^ xsw[nt]) << 4));
#pragma unroll
          for (int jj = 0; jj < 2; ++jj)
#pragma unroll
            for (int r = 0; r < kWideR; ++r) {
              uint32_t a[4];
              w.a_frag(fr[r], 2 * h + jj, a);
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
                mma_bf16(p[r][nt], a, word_of(xv[nt], 2 * jj), word_of(xv[nt], 2 * jj + 1));
            }
        }
#pragma unroll
        for (int r = 0; r < kWideR; ++r)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            acc[r][nt][0] += fr[r].s.x * p[r][nt][0];
            acc[r][nt][1] += fr[r].s.x * p[r][nt][1];
            acc[r][nt][2] += fr[r].s.y * p[r][nt][2];
            acc[r][nt][3] += fr[r].s.y * p[r][nt][3];
          }
      }
    }
    st.release(i, warp, lane);
    if (u == deal.units - 1 || i == st.n_steps - 1)
      wide_flush<NT, true, kWideR>(acc, tile, deal, partial, counters, out, T, N, lane,
                                   [&](int r) { return tile * kWideTileBlocks + warp * kWideR + r; });
  }
}

// The deal of a launch of N rows and K columns: at most one block an SM. wide_max_segments: the
// most blocks a tile is cut between.
inline WideDeal wide_deal(int N, int K, int sms) {
  WideDeal d;
  d.tiles = ((N + 15) / 16 + kWideTileBlocks - 1) / kWideTileBlocks;
  d.units = (K / kChunk + kUnitChunks - 1) / kUnitChunks;
  d.blocks = static_cast<int>(std::min<int64_t>(int64_t(d.tiles) * d.units, sms));
  return d;
}
inline int wide_max_segments(const WideDeal& d) {
  int m = 1;
  for (int t = 0; t < d.tiles; ++t) m = std::max(m, d.n_blocks(t));
  return m;
}
// The partials' floats (0 when no tile is cut): a slot for each block.
inline int64_t wide_partial_floats(const WideDeal& d, int nt) {
  return wide_max_segments(d) > 1 ? int64_t(d.blocks) * kWideR * nt * 4 * (kWideWarps * 32) : 0;
}

}  // namespace ds::cuda::qgemv
