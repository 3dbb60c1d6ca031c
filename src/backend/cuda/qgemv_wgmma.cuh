// Device code of the W4A16 GEMM on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a)
// for 33 to 128 tokens a launch (batched decode from 33 sequences, the 128-token slices of mixed
// and prefill steps): out bf16 [T, N] = x bf16 [T, K] . W^T, fp32 accumulation. It is the wide
// GEMV (qgemv_wide.cuh) with another inner loop: the same stages (a unit of a 256-row tile's
// weights and the inputs of its 4 chunks, by the copy engine, 2 in flight), the same stream-K
// deal and partial sums, the same epilogue (store_row_block). Only the tensor-core work differs:
//
// - A (weights) from registers: wgmma.m64nNk16 takes a warp's A operand in the mma.m16n8k16
//   layout, but for one k-step of 16 contiguous columns, while the tiled layout gives lane q of a
//   quad the chunk's columns [16 q, 16 q + 16) (qgemv_kernel.cuh). So lane (g, q) reads the uint4
//   of lane (g, J) for k-step J from shared memory and takes its words q / 2 and q / 2 + 2, the
//   nibbles of columns 16 J + 2 q (+1) and 16 J + 2 q + 8 (+9) of rows g and g + 8, into one word
//   of the usual nibble order with one byte permute.
// - Scales in fp32: A holds the exact codes (q - 8); a chunk's 4 k-steps of one m64 tile and 64
//   tokens sum into a second accumulator, which is scaled into the first (the fp32 math of the
//   dequantised weights, as the mma.sync GEMVs give). At 64 tokens a launch the chunks of one
//   group (2 at group 128) sum into it before their scale is applied once: C64 at 1k 19.44-19.48
//   against 20.19-20.21 ms scaling each chunk's, H100 (docs/perf/2026-12-06-s66-cuda-27b.md).
//   Folding the scale into A instead (bf16 (q - 8) times the scale in bf16, one wgmma chain a
//   chunk) was a little faster (a 128-token step 27.1 against 29.2 ms, H100) but put a bf16
//   rounding on every weight, which took the tiny W4A16 fixture's logits past the bf16 tolerance
//   (rel_rms 0.040 against a bound of 0.035); in fp16 (s65) it was slower (C64 20.84 against
//   19.44-19.48 ms, a 128-token step 27.5 against 25.1; 2026-12-05-s65-wgmma-f16.patch).
// - B (inputs) from shared memory: each chunk's inputs lie as the copy engine's 128-byte swizzle
//   writes them, [tokens][64 columns], which is wgmma's K-major layout with that swizzle; a k-step
//   is the chunk's descriptor advanced by 32 bytes, the second 64 tokens 8 KB further.
//
// A block holds the tile's 4 m64 tiles (warp w of a warpgroup: row block 4 t + w of m64 tile t)
// of 8 NT tokens (NT 8 or 16: one or two halves of 64), M of them a warpgroup: at 64 tokens 4
// warpgroups of one tile (126 registers a thread), at 128 tokens 2 of two (254 registers: its
// accumulators of 128 tokens would not fit the 128 a thread of 4 warpgroups). Per chunk each
// warpgroup builds its A operands, then per (m64 tile, half) issues 4 wgmma, waits and scales; the
// warpgroups overlap one's waits and scaling with the others' tensor-core work. 4 warpgroups
// against 2 at 64 tokens: C48 19.39-19.41 ms against 20.18-20.19, C64 21.12-21.15 against
// 21.93-21.96 (H100, docs/perf/2026-12-05-s63-cuda-27b.md).
// At 9-32 tokens the mma.sync wide kernel stays faster (C16 10.6 against 12.3 ms, verify 16 10.0
// against 11.7; H100, docs/perf/2026-12-05-s62-cuda-27b.md).
#pragma once

#include <cuda.h>

#include "backend/cuda/qgemv_wide.cuh"

namespace ds::cuda::qgemv {

constexpr int kWgmmaMinTokens = 33;  // fewer take the mma.sync wide kernel
constexpr int kWgmmaTiles = 16;      // the most token tiles of 8 a launch: 128 tokens

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// The descriptor of a K-major bf16 B operand in shared memory with the 128-byte swizzle: rows of
// 128 bytes, 8-row groups 1024 bytes apart (the stride); start address >> 4 in bits 0-13, the
// (unused) leading offset 1 in bits 16-29, the stride >> 4 in bits 32-45, swizzle mode 1 (128 B)
// in bits 62-63.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void* p) {
  return uint64_t((smem_u32(p) & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// d (f32, the m16n8 accumulator layout per n-tile of 8) = (accumulate ? d : 0) + a (bf16x2, the
// warp's 16 rows of one k-step) . B (the descriptor's 16 columns of 64 rows), A from registers.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate)
      : "memory");
}

// Keeps registers live (and their values unmoved) up to this point: wgmma reads its A registers
// and writes its accumulators after the instruction that issues it, until its group is waited for.
__device__ __forceinline__ void wgmma_keep(const uint32_t (&a)[4]) {
  asm volatile("" ::"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]) : "memory");
}
__device__ __forceinline__ void wgmma_keep(float (&d)[8][4]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
    asm volatile("" : "+f"(d[nt][0]), "+f"(d[nt][1]), "+f"(d[nt][2]), "+f"(d[nt][3])::"memory");
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The kernel's parameters are the wide kernel's (qgemv_wide_kernel), S = kWideStages; its stages
// hold inputs for all 8 NT token rows (wide_smem_bytes(8 NT, ...)), since wgmma reads them all
// (those past T hold stale values whose outputs are never stored). M: m64 tiles a warpgroup, so
// 4 / M warpgroups a block (wgmma_threads). At 64 tokens a tile, windows of 1 << w.slot_shift
// chunks (one group's) sum into the sums accumulator before their scale is applied once; the
// 128-token form scales each chunk's sums, as the other forms do. Built for sm_90a only:
// elsewhere it traps, and the launcher never picks it (w4a16.cu).
__host__ __device__ constexpr int wgmma_threads(int M) { return 4 / M * 128; }
template <int NT, int M>
__global__ void __launch_bounds__(wgmma_threads(M), 1)
    qgemv_wgmma_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap, W4Tiled w,
                       OutParts out, float* __restrict__ partial, int* __restrict__ counters, WideDeal deal, int T,
                       int N, int S) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kWideTileBlocks == 16, "four m64 tiles a tile");
  static_assert(NT == 8 || NT == 16, "halves of 64 tokens");
  static_assert(M == 1 || M == 2, "one or two m64 tiles a warpgroup");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // wgmma reads all 8 NT rows
  const WideStages st(smem_raw, &wmap, &xmap, nullptr, w.unit_bytes, w.n_chunks, 0, deal, T, S, 8 * NT,
                      wgmma_threads(M) / 32);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, wq = warp % 4;
  st.start();

  // Lane (g, q) takes words q / 2 and q / 2 + 2 of the source lane's uint4 and their bytes q % 2
  // and q % 2 + 2 (nibbles of rows g and g + 8).
  const int g = lane / 4, q4 = lane % 4;
  const bool odd_words = q4 >= 2;
  const uint32_t perm = (q4 & 1) ? 0x7351u : 0x6240u;
  float acc[M][NT][4] = {};
  // The warp's row block of its m64 tile m in the tile (a stage's weights).
  auto local_rb = [&](int m) { return (wg * M + m) * 4 + wq; };

  float sums[8][4] = {};  // one m64 tile's sums of a window of chunks for 64 tokens, before the scales
  // Chunks summed before their scale is applied: 1 << slot_shift of one group at 64 tokens a tile
  // (one m64 tile and one half a warpgroup: sums is not needed between chunks); one elsewhere.
  constexpr bool kWindows = M == 1 && NT == 8;
  const int window = 1 << w.slot_shift;
  // acc[m] += the scales s[m] times sums, for tokens [64 h, 64 h + 64).
  auto scale_into = [&](int m, int h, const float2 (&s)[M]) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      acc[m][8 * h + nt][0] += s[m].x * sums[nt][0];
      acc[m][8 * h + nt][1] += s[m].x * sums[nt][1];
      acc[m][8 * h + nt][2] += s[m].y * sums[nt][2];
      acc[m][8 * h + nt][3] += s[m].y * sums[nt][3];
    }
  };
  // The scales of rows g and g + 8 of chunk c's group, s[m] for m64 tile m.
  auto scales_of = [&](int slot, int c, float2 (&s)[M]) {
#pragma unroll
    for (int m = 0; m < M; ++m)
      s[m] = reinterpret_cast<const float2*>(st.weights(slot, local_rb(m)))[(c >> w.slot_shift) * 8 + g];
  };
  // Chunk c of the stage in slot `slot` into sums (from zero where asked), scaled into acc at once
  // unless windows are on.
  auto chunk = [&](int slot, int c, bool from_zero, const float2 (&s)[M]) {
    uint32_t a[M][4][4];  // bf16x2 [m64 tile][k-step][register]: the codes q - 8
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const unsigned char* unit = st.weights(slot, local_rb(m));
      const uint4* chunk = reinterpret_cast<const uint4*>(unit + w.slots * kSlotBytes + c * kChunkBytes);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint4 v = chunk[4 * g + j];
        const uint32_t word = __byte_perm(odd_words ? v.y : v.x, odd_words ? v.w : v.z, perm);
#pragma unroll
        for (int r = 0; r < 4; ++r) a[m][j][r] = nibbles_to_bf16x2(word >> (4 * r));
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int h = 0; h < NT / 8; ++h) {  // tokens [64 h, 64 h + 64)
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j)  // (rows past N: zeros, never stored)
          wgmma_m64n64k16(sums, a[m][j], wgmma_desc_sw128(st.inputs(slot, c) + 8192 * h + 32 * j),
                          j > 0 || !from_zero);
        wgmma_commit();
        wgmma_wait_all();
#pragma unroll
        for (int j = 0; j < 4; ++j) wgmma_keep(a[m][j]);
        wgmma_keep(sums);
        if constexpr (!kWindows) scale_into(m, h, s);
      }
  };
  for (int i = 0; i < st.n_steps; ++i) {
    const int64_t f = st.f0 + i;
    const int tile = static_cast<int>(f / deal.units), u = static_cast<int>(f % deal.units), slot = i % S;
    const int nch = st.chunks(f);
    st.wait_full(i);
    float2 s[M];
    if constexpr (kWindows) {
#pragma unroll 1
      for (int c0 = 0; c0 < nch; c0 += window) {
        scales_of(slot, c0, s);
        const int c1 = min(c0 + window, nch);
#pragma unroll 1
        for (int c = c0; c < c1; ++c) chunk(slot, c, c == c0, s);
        scale_into(0, 0, s);
      }
    } else {
#pragma unroll 1
      for (int c = 0; c < nch; ++c) {
        scales_of(slot, c, s);
        chunk(slot, c, true, s);
      }
    }
    st.release(i, warp, lane);  // the warp's wgmma have read the slot (waited for above)
    // Partials loaded one at a time: at 128 tokens no registers are left for all of them at once.
    if (u == deal.units - 1 || i == st.n_steps - 1)
      wide_flush<NT, false, M>(acc, tile, deal, partial, counters, out, T, N, lane,
                               [&](int m) { return tile * kWideTileBlocks + local_rb(m); });
  }
#else
  __trap();
#endif
}

}  // namespace ds::cuda::qgemv
