// Device code of the W4A16 GEMV whose weights are streamed by the copy unit (TMA, sm_90): the
// same work split, fragments and results as the register GEMV (qgemv_kernel.cuh), fed from a ring
// of shared-memory stages instead of registers.
//
// Each warp streams its own 16-row block (a thread block holds 8 of them, or tma_narrow_warps when
// K is not split: its inputs read through L1, or staged with F16): in the tiled layout (w4a16.cu)
// a block's units are contiguous, each its scales and 4 chunks, so a stage (SU units: 2 at one
// token tile, else 1, and 1 in the blocks of unsplit launches: kNarrowStages) is one bulk copy
// completing on the stage's mbarrier. Lane 0 keeps the warp's ring of stages in flight, the first 2 units (the
// blocks of unsplit launches: all) requested before pdl_wait (no kernel writes weights) while the
// previous kernel runs, and refills a slot as soon as the warp has read it. (A ninth warp issuing
// every copy, so row warps never wait for the copy unit to take one, was slower at one token tile:
// docs/perf/2026-11-29-s6-cuda-27b.md.)
//
// Inputs: with XSmem (one token tile, when they fit beside the ring with 3 blocks an SM, or beside
// a ring of one-unit stages when K is split and more tokens' inputs need the room; in unsplit
// launches of 4-8 tokens given a producer's fp16 copy, beside their narrow blocks' rings) the block
// first copies its inputs for its chunk range into shared memory, which every warp reads (beside
// one-unit rings in two groups, so that warps start on their first stage before the rest lands),
// and may gate them on the way (Gate: silu(x) * xb, rounded to bf16 as silu_mul rounds it, so a
// down_proj of separate gate and up weights needs no kernel of its own); otherwise each
// lane reads them through L1, a stage's before its wait at 4 or more tiles and in unsplit launches.
//
// F16 (one token tile, w4a16_gemv_f16): the inputs are fp16 x / 16, staged so in shared memory (by
// every launch of 1-4 tokens that stages its inputs, then unsplit ones too), or a producer's copy
// (launches of 1-8 tokens given one: read through L1 by unsplit ones, gate_up, and staged as it is
// by those that stage their inputs, qkvz and qkv), and the codes reach the tensor cores as fp16
// 16 q (codes_to_f16), two instructions a 32-bit word fewer than the bf16 form; the sums are the
// same q . x.
//
// W4A8 (A8, one token tile): int8 inputs, each token's 64-column chunk with its own scale (max |x|
// / 127, round to nearest even: ops/act_int8.h is the CPU twin), and the int4 codes made int8 (16
// q) by two logic operations a word, for int8 mma (m16n8k32, exact int32 sums a chunk) where W4A16
// spends about a dozen instructions a word on bf16 values. The inputs are a producer's int8 twin
// (GemvInt8In), read through L1 by the narrow blocks of unsplit launches and copied into shared
// memory by split ones; without a twin, split launches round their inputs as they stage them
// (tma_a8_fits says which launches can).
#pragma once

#include <cstdlib>
#include <type_traits>

#include "backend/cuda/gemv_stamps.cuh"
#include "backend/cuda/qgemv_kernel.cuh"

namespace ds::cuda::qgemv {

// Units a stage and stages a warp: 2 x 2 at one token tile (4,352 bytes a copy at group 128), 1 x 4
// at more (measured on the H200: docs/perf/2026-11-29-s6-cuda-27b.md; read-only probes of these
// rings with 24 warps an SM reach 98-99% of the copy rate, stream_probe.cu).
__host__ __device__ constexpr int stage_units(int nt) { return nt == 1 ? 2 : 1; }
__host__ __device__ constexpr int stages_for(int nt) { return nt == 1 ? 2 : 4; }
// The largest unit (group 64: 4 scale slots).
constexpr int kMaxUnitBytes = kUnitChunks * (kSlotBytes + kChunkBytes);
// The most a block may take for 3 blocks an SM (228 KiB, each block also holding 1 KiB for the
// system and a few bytes of static shared memory).
constexpr size_t kTmaSmemPerBlock3 = 74 * 1024;

// A block's shared memory for S stages of SU units a warp: mbarriers u64 [warps][S], the rings
// u8 [warps][S][SU units] (kRingAlign-byte aligned after the barriers), then the inputs with
// XSmem. The rings were 16-byte aligned after the barriers, where the kernel's static shared
// memory (16 or 32 bytes, by instantiation) put them: in the split launches of 8 warps at 16 bytes
// past a 32-byte boundary. With 32 bytes of static shared memory (their stages 32-byte aligned)
// the split launches at 2-8 tokens made verify 4 and 8 about 0.1 ms faster on an H100
// (docs/perf/2026-12-05-s64-cuda-27b.md). 128-byte aligned, C1 at 1k 6.12-6.14 against 6.26 ms,
// verify 1 / 8 at 4k 6.19-6.22 / 7.13-7.15 against 6.34-6.37 / 7.22-7.26, H100, 3 rounds
// (docs/perf/2026-12-06-s66-cuda-27b.md); the bulk probe streams 4-7% faster at 0 past 128 bytes
// than at 16 or 64.
constexpr uint32_t kRingAlign = 128;
inline size_t tma_ring_bytes_of(int stages, int units, int unit_bytes, int warps) {
  return mbar_array_bytes(int64_t(warps) * stages) + kRingAlign + size_t(warps) * stages * units * unit_bytes;
}
inline size_t tma_ring_bytes(int nt, int unit_bytes, int warps = kWarps) {
  return tma_ring_bytes_of(stages_for(nt), stage_units(nt), unit_bytes, warps);
}
// Warps a block when K is not split (one row block a warp, the rows in order), each warp with its
// own ring of kNarrowStages one-unit stages, asked for whole before pdl_wait. One token: 9 (at
// most 2 blocks an SM; gate_up's 2,176 row blocks in 242 blocks): C1 6.08-6.11 ms against 6.20
// with one-warp blocks on the H200, 17 warps a block (one an SM) 6.16-6.17, 4 warps 6.43
// (docs/perf/2026-12-02-s17-cuda-27b.md); 6 warps 6.04-6.09, 8 warps (272 blocks: 8 past two an SM) 7.18-7.20,
// 12 warps (182 blocks, one an SM) 6.96-6.99 (docs/perf/2026-12-02-s18-cuda-27b.md).
// 2-8 tokens: 17 (128 blocks, one an SM, so every SM streams as many row blocks: verify 8 at 4k
// 6.460-6.481 against 6.507-6.518 ms with 9, verify 4 5.906-5.930 against 5.943-5.978, gate_up
// 32.3 against 33.3 us a launch at 8 tokens; at one token 17 made gate_up 1 us faster but the
// down launch after it 1.4 us slower, C1 5.30-5.31 against 5.26-5.31: H200,
// docs/perf/2026-12-03-s35-cuda-27b.md. Earlier, 9 against one-warp blocks: verify 8 6.89
// against 7.07 ms; 6 warps within 0.05 of 9: docs/perf/2026-12-02-s18-cuda-27b.md), each warp
// with its ring of kNarrowStages. More token tiles (without the wide kernel): one-warp blocks.
// (Those figures are gate_up's, which since s80 takes the K-slice kernel at 1-8 tokens instead,
// qgemv_kslice.cuh; the narrow blocks keep the unsplit launches it does not fit, and
// DS_W4A16_KSLICE=0.)
// env DS_W4A16_NARROW_WARPS = 1 .. kNarrowMaxWarps sets the one-tile launches' warps.
constexpr int kNarrowWarpsOneToken = 9;
constexpr int kNarrowWarpsTokens = 17;
constexpr int kNarrowMaxWarps = 18;
inline int tma_narrow_warps(int T) {
  static const int env_warps = [] {
    const char* env = std::getenv("DS_W4A16_NARROW_WARPS");
    const int v = env ? std::atoi(env) : 0;
    DS_ASSERT(!env || (v >= 1 && v <= kNarrowMaxWarps), "DS_W4A16_NARROW_WARPS must be 1 to %d, not '%s'",
              kNarrowMaxWarps, env);
    return v;
  }();
  if (env_warps > 0) return env_warps;
  return T == 1 ? kNarrowWarpsOneToken : kNarrowWarpsTokens;
}
// The shared-memory carveout (percent, launch_kernel_carveout) of a launch of `blocks` unsplit
// blocks of `smem` bytes at 2-8 tokens: what one wave of them needs on each SM (the driver's 1 KiB
// a block included), so the rest of the SM's 256 KB stays L1 for the inputs they all read. (All
// the shared memory instead: verify 8 at 4k 0.04-0.07 ms slower on the H200, docs/perf/
// 2026-12-03-s29-cuda-27b.md.) At one token the launch takes it all (kOneTokenCarveout), and so
// do the launches of 4-8 tokens that stage a producer's fp16 copy instead (launch_tma).
inline int narrow_carveout(int blocks, size_t smem) {
  const int sms = sm_count(), max_smem = smem_per_sm();
  const int64_t need = int64_t((blocks + sms - 1) / sms) * int64_t(smem + 1024);
  return static_cast<int>(std::min<int64_t>(100, (100 * need + max_smem - 1) / max_smem));
}
// The blocks of unsplit launches at one token tile take one-unit stages, their inputs loaded a
// stage ahead, rather than 2 x 2 units (5 a warp against 2 x 2, measured with one-warp blocks, 17 an
// SM of 11.9 KB with the system's 1 KiB each keeping 185 KB in flight, not 148: docs/perf/
// 2026-12-01-s10-cuda-27b.md; now 9 warps a block, tma_narrow_warps); at 2-8 tokens fewer, so that
// with the carveout of narrow_carveout the L1 keeps room for the 20-80 KB of inputs every warp
// reads (one-warp blocks, 3 stages against 4: verify 8 7.64 against 7.76 ms, C4 7.23 against 7.33
// on the H200; 3 stages at one token were then 0.05 ms slower at C1: docs/perf/
// 2026-12-01-s14-cuda-27b.md). With 2 blocks of 9 warps an SM, 2 stages (80 KB of rings an SM)
// beat 3 (120 KB): verify 8 6.67 against 6.74-6.76 ms, verify 4 6.12 against 6.20-6.22, C8
// 7.04-7.08 against 7.12-7.14, one token unchanged; 4 stages lost 0.2 ms at verify 8, and one
// stage 0.13-0.14 against 2 at verify 2 and 4 (H200, docs/perf/2026-12-02-s25-cuda-27b.md).
// At one token the same 2 stages (40 KB a block of 9 warps) and the whole of the SM's shared
// memory as the carveout: C1 at 1k 5.37-5.40 against 5.42-5.45 ms with 3 stages, C1 at 4k and
// verify 1 0.02-0.03 faster, 2-8 tokens unchanged (H200, docs/perf/2026-12-03-s32-cuda-27b.md;
// a read-only probe of the ring, 9 warps x 2 blocks an SM, reads at 91-94% of the copy rate with
// 2 stages, 78-80% with 3, 83-86% with 4: StreamingCeilings). The shared memory would let a block
// of the split launch after (74 KB) sit beside the two blocks an SM, but the registers do not
// (94 a thread here, 80 in the split kernel's 256 threads). Capped at 80 (no slower), one fits
// beside a block of 17 warps, and down was not faster for it (H200, docs/perf/
// 2026-12-03-s35-cuda-27b.md).
// (3 stages had beaten 5 at one token, C1 5.59-5.62 against 5.64-5.68 ms, and 4 stages lost
// 0.2 ms: docs/perf/2026-12-03-s29-cuda-27b.md.)
constexpr int kNarrowStages = 2;
// Tokens from which unsplit launches given a producer's fp16 copy stage it (launch_tma).
constexpr int kStagedCopyMinTokens = 4;
constexpr int kOneTokenCarveout = 100;
// Units of weights a warp of a block of several warps asks for before pdl_wait (one stage of 2
// units, or 2 of one); the rest of its ring as soon as lane 0 has asked for its first inputs to
// stage, so the copies queue behind them (or right after pdl_wait when the inputs come through
// L1). Rather than after the whole block's staging and its barrier: C1 at 1k 5.267-5.271 against
// 5.303-5.343 ms, qkvz at one token 13.59 against 13.97 us a launch, 2-8 tokens even (H200,
// docs/perf/2026-12-03-s34-cuda-27b.md). The whole ring before the wait put the inputs' loads
// behind up to 209 KB of weight copies an SM (H200: C1 6.41 against 6.25 ms, verify 1 6.46 against
// 6.31; the rest asked for right after pdl_wait instead of after the staging: C1 6.43; no stage
// early: C1 6.64; one-warp blocks, which stage no inputs, gained nothing from fewer early stages:
// docs/perf/2026-12-01-s15-cuda-27b.md). One stage early whatever its size left the one-unit
// rings of 2-8 tokens a single unit: C8 7.73 against 7.61 ms, verify 8 7.19 against 7.10
// (docs/perf/2026-12-01-s16-cuda-27b.md).
constexpr int kUnitsBeforeWait = 2;

// Chunks [c_begin, c_end) of this block's split, in whole units (the last one may be short at
// the end of K).
__device__ __forceinline__ void stage_split_range(int K, int& c_begin, int& c_end) {
  const int n_chunks = K / kChunk, units = (n_chunks + kUnitChunks - 1) / kUnitChunks;
  c_begin = min(n_chunks, static_cast<int>(int64_t(blockIdx.y) * units / gridDim.y) * kUnitChunks);
  c_end = min(n_chunks, static_cast<int>(int64_t(blockIdx.y + 1) * units / gridDim.y) * kUnitChunks);
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

// The lane's codes of V chunks of a stage from chunk u0 (chunks: the stage's u32
// [kUnitChunks][32][4]) and its rows' scales (soff[u]: chunk u's, in float2 of `scales`).
template <int V>
__device__ __forceinline__ void chunk_codes(const uint4* chunks, const float2* scales, int u0, int lane,
                                            const int (&soff)[kUnitChunks], uint4 (&wv)[V], float2 (&sv)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) {
    wv[v] = chunks[(u0 + v) * 32 + lane];
    sv[v] = scales[soff[u0 + v] + lane / 4];
  }
}

// Early refill: 0, computed from one register of each of the slot's loads into wv and sv, so the
// request it is added to waits for all of them to land: a bulk copy's writes to the slot are not
// ordered after the warp's plain loads from it by anything else (the sums that use them come after
// the request). T (> 0) gives the mask a bit the compiler cannot know to be zero. One register a
// load is enough: each wv[v] is one LDS.128 and each sv[v] one LDS.64, whose registers land together.
template <int V>
__device__ __forceinline__ uint32_t landed_zero(const uint4 (&wv)[V], const float2 (&sv)[V], int T) {
  uint32_t d = 0;
#pragma unroll
  for (int v = 0; v < V; ++v) d ^= wv[v].x ^ __float_as_uint(sv[v].x);
  return d & (static_cast<uint32_t>(T) >> 31);
}

// F16: a word's codes (nibbles n = q + 8; A register r from bits 4r .. 4r + 3 and 16 + 4r ..) as
// the mma A registers of fp16 16 q, exact. Registers 0 and 2 (the nibbles at bits 0-3 and 16-19 of
// the word, then of the word shifted by 8) are put into the mantissa of fp16 1024 (1024 + n), then
// 16 (1024 + n) - 16,512; registers 1 and 3 (bits 4-7 and 20-23) come into it as 16 n (fp16's 10
// mantissa bits hold them; bf16's 7 do not, which is why the bf16 form shifts the word for each of
// registers 1-3), then - 1,152. Nine instructions a word against eleven.
__device__ __forceinline__ uint32_t f16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
__device__ __forceinline__ uint32_t f16x2_sub(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ void codes_to_f16(uint32_t w, uint32_t (&a)[4]) {
  constexpr uint32_t k1024 = 0x64006400u, k16 = 0x4C004C00u, kMinus16512 = 0xF408F408u, k1152 = 0x64806480u;
  const uint32_t w8 = w >> 8;
  a[0] = f16x2_fma(and_or<0x000F000Fu>(w, k1024), k16, kMinus16512);
  a[1] = f16x2_sub(and_or<0x00F000F0u>(w, k1024), k1152);
  a[2] = f16x2_fma(and_or<0x000F000Fu>(w8, k1024), k16, kMinus16512);
  a[3] = f16x2_sub(and_or<0x00F000F0u>(w8, k1024), k1152);
}
// F16: 8 bf16 inputs as fp16 x / 16 (bf16x2_to_f16x2_16th).
__device__ __forceinline__ uint4 bf16x8_to_f16x8_16th(uint4 v) {
  return make_uint4(bf16x2_to_f16x2_16th(v.x), bf16x2_to_f16x2_16th(v.y), bf16x2_to_f16x2_16th(v.z),
                    bf16x2_to_f16x2_16th(v.w));
}

// acc += V chunks of codes held in registers (wv, sv: chunk_codes), their k-steps interleaved so
// the V accumulator chains of the tensor cores overlap. xv: their inputs (load_inputs; F16: fp16
// x / 16).
template <int NT, int V, bool F16 = false>
__device__ __forceinline__ void chunk_sums(const uint4 (&wv)[V], const float2 (&sv)[V], const uint4 (&xv)[V][NT][2],
                                           float (&acc)[NT][4]) {
  float p[V][NT][4] = {};
#pragma unroll
  for (int j = 0; j < 4; ++j)  // k-step j: columns 4j.. of the lane's x words (h = j / 2)
#pragma unroll
    for (int v = 0; v < V; ++v) {
      uint32_t a[4];
      const uint32_t word = word_of(wv[v], j);
      if constexpr (F16) {
        codes_to_f16(word, a);
      } else {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = nibbles_to_bf16x2(word >> (4 * r));
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t b0 = word_of(xv[v][nt][j / 2], 2 * (j % 2)), b1 = word_of(xv[v][nt][j / 2], 2 * (j % 2) + 1);
        if constexpr (F16) mma_f16(p[v][nt], a, b0, b1);
        else mma_bf16(p[v][nt], a, b0, b1);
      }
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

// acc += V chunks of a stage (from chunk u0; chunks: the stage's u32 [kUnitChunks][32][4], scales:
// its slots f32 [slots][8][2]), read from the slot as they are summed. soff[u]: chunk u's scales,
// in float2 of `scales`.
template <int NT, int V, bool F16 = false>
__device__ __forceinline__ void stage_chunks(const uint4* chunks, const float2* scales, int u0, int lane,
                                             const uint4 (&xv)[V][NT][2], const int (&soff)[kUnitChunks],
                                             float (&acc)[NT][4]) {
  uint4 wv[V];
  float2 sv[V];
  chunk_codes<V>(chunks, scales, u0, lane, soff, wv, sv);
  chunk_sums<NT, V, F16>(wv, sv, xv, acc);
}

// A8: the int4 codes of word w (nibbles 0, 2, 4, 6: row g; 1, 3, 5, 7: row g + 8; stored q + 8)
// as int8 16 q, rows g and g + 8, columns in the order 0, 2, 1, 3 of the word's 4 (the order the
// int8 inputs follow, int8x4_of).
__device__ __forceinline__ uint32_t codes_row_g(uint32_t w) { return ((w << 4) & 0xF0F0F0F0u) ^ 0x80808080u; }
__device__ __forceinline__ uint32_t codes_row_g8(uint32_t w) { return (w & 0xF0F0F0F0u) ^ 0x80808080u; }

// A8: acc += V chunks of a stage (as stage_chunks, one token tile). xv[v]: the lane's 16 int8
// inputs of chunk u0 + v (its token lane / 4); xs[v]: the chunk's input scales of tokens 2 q4 and
// 2 q4 + 1 (with the 1/16 of the codes).
template <int V>
__device__ __forceinline__ void stage_chunks8(const uint4* chunks, const float2* scales, int u0, int lane,
                                              const uint4 (&xv)[V], const float2 (&xs)[V],
                                              const int (&soff)[kUnitChunks], float (&acc)[1][4]) {
  uint4 wv[V];
  float2 sv[V];
  chunk_codes<V>(chunks, scales, u0, lane, soff, wv, sv);
  int p[V][4] = {};
#pragma unroll
  for (int st = 0; st < 2; ++st)  // mma step st: words 2 st and 2 st + 1 (columns 8 st .. of the lane's 16)
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const uint32_t w0 = word_of(wv[v], 2 * st), w1 = word_of(wv[v], 2 * st + 1);
      const uint32_t a[4] = {codes_row_g(w0), codes_row_g8(w0), codes_row_g(w1), codes_row_g8(w1)};
      mma_s8(p[v], a, word_of(xv[v], 2 * st), word_of(xv[v], 2 * st + 1));
    }
#pragma unroll
  for (int v = 0; v < V; ++v) {
    acc[0][0] += (sv[v].x * xs[v].x) * float(p[v][0]);
    acc[0][1] += (sv[v].x * xs[v].y) * float(p[v][1]);
    acc[0][2] += (sv[v].y * xs[v].x) * float(p[v][2]);
    acc[0][3] += (sv[v].y * xs[v].y) * float(p[v][3]);
  }
}

// The inputs a block copies with XSmem: bf16 [T][x_stride] from the block's first chunk, the rows
// 16 bytes longer than the most chunks a block of `splits` takes from K, so the 8 rows a warp
// reads at once fall in different banks.
inline int tma_x_stride(int K, int splits) {
  const int units = (K / kChunk + kUnitChunks - 1) / kUnitChunks;
  return (units + splits - 1) / splits * kUnitChunks * kChunk + 8;
}
// The rings of an XSmem launch: the one-tile rings (kTwoUnitStages: 2 stages of 2 units a warp)
// or, where the inputs of more tokens leave no room for those and K is split, 2 stages of one
// unit (kOneUnitStages; unsplit launches take one-warp blocks instead), rather than the inputs
// through L1: C2 6.75 against 7.02 ms, C4 7.49 against 7.67, C8 8.26 against 8.40 on the H200
// (docs/perf/2026-12-01-s13-cuda-27b.md).
enum class XSmemForm { kNone, kTwoUnitStages, kOneUnitStages };
constexpr int kOneUnitXSmemStages = 2;
constexpr int kOneUnitGatedMaxTokens = 4;
inline size_t tma_x_rows_bytes(int T, int K, int splits) {
  return size_t(T) * tma_x_stride(K, splits) * sizeof(__nv_bfloat16);
}
// A8: the staged inputs are int8 [T][x8_stride] bytes (16 past the block's most chunks, for the
// banks as above), then their scales f32 [the block's chunks][8 tokens].
inline int tma_x8_stride(int K, int splits) { return (tma_x_stride(K, splits) - 8) + 16; }
inline size_t tma_x8_bytes(int T, int K, int splits) {
  const int chunks = tma_x_stride(K, splits) / kChunk;
  return size_t(T) * tma_x8_stride(K, splits) + size_t(chunks) * 8 * sizeof(float);
}
// A block's shared memory with XSmem (one token tile): the rings and T rows of inputs.
inline size_t tma_x_smem_bytes(XSmemForm form, int T, int K, int splits, int unit_bytes, bool a8 = false) {
  const size_t rings = form == XSmemForm::kOneUnitStages ? tma_ring_bytes_of(kOneUnitXSmemStages, 1, unit_bytes, kWarps)
                                                       : tma_ring_bytes(1, unit_bytes);
  return rings + (a8 ? tma_x8_bytes(T, K, splits) : tma_x_rows_bytes(T, K, splits));
}

// 8 gated inputs: silu(a) * b (GemvGate::kSiluMul), in fp32, rounded to bf16.
template <GemvGate G>
__device__ __forceinline__ uint4 gate8(uint4 a, uint4 b) {
  static_assert(G == GemvGate::kSiluMul, "the one input gate");
  return map_bf16x8(a, b, [](float fa, float fb) { return swiglu_bf16(fa, fb); });
}

// XSmem: the block's inputs for chunks [c_begin, c_end) of every token into x_smem (bf16
// [T][x_stride]), gated on the way with G, by every thread in 16-byte pieces; each thread calls
// after_loads() once, as soon as its first pieces are asked for. Async (ungated inputs beside the
// one-unit rings, 2-8 tokens): by cp.async, all of a thread's pieces in flight
// at once, where a loop of one load and store a piece pays an L2 round trip per 256 pieces (C8
// 8.19 against 8.25 ms, verify 8 7.82 against 7.93 on the H200: docs/perf/
// 2026-12-01-s14-cuda-27b.md). The other forms keep that loop: the one-token rings have a piece
// a thread (cp.async was 0.06 ms slower at C1), and gated inputs loaded in batches before their
// gates gained nothing.
// Async: the first first_chunks (> 0) chunks of every token are copied as a group of their own,
// then the rest, and only the first group is waited for here (the kernel's threads then arrive on
// its x_rest mbarrier once the rest has landed; with F16 each thread first makes its own pieces of
// the rest fp16 in place, convert_staged_rest).
// Convert (F16 from bf16 inputs): staged as fp16 x / 16 (bf16x8_to_f16x8_16th); F16 from a
// producer's fp16 copy (XCopy) stages its bytes as they are.
//
// The async form's pieces [e0, e1) of every token's row (16-byte pieces of its staged columns) that
// this thread copies: f(t, col), piece i = t * w + e advanced by the block's size without a division.
template <class F>
__device__ __forceinline__ void for_thread_pieces(int T, int e0, int e1, F f) {
  const int w = e1 - e0, n = T * w, step = blockDim.x;
  if (n <= 0) return;
  const int dt = step / w, de = step % w;
  int t = threadIdx.x / w, e = threadIdx.x % w;
  for (int i = threadIdx.x; i < n; i += step) {
    f(t, 8 * (e0 + e));
    t += dt;
    e += de;
    if (e >= w) e -= w, ++t;
  }
}
// The async form's first group: its pieces of every token's row.
__device__ __forceinline__ int staged_first_pieces(int c_begin, int c_end, int first_chunks) {
  return min(first_chunks, c_end - c_begin) * kChunk / 8;
}
// F16: this thread's pieces [e0, e1) of the async form (landed) made fp16 x / 16 in place.
__device__ __forceinline__ void convert_staged(__nv_bfloat16* x_smem, int x_stride, int T, int e0, int e1) {
  for_thread_pieces(T, e0, e1, [&](int t, int col) {
    uint4* p = reinterpret_cast<uint4*>(x_smem + t * x_stride + col);
    *p = bf16x8_to_f16x8_16th(*p);
  });
}
// F16: this thread's pieces of the async form's second group, once landed, made fp16 in place.
__device__ __forceinline__ void convert_staged_rest(__nv_bfloat16* x_smem, int x_stride, int T, int c_begin,
                                                    int c_end, int first_chunks) {
  cp_async_wait<0>();
  convert_staged(x_smem, x_stride, T, staged_first_pieces(c_begin, c_end, first_chunks),
                 (c_end - c_begin) * kChunk / 8);
}
template <GemvGate G, bool Async, bool Convert, class AfterLoads>
__device__ __forceinline__ void stage_inputs(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ xb,
                                             __nv_bfloat16* x_smem, int x_stride, int T, int K, int c_begin,
                                             int c_end, int first_chunks, AfterLoads after_loads) {
  const int row = (c_end - c_begin) * kChunk / 8;  // 16-byte pieces of a token's row
  const int total = T * row;
  if constexpr (Async && G == GemvGate::kNone) {
    auto copy_cols = [&](int e0, int e1) {  // one group
      for_thread_pieces(T, e0, e1, [&](int t, int col) {
        cp_async16(x_smem + t * x_stride + col, x + int64_t(t) * K + int64_t(c_begin) * kChunk + col);
      });
      cp_async_commit();
    };
    // The second group is empty when the first holds all the block's chunks.
    const int first = staged_first_pieces(c_begin, c_end, first_chunks);
    copy_cols(0, first);
    copy_cols(first, row);
    after_loads();
    cp_async_wait<1>();
    if constexpr (Convert) convert_staged(x_smem, x_stride, T, 0, first);
  } else {
    bool asked = false;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
      const int t = i / row, e = i % row * 8;
      const int64_t at = int64_t(t) * K + int64_t(c_begin) * kChunk + e;
      uint4 v = __ldg(reinterpret_cast<const uint4*>(x + at)), vb;
      if constexpr (G != GemvGate::kNone) vb = __ldg(reinterpret_cast<const uint4*>(xb + at));
      if (!asked) {  // the thread's first loads are in flight
        after_loads();
        asked = true;
      }
      if constexpr (G != GemvGate::kNone) v = gate8<G>(v, vb);
      if constexpr (Convert) v = bf16x8_to_f16x8_16th(v);
      *reinterpret_cast<uint4*>(x_smem + t * x_stride + e) = v;
    }
    if (!asked) after_loads();
  }
}

// A8: the block's inputs for chunks [c_begin, c_end) of every token, gated with G, quantised
// into x8 (int8 [T][x8_stride]) and xsc (f32 [chunks][8]: max |x| / (127 16) of each token's
// chunk, 0 for tokens from T). A thread takes 8 inputs a piece (a chunk is 8 consecutive lanes,
// which share its maximum by shuffles), stored in the column order 0, 2, 1, 3 of each 4
// (int8x4_of); its kPiecesInFlight pieces' loads are issued before any is used, so a block pays
// one L2 round trip per kPiecesInFlight pieces a thread, not one per piece.
constexpr int kPiecesInFlight = 4;
template <GemvGate G>
__device__ __forceinline__ void stage_inputs8(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ xb,
                                              unsigned char* x8, int x8_stride, float* xsc, int T, int K, int c_begin,
                                              int c_end) {
  const int row = (c_end - c_begin) * kChunk / 8;  // pieces of 8 inputs in a token's row
  const int total = T * row, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < (c_end - c_begin) * 8; i += blockDim.x)
    if (i % 8 >= T) xsc[i] = 0.f;
  // Whole warps take each turn (blockDim.x and row are multiples of 8), for the shuffles.
  for (int base = threadIdx.x - lane; base < total; base += kPiecesInFlight * blockDim.x) {
    uint4 v[kPiecesInFlight], vb[kPiecesInFlight];
#pragma unroll
    for (int b = 0; b < kPiecesInFlight; ++b) {
      const int i = base + b * blockDim.x + lane;
      if (i >= total) continue;
      const int64_t at = int64_t(i / row) * K + int64_t(c_begin) * kChunk + 8 * (i % row);
      v[b] = __ldg(reinterpret_cast<const uint4*>(x + at));
      if constexpr (G != GemvGate::kNone) vb[b] = __ldg(reinterpret_cast<const uint4*>(xb + at));
    }
#pragma unroll
    for (int b = 0; b < kPiecesInFlight; ++b) {
      if (base + b * blockDim.x >= total) break;  // the same for the whole warp
      const int i = base + b * blockDim.x + lane, t = i / row, e = i % row;
      float f[8] = {};
      if (i < total) {
        if constexpr (G != GemvGate::kNone) v[b] = gate8<G>(v[b], vb[b]);
        unpack8(v[b], f);
      }
      float amax = 0.f;
#pragma unroll
      for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(f[k]));
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      if (i >= total) continue;
      *reinterpret_cast<uint2*>(x8 + t * x8_stride + 8 * e) = make_uint2(int8x4_of(f, amax), int8x4_of(f + 4, amax));
      if (e % 8 == 0) xsc[(e / 8) * 8 + t] = int8_input_scale(amax);
    }
  }
}

// A8 from a producer's twin (GemvInt8In): the block's chunks [c_begin, c_end) of xq (i8 [T, K])
// and their scales (xq_scale f32 [T, K / 64]) copied into x8 and xsc as stage_inputs8 lays them
// out, the inputs by cp.async (all of a thread's pieces in flight at once).
__device__ __forceinline__ void stage_twin(const int8_t* __restrict__ xq, const float* __restrict__ xq_scale,
                                           unsigned char* x8, int x8_stride, float* xsc, int T, int K, int c_begin,
                                           int c_end) {
  const int chunks = c_end - c_begin, row = chunks * kChunk / 16;  // 16-byte pieces of a token's row
  for (int i = threadIdx.x; i < T * row; i += blockDim.x) {
    const int t = i / row, e = i % row;
    cp_async16(x8 + t * x8_stride + 16 * e, xq + int64_t(t) * K + int64_t(c_begin) * kChunk + 16 * e);
  }
  cp_async_commit();
  for (int i = threadIdx.x; i < chunks * 8; i += blockDim.x) {
    const int c = i / 8, t = i % 8;
    xsc[i] = t < T ? __ldg(xq_scale + t * (K / kChunk) + c_begin + c) : 0.f;
  }
  cp_async_wait<0>();
}

// partial f32 [gridDim.y, T, N] and counters i32 [gridDim.x] as in qgemv_kernel. XAhead: a full
// stage's inputs are loaded (through L1, or from XSmem's staged rows) before its weights are
// waited for, else per V chunks.
// x_stride: tma_x_stride (XSmem). xb: the gate's second input, bf16 [T, K] like x (with G).
// MaxThreads: kWarps warps, or up to kNarrowMaxWarps (the blocks of unsplit launches at one token).
// A8: int8 inputs, kA8Staged (in shared memory: rounded by stage_inputs8, or with xq set copied
// from a producer's twin by stage_twin; x_stride is then tma_x8_stride, in bytes) or kA8Twin (a
// producer's twin read through L1: xq i8 [T, K], xq_scale f32 [T, K / 64], GemvInt8In).
// F16: the inputs as fp16 x / 16 (staged so, or without XSmem a producer's copy: x then holds fp16)
// and the codes made fp16 (codes_to_f16). XCopy (F16 with XSmem): x is a producer's fp16 copy of
// x / 16 too, staged as it is (the same values the staging would make of x: launch_tma).
constexpr int kA8Staged = 1, kA8Twin = 2;
template <int NT, int MinBlocks, bool XAhead, bool XSmem, GemvGate G = GemvGate::kNone, int SU = stage_units(NT),
          int S = stages_for(NT), int MaxThreads = kWarps * 32, int A8 = 0, bool F16 = false, bool XCopy = false>
__global__ void __launch_bounds__(MaxThreads, MinBlocks)
    qgemv_tma_kernel(W4Tiled w, const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ xb,
                     OutParts out, float* __restrict__ partial, int* __restrict__ counters, int T, int N, int K,
                     int x_stride, const int8_t* __restrict__ xq, const float* __restrict__ xq_scale) {
  static_assert(G == GemvGate::kNone || XSmem, "inputs are gated while they are staged");
  static_assert(A8 != kA8Staged || (XSmem && NT == 1 && !XAhead), "int8 inputs are staged, one token tile");
  static_assert(A8 != kA8Twin || (!XSmem && NT == 1 && G == GemvGate::kNone), "a twin is read through L1");
  static_assert(!XAhead || SU == 1, "inputs ahead of a stage of one unit only");
  static_assert(!F16 || (NT == 1 && A8 == 0), "fp16 inputs at one token tile");
  static_assert(!XCopy || (F16 && XSmem && G == GemvGate::kNone), "a staged fp16 copy is the whole input");
  constexpr bool kConvert = F16 && !XCopy;  // the staged bf16 inputs made fp16
  constexpr int V = NT <= 2 ? 2 : 1;  // chunks interleaved (more tiles bring their own chains)
  constexpr int SC = SU * kUnitChunks;  // chunks a stage
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warps = blockDim.x / 32;  // kWarps, or tma_narrow_warps without split-K
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_raw);  // [warps][S]: the stage's copy has landed
  const uint32_t smem_base = smem_u32(smem_raw);  // past the static shared memory
  unsigned char* rings =
      smem_raw + (((smem_base + mbar_array_bytes(warps * S) + kRingAlign - 1) & ~(kRingAlign - 1)) - smem_base);
  const int stage_bytes = SU * w.unit_bytes;
  __nv_bfloat16* x_smem = reinterpret_cast<__nv_bfloat16*>(rings + warps * S * stage_bytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  DS_STAMP_DECL
  DS_STAMP_BEGIN(w.base, N, K);
  int c_begin, c_end;
  stage_split_range(K, c_begin, c_end);
  const int chunks = c_end - c_begin, n_stages = (chunks + SC - 1) / SC;
  // The chunks of the warp's last stage (SC but where K ends on a short one).
  const int last_chunks = chunks - (n_stages - 1) * SC;
  const int row_warps = min(warps, (N - static_cast<int>(blockIdx.x) * warps * 16 + 15) / 16);  // with rows

  // Stage i of this warp into its slot i % S: units c_begin / kUnitChunks + SU i .. of its 16-row
  // block, which follow each other (the last stage may end on a short unit), so its address is
  // the first stage's plus i stages. Lane 0's request and the loop's bookkeeping are on the warp's
  // path from one unit to the next, which two stages in flight leave exposed: a unit's integer
  // work costs stream rate (docs/perf/2026-12-03-s37-cuda-27b.md).
  const unsigned char* const src0 = w.unit(blockIdx.x * warps + warp, c_begin / kUnitChunks);
  const uint32_t last_bytes = w.copy_bytes(last_chunks);
  uint64_t* const my_full = full + warp * S;
  unsigned char* const my_ring = rings + warp * S * stage_bytes;
  // after: 0, but computed from values the request must wait for (landed_zero).
  auto request = [&](int i, uint32_t after = 0) {
    const int slot = i % S;
    const uint32_t bytes = (i == n_stages - 1 ? last_bytes : static_cast<uint32_t>(stage_bytes)) + after;
    mbar_arrive_expect_tx(&my_full[slot], bytes);
    bulk_copy_g2s(my_ring + slot * stage_bytes, src0 + int64_t(i) * stage_bytes, bytes, &my_full[slot]);
  };
  // Stages asked for before pdl_wait: the whole ring in the blocks of unsplit launches (one warp,
  // or MaxThreads past kWarps warps), which stage no inputs;
  // kUnitsBeforeWait units in the other blocks of several warps, whose other stages follow their
  // inputs (or pdl_wait).
  // Ungated inputs staged beside one-unit rings (2-8 tokens) come in two groups: the first
  // stage's chunks, which the block waits for, and the rest, which each warp waits for on x_rest
  // once its first stage is done (verify 8 at 4k 6.26-6.28 against 6.32-6.34 ms, C8 6.51-6.54
  // against 6.57-6.59, one token unchanged, on the H200; the same wait as a compare in the loop,
  // stage 0 not peeled, gained nothing: docs/perf/2026-12-04-s39-cuda-27b.md).
  constexpr bool kSplitStaging = XSmem && A8 == 0 && SU == 1 && G == GemvGate::kNone;
  __shared__ uint64_t x_rest;
  if (kSplitStaging && threadIdx.x == 0) {
    mbar_init(&x_rest, blockDim.x);
    mbar_init_fence();
  }
  constexpr bool kNarrowBlocks = MaxThreads > kWarps * 32;
  const int ring = min(S, n_stages),
            early = warps == 1 || kNarrowBlocks ? ring : min(ring, max(1, kUnitsBeforeWait / SU));
  if (lane == 0 && warp < row_warps) {
    for (int i = 0; i < S; ++i) mbar_init(&my_full[i], 1);
    mbar_init_fence();
    for (int i = 0; i < early; ++i) request(i);
  }
  __syncwarp();
  pdl_wait();  // x comes from the previous kernel; out and partial may still be read by it
  pdl_trigger();
  DS_STAMP(3, threadIdx.x == 0);

  unsigned char* x8 = reinterpret_cast<unsigned char*>(x_smem);  // A8: int8 [T][x_stride], then
  float* xsc = reinterpret_cast<float*>(x8 + T * x_stride);        // the scales f32 [chunks][8]
  if constexpr (A8 == kA8Staged) {
    if (xq) stage_twin(xq, xq_scale, x8, x_stride, xsc, T, K, c_begin, c_end);
    else stage_inputs8<G>(x, xb, x8, x_stride, xsc, T, K, c_begin, c_end);
    __syncthreads();
  }
  // The rest of the ring (kUnitsBeforeWait): with XSmem once the thread's first inputs are asked for.
  auto request_rest = [&] {
    if (lane == 0 && warp < row_warps)
      for (int i = early; i < ring; ++i) request(i);
  };
  if constexpr (A8 == 0 && XSmem) {
    stage_inputs<G, SU == 1, kConvert>(x, xb, x_smem, x_stride, T, K, c_begin, c_end, SC, request_rest);
    __syncthreads();  // also orders x_rest's init before the arrivals
    if constexpr (kSplitStaging && !kConvert) cp_async_mbar_arrive(&x_rest);
  } else {
    request_rest();
  }
  DS_STAMP(4, threadIdx.x == 0);
  // Input rows: tiles' lanes past T read the last token's row (their columns are never stored).
  const __nv_bfloat16* xs[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int t = min(nt * 8 + lane / 4, T - 1);
    xs[nt] = XSmem ? x_smem + t * x_stride + 16 * (lane % 4)
                   : x + int64_t(t) * K + int64_t(c_begin) * kChunk + 16 * (lane % 4);
  }
  int soff[kUnitChunks];
#pragma unroll
  for (int u = 0; u < kUnitChunks; ++u) soff[u] = (u >> w.slot_shift) * 8;

  float acc[NT][4] = {};
  const int my_stages = warp < row_warps ? n_stages : 0;
  // Unit su of the stage in the warp's ring slot `slot` (0 .. S - 1): its scales, then its chunks.
  auto unit_scales = [&](int slot, int su) {
    return reinterpret_cast<const float2*>(my_ring + slot * stage_bytes + su * w.unit_bytes);
  };
  auto unit_chunks = [&](int slot, int su) {
    return reinterpret_cast<const uint4*>(my_ring + slot * stage_bytes + su * w.unit_bytes + w.slots * kSlotBytes);
  };
  // Whether stage i holds SC chunks (all but a short last one).
  const bool last_whole = last_chunks == SC;
  auto whole = [&](int i) { return i < n_stages - 1 || last_whole; };
  if constexpr (A8 != 0) {
    // The lane's token row (lanes past T read the last token's) and the scales of its tokens 2 q4
    // and 2 q4 + 1 (at most the last), from the block's first chunk; xs_step floats a chunk.
    const unsigned char* x8p;
    const float *xs0, *xs1;
    int xs_step;
    if constexpr (A8 == kA8Staged) {
      x8p = x8 + min(lane / 4, T - 1) * x_stride + 16 * (lane % 4);
      xs0 = xsc + 2 * (lane % 4);
      xs1 = xs0 + 1;
      xs_step = 8;
    } else {
      const int chunks = K / kChunk;
      x8p = reinterpret_cast<const unsigned char*>(xq) + int64_t(min(lane / 4, T - 1)) * K + c_begin * kChunk +
            16 * (lane % 4);
      xs0 = xq_scale + min(2 * (lane % 4), T - 1) * chunks + c_begin;
      xs1 = xq_scale + min(2 * (lane % 4) + 1, T - 1) * chunks + c_begin;
      xs_step = 1;
    }
    auto inputs8 = [&](int q, uint4& xv, float2& xs) {  // chunk q of the stage
      if constexpr (A8 == kA8Staged) {
        xv = *reinterpret_cast<const uint4*>(x8p + q * kChunk);
        xs = *reinterpret_cast<const float2*>(xs0 + q * 8);
      } else {
        xv = __ldg(reinterpret_cast<const uint4*>(x8p + q * kChunk));
        xs = make_float2(__ldg(xs0 + q), __ldg(xs1 + q));
      }
    };
    for (int i = 0; i < my_stages; ++i) {
      const int slot = i % S;
      if (whole(i) && XAhead) {  // the stage's inputs asked for before its weights are waited for
        uint4 xv[SC];
        float2 xs[SC];
#pragma unroll
        for (int q = 0; q < SC; ++q) inputs8(q, xv[q], xs[q]);
        mbar_wait(&my_full[slot], (i / S) & 1);
#pragma unroll
        for (int u0 = 0; u0 < kUnitChunks; u0 += V)
          stage_chunks8<V>(unit_chunks(slot, 0), unit_scales(slot, 0), u0, lane,
                           reinterpret_cast<const uint4(&)[V]>(xv[u0]), reinterpret_cast<const float2(&)[V]>(xs[u0]),
                           soff, acc);
      } else if (whole(i)) {
        mbar_wait(&my_full[slot], (i / S) & 1);
#pragma unroll
        for (int su = 0; su < SU; ++su)
#pragma unroll
          for (int u0 = 0; u0 < kUnitChunks; u0 += V) {
            uint4 xv[V];
            float2 xs[V];
#pragma unroll
            for (int v = 0; v < V; ++v) inputs8(su * kUnitChunks + u0 + v, xv[v], xs[v]);
            stage_chunks8<V>(unit_chunks(slot, su), unit_scales(slot, su), u0, lane, xv, xs, soff, acc);
          }
      } else {  // a warp's last stage, at the end of K: last_chunks < SC
        const int n = chunks - i * SC;  // last_chunks (kept live across the loop instead, it spilled)
        mbar_wait(&my_full[slot], (i / S) & 1);
#pragma unroll
        for (int q = 0; q < SC - 1; ++q)
          if (q < n) {
            uint4 xv[1];
            float2 xs[1];
            inputs8(q, xv[0], xs[0]);
            stage_chunks8<1>(unit_chunks(slot, q / kUnitChunks), unit_scales(slot, q / kUnitChunks), q % kUnitChunks,
                             lane, xv, xs, soff, acc);
          }
      }
      __syncwarp();  // every lane has read the slot before it is refilled
      if (lane == 0 && i + S < my_stages) request(i + S);
      x8p += SC * kChunk;
      xs0 += SC * xs_step;
      xs1 += SC * xs_step;
    }
  } else {
    // Stage i: its weights waited for and added up, its slot refilled.
    auto run_stage = [&](int i) {
      const int slot = i % S;
      bool refilled = false;  // the slot was refilled before the sums (early refill)
      if (whole(i)) {
        if constexpr (XAhead && F16) {
          // Early refill: the stage's codes and scales into registers, its slot refilled, then the
          // sums, so the slot's next copy is in flight during them (a ring of 2 stages otherwise
          // asks for a stage only once the one before it in the slot is summed). F16 only: the
          // bf16 form spilled with it (12 bytes at 96 registers).
          uint4 xv[kUnitChunks][NT][2];
          load_inputs<NT, kUnitChunks, XSmem>(xs, 0, xv);
          mbar_wait(&my_full[slot], (i / S) & 1);
          uint4 wv[kUnitChunks];
          float2 sv[kUnitChunks];
          chunk_codes<kUnitChunks>(unit_chunks(slot, 0), unit_scales(slot, 0), 0, lane, soff, wv, sv);
          __syncwarp();
          if (lane == 0 && i + S < my_stages) request(i + S, landed_zero(wv, sv, T));
          refilled = true;
#pragma unroll
          for (int u0 = 0; u0 < kUnitChunks; u0 += V)
            chunk_sums<NT, V, F16>(reinterpret_cast<const uint4(&)[V]>(wv[u0]),
                                   reinterpret_cast<const float2(&)[V]>(sv[u0]),
                                   reinterpret_cast<const uint4(&)[V][NT][2]>(xv[u0]), acc);
        } else if constexpr (XAhead) {
          uint4 xv[kUnitChunks][NT][2];
          load_inputs<NT, kUnitChunks, XSmem>(xs, 0, xv);
          mbar_wait(&my_full[slot], (i / S) & 1);
#pragma unroll
          for (int u0 = 0; u0 < kUnitChunks; u0 += V)
            stage_chunks<NT, V, F16>(unit_chunks(slot, 0), unit_scales(slot, 0), u0, lane,
                                     reinterpret_cast<const uint4(&)[V][NT][2]>(xv[u0]), soff, acc);
        } else {
          mbar_wait(&my_full[slot], (i / S) & 1);
#pragma unroll
          for (int su = 0; su < SU; ++su)
#pragma unroll
            for (int u0 = 0; u0 < kUnitChunks; u0 += V) {
              uint4 xv[V][NT][2];
              load_inputs<NT, V, XSmem>(xs, su * kUnitChunks + u0, xv);
              stage_chunks<NT, V, F16>(unit_chunks(slot, su), unit_scales(slot, su), u0, lane, xv, soff, acc);
            }
        }
      } else {  // a warp's last stage, at the end of K: last_chunks < SC
        const int n = chunks - i * SC;  // last_chunks (kept live across the loop instead, it spilled)
        mbar_wait(&my_full[slot], (i / S) & 1);
#pragma unroll
        for (int q = 0; q < SC - 1; ++q)
          if (q < n) {
            uint4 xv[1][NT][2];
            load_inputs<NT, 1, XSmem>(xs, q, xv);
            stage_chunks<NT, 1, F16>(unit_chunks(slot, q / kUnitChunks), unit_scales(slot, q / kUnitChunks),
                                     q % kUnitChunks, lane, xv, soff, acc);
          }
      }
      if (!refilled) {
        __syncwarp();  // every lane has read the slot before it is refilled
        if (lane == 0 && i + S < my_stages) request(i + S);
      }
      DS_STAMP(5, i == 0 && threadIdx.x == 0);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) xs[nt] += SC * kChunk;
    };
    int i = 0;
    if constexpr (kSplitStaging) {  // stage 0 reads only the first group of the inputs
      if (my_stages > 0) run_stage(i++);
      if constexpr (kConvert) {
        convert_staged_rest(x_smem, x_stride, T, c_begin, c_end, SC);
        mbar_arrive(&x_rest);
      }
      mbar_wait(&x_rest, 0);
    }
    for (; i < my_stages; ++i) run_stage(i);
  }
  DS_STAMP(6 + warp, lane == 0 && warp < 8);
  // out.norm: every one-tile launch (w4a16_gemv_norms_output, w4a16_gemv_scales_output).
  store_results<NT, NT == 1>(acc, out, partial, counters, T, N, blockIdx.x * warps + warp, lane);
  DS_STAMP(14, threadIdx.x == 0);
}

// The kernel's dynamic shared-memory limit raised to what an SM's opt-in allows beside its static
// shared memory; once per kernel. Returns the GPU's SM count.
template <int NT, int MinBlocks, bool XAhead, bool XSmem, GemvGate G = GemvGate::kNone, int SU = stage_units(NT),
          int S = stages_for(NT), int MaxThreads = kWarps * 32, int A8 = 0, bool F16 = false, bool XCopy = false>
int tma_kernel_ready() {
  static const int sms = [] {
    raise_dynamic_smem_limit(reinterpret_cast<const void*>(
        qgemv_tma_kernel<NT, MinBlocks, XAhead, XSmem, G, SU, S, MaxThreads, A8, F16, XCopy>));
    return sm_count();
  }();
  return sms;
}

// Blocks of the kernel with the inputs read through L1 resident on the whole GPU, for the largest
// unit (which decides the splits; the inputs then fit in shared memory or not); asked once.
template <int NT, int MinBlocks, bool XAhead>
int tma_resident_blocks() {
  static const int n = [] {
    const int sms = tma_kernel_ready<NT, MinBlocks, XAhead, false>();
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_tma_kernel<NT, MinBlocks, XAhead, false>,
                                                             kWarps * 32, tma_ring_bytes(NT, kMaxUnitBytes)));
    return sms * std::max(per_sm, 1);
  }();
  return n;
}

// Whether a launch of NT token tiles stages its inputs in shared memory (XSmem), and with which
// rings: one tile, and the inputs fit beside the rings with 3 blocks an SM. Gated inputs (two
// to read a token) take the one-unit rings up to kOneUnitGatedMaxTokens tokens: at 8 their
// staging cost more than the separate gate kernel and the inputs through L1 (C8 8.50 against
// 8.31 ms on the H200, docs/perf/2026-12-01-s13-cuda-27b.md).
// A8: the same rule for the int8 inputs and their scales.
inline XSmemForm tma_x_smem_form(int nt, int T, int K, int splits, int unit_bytes, bool gated, bool a8 = false) {
  if (nt != 1) return XSmemForm::kNone;
  if (tma_x_smem_bytes(XSmemForm::kTwoUnitStages, T, K, splits, unit_bytes, a8) <= kTmaSmemPerBlock3)
    return XSmemForm::kTwoUnitStages;
  if (splits > 1 && (!gated || T <= kOneUnitGatedMaxTokens) &&
      tma_x_smem_bytes(XSmemForm::kOneUnitStages, T, K, splits, unit_bytes, a8) <= kTmaSmemPerBlock3)
    return XSmemForm::kOneUnitStages;
  return XSmemForm::kNone;
}
inline bool tma_x_smem_fits(int nt, int T, int K, int splits, int unit_bytes, bool gated) {
  return tma_x_smem_form(nt, T, K, splits, unit_bytes, gated) != XSmemForm::kNone;
}

// W4A8 launches that stage int8 inputs: split ones (unsplit launches keep their narrow blocks,
// which read their inputs through L1: staging and rounding all of K in each of them cost more than
// the int8 sums gained, gate_up 30.5 against 29.9 us a launch at one token and 38.9 against 33.3
// at 8 on the H200; they read a producer's twin instead, launch_tma_twin), the inputs beside the
// rings as tma_x_smem_form allows, and when they round the inputs at most kA8MaxTokens tokens (at
// 8 the rounding staging lost: verify 8 at 4k 6.66-6.70 against 6.52-6.53 ms), 8 when they copy a
// twin (docs/perf/2026-12-03-s31-cuda-27b.md).
constexpr int kA8MaxTokens = 4;
inline bool tma_a8_fits(int T, int K, int splits, int unit_bytes, bool gated, bool twin = false) {
  return T >= 1 && T <= (twin ? 8 : kA8MaxTokens) && splits > 1 &&
         tma_x_smem_form(1, T, K, splits, unit_bytes, gated, true) != XSmemForm::kNone;
}

// W4A8: a one-tile split launch whose blocks quantise their inputs to int8 as they stage them
// (gated with `gate` on the way), or copy a producer's twin (a8.q), with the rings of
// tma_x_smem_form; where tma_a8_fits.
template <int MinBlocks>
void launch_tma_a8(const W4Tiled& w, const __nv_bfloat16* x, const __nv_bfloat16* xb, GemvGate gate,
                   const GemvInt8In& a8, const OutParts& out, float* partial, int* counters, int splits, int T,
                   int N, int K, cudaStream_t s) {
  DS_ASSERT(tma_a8_fits(T, K, splits, w.unit_bytes, gate != GemvGate::kNone, a8.q != nullptr),
            "W4A8 GEMV: int8 inputs at %d tokens, K %d, %d splits", T, K, splits);
  const int stride = tma_x8_stride(K, splits);
  const XSmemForm form = tma_x_smem_form(1, T, K, splits, w.unit_bytes, gate != GemvGate::kNone, true);
  const dim3 grid((N + kTileRows - 1) / kTileRows, splits), block(kWarps * 32);
  const size_t smem = tma_x_smem_bytes(form, T, K, splits, w.unit_bytes, true);
  auto go = [&](auto g) {
    constexpr GemvGate G = decltype(g)::value;
    constexpr int Threads = kWarps * 32;
    if (form == XSmemForm::kTwoUnitStages) {
      constexpr int SU = stage_units(1), S = stages_for(1);
      tma_kernel_ready<1, MinBlocks, false, true, G, SU, S, Threads, kA8Staged>();
      launch_kernel("qgemv_tma", qgemv_tma_kernel<1, MinBlocks, false, true, G, SU, S, Threads, kA8Staged>, grid, block,
                    smem, s, w, x, xb, out, partial, counters, T, N, K, stride, a8.q, a8.scale);
    } else {
      constexpr int S = kOneUnitXSmemStages;
      tma_kernel_ready<1, MinBlocks, false, true, G, 1, S, Threads, kA8Staged>();
      launch_kernel("qgemv_tma", qgemv_tma_kernel<1, MinBlocks, false, true, G, 1, S, Threads, kA8Staged>, grid, block,
                    smem, s, w, x, xb, out, partial, counters, T, N, K, stride, a8.q, a8.scale);
    }
  };
  if (gate == GemvGate::kSiluMul) go(std::integral_constant<GemvGate, GemvGate::kSiluMul>{});
  else go(std::integral_constant<GemvGate, GemvGate::kNone>{});
}

// W4A8 from a producer's twin (a8.q, GemvInt8In) in an unsplit launch: the narrow blocks of
// launch_tma, reading the int8 inputs through L1 a stage ahead. (Split launches copy the twin into
// shared memory: launch_tma_a8.)
template <int MinBlocks>
void launch_tma_twin(const W4Tiled& w, const GemvInt8In& a8, const OutParts& out, float* partial, int* counters,
                     int T, int N, int K, cudaStream_t s) {
  DS_ASSERT(T >= 1 && T <= 8 && K % kChunk == 0, "W4A8 GEMV: a twin of %d tokens, K %d", T, K);
  const __nv_bfloat16* none = nullptr;
  constexpr GemvGate G = GemvGate::kNone;
  const int warps = tma_narrow_warps(T);
  const dim3 grid((N + 16 * warps - 1) / (16 * warps));
  auto narrow = [&](auto stages) {
    constexpr int Stages = decltype(stages)::value, MaxThreads = kNarrowMaxWarps * 32;
    const size_t smem = tma_ring_bytes_of(Stages, 1, w.unit_bytes, warps);
    const int carveout = T == 1 ? kOneTokenCarveout : narrow_carveout(grid.x, smem);
    tma_kernel_ready<1, 1, true, false, G, 1, Stages, MaxThreads, kA8Twin>();
    launch_kernel_carveout("qgemv_tma", qgemv_tma_kernel<1, 1, true, false, G, 1, Stages, MaxThreads, kA8Twin>, grid,
                           dim3(32 * warps), smem, carveout, s, w, none, none, out, partial, counters, T, N, K, 0,
                           a8.q, a8.scale);
  };
  narrow(std::integral_constant<int, kNarrowStages>{});
}

// The shared memory of an unsplit launch's narrow blocks of `warps` warps with their inputs staged
// (F16): their rings of kNarrowStages one-unit stages, then T rows of the inputs.
inline size_t tma_narrow_x_smem_bytes(int T, int K, int unit_bytes, int warps) {
  return tma_ring_bytes_of(kNarrowStages, 1, unit_bytes, warps) + tma_x_rows_bytes(T, K, 1);
}
// Whether those blocks fit in one block's shared memory (the kernel's static shared memory is a
// few bytes: 1 KiB is kept for it).
inline bool tma_narrow_x_fits(int T, int K, int unit_bytes, int warps) {
  return tma_narrow_x_smem_bytes(T, K, unit_bytes, warps) + 1024 <= size_t(smem_per_block_optin());
}

// (At 2-8 tokens the split launches whose splits hold 4-8 whole units, down, qkvz and qkv, take the
// K-slice kernel's split form instead: qgemv_kslice.cuh, w4a16_gemv_kslice_split.)
// XSmem where tma_x_smem_form allows it (and x_smem_allowed); a gate (xb, gate) only with XSmem.
// f16 (one token tile, with x_smem_allowed): the launches that stage their inputs take them as fp16
// (F16), and so do unsplit ones, whose narrow blocks stage x where it fits beside their rings in
// one block's shared memory. x_f16 (optional, one token tile): a producer's fp16 copy of x / 16,
// which unsplit launches read through L1 a stage ahead (F16; at 4-8 tokens only where it does not
// fit beside their rings, else they stage it), and launches that stage their inputs stage as it is
// (F16 with XCopy, at any count of tokens: no pass making the staged inputs fp16, which at 5-8
// tokens cost what the fp16 codes save).
template <int NT, int MinBlocks, bool XAhead>
void launch_tma(const W4Tiled& w, const __nv_bfloat16* x, const __nv_bfloat16* xb, GemvGate gate,
                const OutParts& out, float* partial, int* counters, int splits, int T, int N, int K,
                bool x_smem_allowed, bool f16, const __half* x_f16, cudaStream_t s) {
  if constexpr (NT == 1) {
    const XSmemForm form =
        x_smem_allowed ? tma_x_smem_form(NT, T, K, splits, w.unit_bytes, gate != GemvGate::kNone) : XSmemForm::kNone;
    if (form != XSmemForm::kNone) {
      const dim3 grid((N + kTileRows - 1) / kTileRows, splits), block(kWarps * 32);
      const size_t smem = tma_x_smem_bytes(form, T, K, splits, w.unit_bytes);
      const int stride = tma_x_stride(K, splits);
      const bool copy = x_f16 && gate == GemvGate::kNone;
      const __nv_bfloat16* xin = copy ? reinterpret_cast<const __nv_bfloat16*>(x_f16) : x;
      // f: F16; c: XCopy.
      auto go = [&](auto g, auto f, auto c) {
        constexpr GemvGate G = decltype(g)::value;
        constexpr bool F = decltype(f)::value, C = decltype(c)::value;
        constexpr int Threads = kWarps * 32;
        if (form == XSmemForm::kTwoUnitStages) {
          constexpr int SU = stage_units(NT), S = stages_for(NT);
          tma_kernel_ready<NT, MinBlocks, XAhead, true, G, SU, S, Threads, 0, F, C>();
          launch_kernel("qgemv_tma", qgemv_tma_kernel<NT, MinBlocks, XAhead, true, G, SU, S, Threads, 0, F, C>, grid,
                        block, smem, s, w, xin, xb, out, partial, counters, T, N, K, stride, nullptr, nullptr);
        } else {
          constexpr int S = kOneUnitXSmemStages;
          tma_kernel_ready<NT, MinBlocks, XAhead, true, G, 1, S, Threads, 0, F, C>();
          launch_kernel("qgemv_tma", qgemv_tma_kernel<NT, MinBlocks, XAhead, true, G, 1, S, Threads, 0, F, C>, grid,
                        block, smem, s, w, xin, xb, out, partial, counters, T, N, K, stride, nullptr, nullptr);
        }
      };
      auto gated = [&](auto f) {
        const std::false_type staged;  // not a copy
        if (gate == GemvGate::kSiluMul) go(std::integral_constant<GemvGate, GemvGate::kSiluMul>{}, f, staged);
        else go(std::integral_constant<GemvGate, GemvGate::kNone>{}, f, staged);
      };
      if (copy) go(std::integral_constant<GemvGate, GemvGate::kNone>{}, std::true_type{}, std::true_type{});
      else if (f16) gated(std::true_type{});
      else gated(std::false_type{});
      return;
    }
    const int warps = tma_narrow_warps(T);
    if (splits == 1 && x_f16 && gate == GemvGate::kNone) {
      constexpr int MaxThreads = kNarrowMaxWarps * 32, S = kNarrowStages;
      constexpr GemvGate G = GemvGate::kNone;
      const dim3 grid((N + 16 * warps - 1) / (16 * warps));
      const size_t smem = tma_ring_bytes_of(S, 1, w.unit_bytes, warps);
      // (gate_up at 1-8 tokens takes the K-slice kernel instead: qgemv_kslice.cuh, w4a16_gemv_kslice.)
      // 4-8 tokens (kStagedCopyMinTokens): the copy staged as it is beside the rings where it fits
      // (gate_up: 80 KB at 8 tokens), with all of the shared memory as carveout, rather than read
      // through the L1 that narrow_carveout leaves. The split launch after (down) then finds the
      // SMs in the carveout it takes itself: verify 8 at 4k 6.887-6.910 against 6.955-6.978 ms,
      // verify 4 -0.07, C8 -0.06 to -0.14, C4 -0.03 to -0.05, down 22.6 against 25.1 us a launch at
      // verify 8, gate_up about even; but C2 +0.04 and C3 +0.07 (verify 2 and 3 even) on 2 H100s
      // of 3 (docs/perf/2026-12-06-s71-cuda-27b.md). The whole carveout with the L1 reads left
      // gate_up 4 us slower.
      if (T >= kStagedCopyMinTokens && x_smem_allowed && tma_narrow_x_fits(T, K, w.unit_bytes, warps)) {
        tma_kernel_ready<NT, 1, true, true, G, 1, S, MaxThreads, 0, true, true>();
        launch_kernel_carveout("qgemv_tma", qgemv_tma_kernel<NT, 1, true, true, G, 1, S, MaxThreads, 0, true, true>,
                               grid, dim3(32 * warps), tma_narrow_x_smem_bytes(T, K, w.unit_bytes, warps),
                               kOneTokenCarveout, s, w, reinterpret_cast<const __nv_bfloat16*>(x_f16), xb, out,
                               partial, counters, T, N, K, tma_x_stride(K, 1), nullptr, nullptr);
        return;
      }
      const int carveout = T == 1 ? kOneTokenCarveout : narrow_carveout(grid.x, smem);
      tma_kernel_ready<NT, 1, true, false, G, 1, S, MaxThreads, 0, true>();
      launch_kernel_carveout("qgemv_tma", qgemv_tma_kernel<NT, 1, true, false, G, 1, S, MaxThreads, 0, true>, grid,
                             dim3(32 * warps), smem, carveout, s, w, reinterpret_cast<const __nv_bfloat16*>(x_f16),
                             xb, out, partial, counters, T, N, K, 0, nullptr, nullptr);
      return;
    }
    if (splits == 1 && x_smem_allowed && f16 && gate == GemvGate::kNone &&
        tma_narrow_x_fits(T, K, w.unit_bytes, warps)) {
      // The narrow blocks of an unsplit launch, their inputs staged (as the split launches' beside
      // one-unit rings: two groups) rather than read through L1 a stage ahead.
      constexpr int MaxThreads = kNarrowMaxWarps * 32;
      constexpr GemvGate G = GemvGate::kNone;
      const dim3 grid((N + 16 * warps - 1) / (16 * warps));
      const size_t smem = tma_narrow_x_smem_bytes(T, K, w.unit_bytes, warps);
      constexpr int S = kNarrowStages;
      tma_kernel_ready<NT, 1, false, true, G, 1, S, MaxThreads, 0, true>();
      launch_kernel_carveout("qgemv_tma", qgemv_tma_kernel<NT, 1, false, true, G, 1, S, MaxThreads, 0, true>, grid,
                             dim3(32 * warps), smem, kOneTokenCarveout, s, w, x, xb, out, partial, counters, T, N, K,
                             tma_x_stride(K, 1), nullptr, nullptr);
      return;
    }
  }
  DS_ASSERT(gate == GemvGate::kNone, "qgemv_tma: a gated input needs the inputs in shared memory");
  // Split-K sums per tile of kWarps row blocks (store_results); unsplit launches take narrow blocks.
  const int warps = splits > 1 ? kWarps : NT == 1 ? tma_narrow_warps(T) : 1;
  auto* kernel = qgemv_tma_kernel<NT, MinBlocks, XAhead, false>;
  size_t smem = tma_ring_bytes(NT, w.unit_bytes, warps);
  if constexpr (NT == 1) {
    // Unsplit one-tile launches: Stages one-unit stages a warp, inputs a stage ahead, in blocks of
    // up to MaxThreads (one warp: the kernel's own bound; several: kNarrowMaxWarps warps, any count).
    auto narrow = [&](auto stages, auto max_threads) {
      constexpr int Stages = decltype(stages)::value, MaxThreads = decltype(max_threads)::value;
      constexpr int Min = MaxThreads > kWarps * 32 ? 1 : MinBlocks;
      kernel = qgemv_tma_kernel<NT, Min, true, false, GemvGate::kNone, 1, Stages, MaxThreads>;
      smem = tma_ring_bytes_of(Stages, 1, w.unit_bytes, warps);
      tma_kernel_ready<NT, Min, true, false, GemvGate::kNone, 1, Stages, MaxThreads>();
    };
    if (splits == 1) {
      using Stages = std::integral_constant<int, kNarrowStages>;
      if (warps == 1) narrow(Stages{}, std::integral_constant<int, kWarps * 32>{});
      else narrow(Stages{}, std::integral_constant<int, kNarrowMaxWarps * 32>{});
    }
  }
  tma_kernel_ready<NT, MinBlocks, XAhead, false>();
  const dim3 grid((N + 16 * warps - 1) / (16 * warps), splits);
  const int carveout = splits > 1 ? -1 : T == 1 ? kOneTokenCarveout : narrow_carveout(grid.x * grid.y, smem);
  launch_kernel_carveout("qgemv_tma", kernel, grid, dim3(32 * warps), smem, carveout, s, w, x, xb, out, partial,
                         counters, T, N, K, 0, nullptr, nullptr);
}

}  // namespace ds::cuda::qgemv
