// W4A16 linears. Checkpoints keep the compressed-tensors layout (packed i32 [N, K/8], nibble j of
// word c = column 8c+j stored as q+8; f32 scales [N, K/group]); at load the CUDA backend repacks
// each weight once into the GEMV's tiled layout, one buffer:
//   for each 16-row block rb, ceil(K/256) units; unit u = `slots` scale slots, then chunks 4u ..
//   4u + 3 (64 columns each; a short last unit keeps the full size, its missing chunks unused):
//   - scale slot i: f32 [8 g][2] = rows (16rb + g, 16rb + g + 8) of the group of chunk 4u + (i <<
//     slot_shift), where slot_shift = min(log2(group / 64), 2) and slots = 4 >> slot_shift (so
//     groups of 64, 128 and 256 columns are stored once, larger groups once a unit);
//   - chunk c: u32 [32 lanes][4 words]: the uint4 of a lane holds its mma A operands for the
//     chunk's 4 k-steps (qgemv_kernel.cuh): word j = k-step j; with g = lane/4, q = lane%4,
//     b = 64c + 16q + 4j, nibble r (r = 0..3) of word j holds W[16rb + g + 8(r&1)][b + 2(r>>1)] and
//     nibble r + 4 the next column (both as q + 8), so `(word >> 4r) & 0x000F000F` is A register r
//     as a pair. Rows past N hold q = 0 and scale 0.
//   A paired weight (the MLP's gate_up, WeightRole::kGateUp) puts rows [8rb, 8rb + 8) of its first
//   half in rows g and rows [8rb, 8rb + 8) of its second in rows g + 8, so a lane's accumulators
//   hold the gate and up value of the same output and the GEMV writes silu(gate) * up.
// So one warp's stage of the copy-unit GEMV is one contiguous copy (2,176 bytes a unit at group 128).
// Small T (decode, verify, the slices of short steps; up to 128 per launch) runs a tensor-core GEMV
// streaming the weights once for all tokens, fed by the copy unit (qgemv_tma.cuh; 9-64 tokens with
// the inputs shared by a block, qgemv_wide.cuh, and 33-128 as its wgmma form, qgemv_wgmma.cuh,
// where built for sm_90a) or, with DS_W4A16_GEMV=regs, through registers (qgemv_kernel.cuh); large
// T (prefill) dequantises to a bf16 matrix for cuBLAS.
#define DS_GEMV_STAMPS_HERE  // gemv_stamps.cuh: the stamp ring is defined here
#include <cuda.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"
#include "backend/cuda/qgemv_kernel.cuh"
#include "backend/cuda/qgemv_kslice.cuh"
#include "backend/cuda/qgemv_tma.cuh"
#include "backend/cuda/qgemv_wgmma.cuh"
#include "backend/cuda/qgemv_wide.cuh"
#include "backend/cuda/tensor_map.h"
#include "core/log.h"

#ifdef DS_GEMV_STAMPS
#include <cstdio>
#include <vector>
#endif

namespace ds::cuda {

#ifdef DS_GEMV_STAMPS
namespace {
// The GEMV stamps (gemv_stamps.cuh) to $DS_GEMV_STAMPS_OUT: u64 count, then the ring.
void write_gemv_stamps() {
  const char* path = std::getenv("DS_GEMV_STAMPS_OUT");
  if (!path) return;
  unsigned long long n = 0;
  std::vector<uint64_t> ring(size_t(stamps::kStampRecords) * stamps::kStampFields);
  const bool read = cudaDeviceSynchronize() == cudaSuccess &&
                    cudaMemcpyFromSymbol(&n, stamps::g_stamp_count, sizeof n) == cudaSuccess &&
                    cudaMemcpyFromSymbol(ring.data(), stamps::g_stamps, ring.size() * sizeof(uint64_t)) == cudaSuccess;
  if (!read) {
    std::fprintf(stderr, "GEMV stamps: reading the ring failed\n");
    return;
  }
  FILE* f = std::fopen(path, "wb");
  if (!f) {
    std::fprintf(stderr, "GEMV stamps: cannot write %s\n", path);
    return;
  }
  std::fwrite(&n, sizeof n, 1, f);
  std::fwrite(ring.data(), sizeof(uint64_t), ring.size(), f);
  std::fclose(f);
  std::fprintf(stderr, "GEMV stamps: %llu records to %s\n", n, path);
}
// Registered at the first launch, after the CUDA runtime's own exit handler, so it runs first.
void arm_gemv_stamps() {
  static const int registered = (std::atexit(write_gemv_stamps), 0);
  (void)registered;
}
}  // namespace
#endif

namespace {

using qgemv::W4Tiled;

int log2_exact(int v) {
  int s = 0;
  while ((1 << s) < v) ++s;
  return s;
}

// The unit geometry of a group size (w4a16_tiled_supports).
struct UnitShape {
  int slot_shift, slots, bytes;
  explicit UnitShape(int group)
      : slot_shift(std::min(log2_exact(group / 64), 2)),
        slots(qgemv::kUnitChunks >> slot_shift),
        bytes(slots * qgemv::kSlotBytes + qgemv::kUnitChunks * qgemv::kChunkBytes) {}
};
int units_of(int K) { return (K / 64 + qgemv::kUnitChunks - 1) / qgemv::kUnitChunks; }

}  // namespace

W4Tiled qgemv::tiled_weight(const uint32_t* tiled, int K, int group) {
  const UnitShape us(group);
  return W4Tiled{reinterpret_cast<const unsigned char*>(tiled), K / 64, units_of(K), us.bytes, us.slots,
                 us.slot_shift};
}

namespace {

using qgemv::tiled_weight;

// The row of the source (repack) or of the dequantised output (dequant) that tiled row r holds:
// r, or for a paired weight of halves of pair_half rows row 8 (r / 16) + r % 8 of half (r / 8) % 2.
__device__ __forceinline__ int64_t logical_row(int64_t r, int pair_half) {
  return pair_half == 0 ? r : ((r >> 3) & 1) * pair_half + (r >> 4) * 8 + (r & 7);
}

// One thread per chunk word; index i = ((rb * n_chunks + c) * 32 + lane) * 4 + j. tiled: the
// buffer of w (w gives the geometry).
__global__ void w4a16_repack_kernel(const uint32_t* packed, W4Tiled w, unsigned char* tiled, int64_t n_words, int N,
                                    int K, int pair_half) {
  const int n_chunks = K / 64;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words; i += int64_t(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % 4), lane = static_cast<int>((i / 4) % 32);
    const int c = static_cast<int>((i / 128) % n_chunks);
    const int64_t rb = i / (128 * int64_t(n_chunks));
    // Source word of columns b .. b+3 (b = 64c + 16q + 4j) and the nibble of column b in it.
    const int64_t src_word = int64_t(c) * 8 + 2 * (lane % 4) + j / 2;
    const int shift = 16 * (j % 2);
    uint32_t out = 0;
    for (int half = 0; half < 2; ++half) {  // row g, then row g + 8
      const int64_t row = rb * 16 + lane / 4 + 8 * half;
      const uint32_t src = row < N ? packed[logical_row(row, pair_half) * (K / 8) + src_word] >> shift
                                   : 0x8888u;  // 8: q = 0
      for (int m = 0; m < 4; ++m) {  // column b + m -> nibble (m & 1) * 4 + (m >> 1) * 2 + half
        const int nib = (m & 1) * 4 + (m >> 1) * 2 + half;
        out |= ((src >> (4 * m)) & 15u) << (4 * nib);
      }
    }
    unsigned char* chunk = tiled + w.unit_offset(static_cast<int>(rb), c / qgemv::kUnitChunks) +
                           w.slots * qgemv::kSlotBytes + (c % qgemv::kUnitChunks) * qgemv::kChunkBytes;
    reinterpret_cast<uint32_t*>(chunk)[lane * 4 + j] = out;
  }
}

// One thread per scale; index i = (((rb * n_units + u) * slots + slot) * 8 + g) * 2 + half.
__global__ void w4a16_repack_scales_kernel(const float* scales, W4Tiled w, unsigned char* tiled, int64_t n, int N,
                                           int group_shift, int pair_half) {
  const int n_groups = w.n_chunks >> group_shift;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int half = static_cast<int>(i % 2), g = static_cast<int>((i / 2) % 8);
    const int slot = static_cast<int>((i / 16) % w.slots), u = static_cast<int>((i / 16 / w.slots) % w.n_units);
    const int64_t rb = i / (16 * int64_t(w.slots) * w.n_units);
    const int64_t row = rb * 16 + g + 8 * half;
    const int c = u * qgemv::kUnitChunks + (slot << w.slot_shift);  // the slot's first chunk
    const float v =
        row < N && c < w.n_chunks ? scales[logical_row(row, pair_half) * n_groups + (c >> group_shift)] : 0.f;
    reinterpret_cast<float*>(tiled + w.unit_offset(static_cast<int>(rb), u))[slot * 16 + g * 2 + half] = v;
  }
}

// One thread per chunk word: 8 bf16 weights, 4 in row g and 4 in row g + 8.
__global__ void w4a16_dequant_kernel(W4Tiled w, bf16* out, int64_t n_words, int N, int K, int pair_half) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words; i += int64_t(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % 4), lane = static_cast<int>((i / 4) % 32);
    const int c = static_cast<int>((i / 128) % w.n_chunks);
    const int rb = static_cast<int>(i / (128 * int64_t(w.n_chunks)));
    const int b = c * 64 + 16 * (lane % 4) + 4 * j;
    const unsigned char* unit = w.unit(rb, c / qgemv::kUnitChunks);
    const int cu = c % qgemv::kUnitChunks;
    const uint32_t word =
        reinterpret_cast<const uint32_t*>(unit + w.slots * qgemv::kSlotBytes + cu * qgemv::kChunkBytes)[lane * 4 + j];
    const float* slot = reinterpret_cast<const float*>(unit + (cu >> w.slot_shift) * qgemv::kSlotBytes);
    for (int half = 0; half < 2; ++half) {
      const int64_t row = int64_t(rb) * 16 + lane / 4 + 8 * half;
      if (row >= N) continue;
      const float s = slot[(lane / 4) * 2 + half];
      for (int m = 0; m < 4; ++m) {
        const int nib = (m & 1) * 4 + (m >> 1) * 2 + half;
        out[logical_row(row, pair_half) * K + b + m] =
            to_bf16(static_cast<float>(static_cast<int>((word >> (4 * nib)) & 15u) - 8) * s);
      }
    }
  }
}

__global__ void fill_random_bits_kernel(uint32_t* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + uint64_t(i) + 0x632BE59BD9B4E5ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    x[i] = static_cast<uint32_t>(z ^ (z >> 31));
  }
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535 * 8)); }

}  // namespace

bool w4a16_tiled_supports(int K, int group) {
  return group >= 64 && (group & (group - 1)) == 0 && K % group == 0;
}

int64_t w4a16_tiled_block_words(int K, int group) { return int64_t(units_of(K)) * UnitShape(group).bytes / 4; }

void launch_w4a16_repack(const uint32_t* packed, const float* scales, uint32_t* tiled, int N, int K, int group,
                         bool paired, cudaStream_t s) {
  DS_ASSERT(w4a16_tiled_supports(K, group), "W4A16 tiles need a power-of-two group >= 64 dividing K (K %d, group %d)",
            K, group);
  DS_ASSERT(!paired || N % 16 == 0, "a paired W4A16 weight needs N %% 16 == 0 (N %d)", N);
  const int pair_half = paired ? N / 2 : 0;
  const W4Tiled w = tiled_weight(tiled, K, group);
  const int64_t nb = (N + 15) / 16;
  // The short last unit's missing chunks are never read, but zeroed all the same.
  CUDA_CHECK(cudaMemsetAsync(tiled, 0, nb * w4a16_tiled_block_words(K, group) * 4, s));
  const int64_t n_words = nb * (K / 64) * 128;
  auto* bytes = reinterpret_cast<unsigned char*>(tiled);
  w4a16_repack_kernel<<<grid_for(n_words), 256, 0, s>>>(packed, w, bytes, n_words, N, K, pair_half);
  cuda_check_launch("w4a16_repack", s);
  const int64_t n_scales = nb * w.n_units * w.slots * 16;
  w4a16_repack_scales_kernel<<<grid_for(n_scales), 256, 0, s>>>(scales, w, bytes, n_scales, N, log2_exact(group / 64),
                                                                 pair_half);
  cuda_check_launch("w4a16_repack_scales", s);
}

namespace {

// -1 until first asked: DS_W4A16_GEMV, else the TMA kernel where the device has the copy unit
// (compute capability 9.0 and up).
int g_tma = -1;

bool g_x_smem = env_flag("DS_W4A16_X_SMEM", true);
bool g_f16 = env_flag("DS_W4A16_F16", true);
bool g_wide = env_flag("DS_W4A16_WIDE", true);
// DS_SM90A: the build holds sm_90a code (CMakeLists.txt), which the wgmma kernel needs.
#ifdef DS_SM90A
bool g_wgmma = env_flag("DS_W4A16_WGMMA", true);
#else
bool g_wgmma = false;
#endif
bool g_l2_weights = env_flag("DS_W4A16_L2_WEIGHTS", false);
bool g_kslice = env_flag("DS_W4A16_KSLICE", true);
bool g_kslice_split = env_flag("DS_W4A16_KSLICE_SPLIT", true);

// -1: the default of w4a16_gemv_tokens.
int g_tokens = [] {
  const char* env = std::getenv("DS_W4A16_GEMV_MAX_TOKENS");
  return env ? std::clamp(std::atoi(env), 0, kW4A16GemvMaxTokens) : -1;
}();

// Launches of at most this many tokens take fp16 inputs where g_f16 allows (w4a16_gemv_f16). At 8,
// the split launches' staged inputs made fp16 in place (a pass, and a block-wide wait after stage
// 0) cost what the codes save: verify 8 at 4k 6.277-6.326 ms against 6.240-6.253 with bf16, and
// 6.261-6.275 against 6.258-6.271 with 4 as the bound, which gains at 2 and 4 tokens (verify 2
// 5.389-5.419 against 5.485-5.521, verify 4 5.679-5.715 against 5.717-5.722; H200,
// docs/perf/2026-12-04-s45-cuda-27b.md). Launches given a producer's fp16 copy take it at 1-8 tokens
// (launch_tma), which needs no such pass.
constexpr int kF16MaxTokens = 4;

// Whether T tokens of one launch take the wide kernel (qgemv_wide.cuh, or at 33-128 tokens its
// wgmma form, qgemv_wgmma.cuh): 9 or more (at 2-8 tokens it was slower than the one-tile kernel:
// C8 9.68 against 8.82 ms on the H200).
bool takes_wide(int T) { return T > 8 && w4a16_gemv_tma() && g_wide; }
// Whether launches of 33-128 tokens take the wgmma kernel (and launches may take more than 64).
bool takes_wgmma() { return g_wgmma && w4a16_gemv_tma() && g_wide; }
// The wide kernels' token tiles of 8 for T tokens (their instances: 2, 4, 8, and the wgmma
// kernel's 16).
int wide_tiles(int T) { return T <= 64 ? qgemv::wide_token_tiles(T) : qgemv::kWgmmaTiles; }

// The most tokens one launch takes: kW4A16GemvMaxTokens on the wgmma kernel, 64 (8 token tiles)
// on the others.
int launch_max_tokens() { return takes_wgmma() ? kW4A16GemvMaxTokens : 64; }

// The kernel of a wide launch: the wgmma form (Wg; 8 or 16 tiles, M m64 tiles a warpgroup) or the
// mma.sync one.
template <int NT, bool Wg, int M>
auto wide_kernel() {
  if constexpr (Wg) return qgemv::qgemv_wgmma_kernel<NT, M>;
  else return qgemv::qgemv_wide_kernel<NT, W4Tiled>;
}

// A wide kernel's dynamic shared-memory limit raised to the opt-in maximum, once per instance;
// returns that maximum.
template <int NT, bool Wg, int M>
int wide_ready() {
  static const int max_smem = raise_dynamic_smem_limit(reinterpret_cast<const void*>(wide_kernel<NT, Wg, M>()));
  return max_smem;
}

// M: the wgmma form's m64 tiles a warpgroup (qgemv_wgmma.cuh).
template <int NT, bool Wg, int M = 2>
void launch_wide(const W4Tiled& w, const bf16* x, const OutParts& parts, float* partial, int* counters, int splits,
                 int T, int N, int K, cudaStream_t s) {
  const int max_smem = wide_ready<NT, Wg, M>();
  const qgemv::WideDeal deal = qgemv::wide_deal(N, K, sm_count());
  DS_ASSERT(deal.tiles <= kGemvMaxSplitTiles, "W4A16 wide GEMV: %d tiles (N %d), counters for %d", deal.tiles, N,
            kGemvMaxSplitTiles);
  const int64_t need = qgemv::wide_partial_floats(deal, NT);
  DS_ASSERT(need == 0 || (partial && int64_t(splits) * T * N >= need),
            "W4A16 wide GEMV: partials of %lld floats given, %lld needed (N %d, K %d)",
            static_cast<long long>(partial ? int64_t(splits) * T * N : 0), static_cast<long long>(need), N, K);
  // (The wgmma kernel's stages hold inputs for all its 8 NT token rows.)
  const size_t smem = qgemv::wide_launch_smem(qgemv::wide_smem_bytes(Wg ? 8 * NT : T, w.unit_bytes), max_smem);
  DS_ASSERT(smem <= size_t(max_smem), "W4A16 wide GEMV: %zu bytes of shared memory, the GPU allows %d", smem,
            max_smem);
  // The weight as u32 [n_rb][n_units * unit_bytes / 64][16]: a box is one unit of 16 row blocks.
  const int n_rb = (N + 15) / 16, granules = w.unit_bytes / 64;
  DS_ASSERT(w.unit_bytes % 64 == 0, "W4A16 wide GEMV: unit of %d bytes", w.unit_bytes);
  const cuuint64_t wdims[3] = {16, cuuint64_t(w.n_units) * granules, cuuint64_t(n_rb)};
  const cuuint64_t wstrides[2] = {64, cuuint64_t(w.n_units) * w.unit_bytes};
  const cuuint32_t wbox[3] = {16, cuuint32_t(granules), cuuint32_t(qgemv::kWideTileBlocks)};
  const CUtensorMap wmap =
      tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, w.base, wdims, wstrides, wbox, CU_TENSOR_MAP_SWIZZLE_NONE);
  const CUtensorMap xmap = wide_input_map(x, T, K);
  if constexpr (Wg)
    launch_kernel("qgemv_wgmma", wide_kernel<NT, Wg, M>(), dim3(deal.blocks), dim3(qgemv::wgmma_threads(M)), smem, s,
                  wmap, xmap, w, parts, partial, counters, deal, T, N, qgemv::kWideStages);
  else  // (no scales apart: wmap stands in for the unused scale map)
    launch_kernel("qgemv_wide", wide_kernel<NT, Wg, M>(), dim3(deal.blocks), dim3(qgemv::kWideThreads), smem, s, wmap,
                  xmap, wmap, w, parts, partial, counters, deal, T, N, qgemv::kWideStages);
}

// A GEMV instance: NT token tiles of 8; register kernel: U chunks in flight per warp; TMA kernel:
// registers capped for 3 blocks an SM (what its shared memory allows) at one tile, and at 4 or
// more tiles a stage's inputs loaded before its wait (measured on the H200 at 1 and 4 tiles:
// docs/perf/2026-11-29-s5-cuda-27b.md).
template <int NT_, int U_>
struct Kernel {
  static constexpr int NT = NT_, U = U_, TmaMinBlocks = NT_ == 1 ? 3 : 0;
  static constexpr bool TmaXAhead = NT_ >= 4;
};

// f(Kernel<NT, U>) for the kernel that serves T <= 8 NT tokens: U = 8 chunks in flight per warp
// for one token tile (3 blocks an SM), 4 for more tiles, whose accumulators need the registers
// (measured on the H200: docs/perf/2026-11-29-s4-cuda-27b.md).
template <class F>
auto with_kernel(int T, F&& f) {
  return T <= 8    ? f(Kernel<1, 8>{})
         : T <= 16 ? f(Kernel<2, 4>{})
         : T <= 32 ? f(Kernel<4, 4>{})
                   : f(Kernel<8, 4>{});
}

}  // namespace

// With the wgmma kernel 448: in its 128-token slices a step of 256, 320, 384, 448 and 512 tokens
// takes 45.4, 57.9, 65.9, 78.2 and 85.9 ms against 70.2, 77.7, 80.0, 90.9 and 86.5 by dequantise +
// cuBLAS (27B shape, bench model's arena of step_scratch_bytes, H100,
// docs/perf/2026-12-05-s63-cuda-27b.md). Else 256: in 64-token slices (mma.sync) 256 tokens took
// 66.9 ms against 66.1, 384 98.1 against 74.8 (s62), 160-256 tokens 47.8-66.7 against 79.8-85.2
// (s61).
int w4a16_gemv_step_tokens() {
  static const int env = [] {
    const char* e = std::getenv("DS_W4A16_GEMV_STEP_TOKENS");
    return e ? std::max(0, std::atoi(e)) : -1;
  }();
  return env >= 0 ? env : takes_wgmma() ? 448 : 256;
}
int w4a16_gemv_tokens() {
  // 128 with the wgmma kernel (a 256-token step 52.4 ms against 66.9 in 64-token slices on
  // mma.sync: H100, docs/perf/2026-12-05-s62-cuda-27b.md); 64 with the mma.sync wide kernel, whose
  // one launch reads the weights once for 64 tokens (C64 43.2 ms against 51.1 at 32 a launch, with
  // an earlier form of it); the one-tile kernel was slower at 64 a launch (C64 47.3 against 42.2
  // ms: docs/perf/2026-12-01-s12-cuda-27b.md).
  // A setting above 64 holds with the wgmma kernel only: the other kernels take 64 at most.
  if (g_tokens >= 0) return std::min(g_tokens, launch_max_tokens());
  return w4a16_gemv_tma() && g_wide ? launch_max_tokens() : 32;
}
void set_w4a16_gemv_tokens(int n) { g_tokens = std::clamp(n, 0, kW4A16GemvMaxTokens); }

bool w4a16_gemv_tma() {
  if (g_tma < 0) g_tma = env_choice("DS_W4A16_GEMV", "regs", "tma", compute_capability_major() >= 9);
  return g_tma == 1;
}
void set_w4a16_gemv_tma(bool on) { g_tma = on ? 1 : 0; }
bool w4a16_gemv_x_smem() { return g_x_smem; }
void set_w4a16_gemv_x_smem(bool on) { g_x_smem = on; }
bool w4a16_gemv_f16() { return g_f16; }
void set_w4a16_gemv_f16(bool on) { g_f16 = on; }
bool w4a16_l2_weights() { return g_l2_weights; }
void set_w4a16_l2_weights(bool on) { g_l2_weights = on; }
bool w4a16_gemv_kslice() { return g_kslice; }
void set_w4a16_gemv_kslice(bool on) { g_kslice = on; }
bool w4a16_gemv_kslice_split() { return g_kslice_split; }
void set_w4a16_gemv_kslice_split(bool on) { g_kslice_split = on; }
namespace {
// Whether a launch of T tokens in `splits` splits of K takes the K-slice kernel's split form.
bool takes_kslice_split(int T, int K, int splits) {
  return T >= 2 && T <= 8 && g_kslice_split && w4a16_gemv_tma() && qgemv::kslice_split_fits(K, splits);
}
}  // namespace
bool w4a16_gemv_takes_kslice_split(int T, int N, int K, int group) {
  return T <= w4a16_gemv_tokens() && w4a16_tiled_supports(K, group) &&
         takes_kslice_split(T, K, w4a16_gemv_splits(T, N, K));
}
// At 5-8 tokens too: verify 8 at 4k 6.187-6.208 ms against 6.237-6.251 with copies at 1-4 tokens
// only, gate_up 30.60 against 31.97 us a launch (H200, docs/perf/2026-12-04-s45-cuda-27b.md).
bool w4a16_gemv_reads_f16_copy(int T) {
  return T >= 1 && T <= 8 && T <= w4a16_gemv_tokens() && g_f16 && g_x_smem && w4a16_gemv_tma();
}
bool w4a16_gemv_takes_f16(int T) { return T <= kF16MaxTokens && w4a16_gemv_reads_f16_copy(T); }
bool w4a16_gemv_wide() { return g_wide; }
void set_w4a16_gemv_wide(bool on) { g_wide = on; }
bool w4a16_gemv_wgmma() { return g_wgmma; }
bool set_w4a16_gemv_wgmma(bool on) {
#ifdef DS_SM90A
  g_wgmma = on;
#endif
  return g_wgmma == on;
}

int w4a16_gemv_splits(int T, int N, int K) {
  if (takes_wide(T)) {  // partial [splits, T, N] must hold the wide kernel's partials
    const int64_t need = qgemv::wide_partial_floats(qgemv::wide_deal(N, K, sm_count()), wide_tiles(T));
    return need == 0 ? 1 : static_cast<int>(std::max<int64_t>(2, (need + int64_t(T) * N - 1) / (int64_t(T) * N)));
  }
  const int resident = with_kernel(T, [](auto k) {
    using Kn = decltype(k);
    return w4a16_gemv_tma() ? qgemv::tma_resident_blocks<Kn::NT, Kn::TmaMinBlocks, Kn::TmaXAhead>()
                            : qgemv::resident_blocks<W4Tiled, Kn::NT, Kn::U>();
  });
  return qgemv::choose_splits(resident, T, N, K, kGemvMaxSplitTiles);
}

bool w4a16_gemv_writes_swiglu(int T) { return T <= kGemvSwigluMaxTokens && !takes_wide(T); }

namespace {
// Whether T tokens take one launch of the TMA GEMV's one token tile that stages its inputs (gated
// or not) in shared memory: what gating the input needs.
bool stages_inputs(int T, int K, int group, int splits, bool gated) {
  return T >= 1 && T <= 8 && T <= w4a16_gemv_tokens() && w4a16_gemv_tma() && g_x_smem &&
         w4a16_tiled_supports(K, group) && qgemv::tma_x_smem_fits(1, T, K, splits, UnitShape(group).bytes, gated);
}
}  // namespace

bool w4a16_gemv_gates_input(int T, int N, int K, int group) {
  return T >= 1 && T <= 8 && stages_inputs(T, K, group, w4a16_gemv_splits(T, N, K), true);
}

bool w4a16_gemv_scales_output(int T) { return T >= 1 && T <= 8 && T <= w4a16_gemv_tokens() && w4a16_gemv_tma(); }

bool w4a16_gemv_norms_output(int T, int N, int K, int group, bool gated) {
  if (!w4a16_gemv_scales_output(T) || N % 4 != 0 || !w4a16_tiled_supports(K, group)) return false;
  const int splits = w4a16_gemv_splits(T, N, K);
  return splits > 1 && (!gated || stages_inputs(T, K, group, splits, true));
}

bool w4a16_gemv_takes_a8(int T, int N, int K, int group, bool gated, bool twin) {
  if (!(T >= 1 && T <= w4a16_gemv_tokens() && w4a16_gemv_tma() && w4a16_tiled_supports(K, group))) return false;
  const int splits = w4a16_gemv_splits(T, N, K);
  if (twin && (T > 8 || K % qgemv::kChunk != 0 || gated)) return false;
  if (twin && splits == 1) return true;  // the narrow blocks read it through L1
  return qgemv::tma_a8_fits(T, K, splits, UnitShape(group).bytes, gated, twin);
}

void launch_w4a16_gemv(const bf16* x, const uint32_t* tiled, const GemvOut& out, float* partial, int* counters,
                       int splits, int T, int N, int K, int group, cudaStream_t s, const bf16* xb, GemvGate gate,
                       GemvInt8In a8, const __half* x_f16) {
  if (T == 0) return;
  DS_ASSERT(T <= launch_max_tokens() && w4a16_tiled_supports(K, group),
            "W4A16 GEMV: T %d, K %d, group %d", T, K, group);
  DS_ASSERT(aligned16(x) && aligned16(tiled) && aligned16(partial),
            "W4A16 GEMV: x, the weight and the partials must be 16-byte aligned");
  // Whether the inputs fit in shared memory to be gated there is launch_tma's check.
  DS_ASSERT(gate == GemvGate::kNone || (xb && w4a16_gemv_tma()),
            "W4A16 GEMV: a gated input needs its second input and the TMA kernel (T %d, N %d, K %d)", T, N, K);
  DS_ASSERT(!out.swiglu || w4a16_gemv_writes_swiglu(T), "W4A16 GEMV: a swiglu output at %d tokens a launch", T);
  DS_ASSERT(!out.norm.x || (splits > 1 && splits == w4a16_gemv_splits(T, N, K) &&
                            w4a16_gemv_norms_output(T, N, K, group, gate != GemvGate::kNone)),
            "W4A16 GEMV: a norm output needs one split-K launch of the one-tile kernel (T %d, splits %d)", T, splits);
  DS_ASSERT(!out.norm.ss || out.norm.x || w4a16_gemv_scales_output(T),
            "W4A16 GEMV: a norm scale needs one launch of the one-tile kernel (T %d)", T);
  DS_ASSERT(!a8.on || w4a16_gemv_takes_a8(T, N, K, group, gate != GemvGate::kNone, a8.q != nullptr),
            "W4A16 GEMV: int8 inputs at T %d, N %d, K %d", T, N, K);
  DS_ASSERT(!a8.q || (gate == GemvGate::kNone && aligned16(a8.q)), "W4A16 GEMV: an int8 twin is the whole input");
  DS_ASSERT(!x_f16 || (gate == GemvGate::kNone && aligned16(x_f16) && w4a16_gemv_reads_f16_copy(T)),
            "W4A16 GEMV: an fp16 copy of the whole input, at %d tokens", T);
  const OutParts parts = out_parts(out, N);
  W4Tiled w = tiled_weight(tiled, K, group);
  if (g_l2_weights && (a8.on || !takes_wide(T))) {  // the wide kernel's tensor map takes the true layout
    static bool warned = false;
    if (!warned) DS_LOG_WARN("cuda", "DS_W4A16_L2_WEIGHTS: W4A16 weights read from an L2 window; results are wrong");
    warned = true;
    w.n_units = 1;  // row block r's unit u is unit r + u of the weight (w4a16_l2_weights)
  }
  if (a8.on) {
    constexpr int kMinBlocks = Kernel<1, 8>::TmaMinBlocks;
    if (a8.q && splits == 1) qgemv::launch_tma_twin<kMinBlocks>(w, a8, parts, partial, counters, T, N, K, s);
    else qgemv::launch_tma_a8<kMinBlocks>(w, x, xb, gate, a8, parts, partial, counters, splits, T, N, K, s);
    return;
  }
  if (takes_wide(T)) {
    DS_ASSERT(gate == GemvGate::kNone, "W4A16 GEMV: no gated input at %d tokens", T);
    const int nt = wide_tiles(T);
    if (T >= qgemv::kWgmmaMinTokens && takes_wgmma()) {
      // 33-64 tokens: 4 warpgroups of one m64 tile; 65-128: 2 of two (registers).
      if (nt == 8) launch_wide<8, true, 1>(w, x, parts, partial, counters, splits, T, N, K, s);
      else launch_wide<qgemv::kWgmmaTiles, true, 2>(w, x, parts, partial, counters, splits, T, N, K, s);
      return;
    }
    DS_ASSERT(nt <= 8, "W4A16 GEMV: %d tokens a launch without the wgmma kernel", T);
    if (nt == 2) launch_wide<2, false>(w, x, parts, partial, counters, splits, T, N, K, s);
    else if (nt == 4) launch_wide<4, false>(w, x, parts, partial, counters, splits, T, N, K, s);
    else launch_wide<8, false>(w, x, parts, partial, counters, splits, T, N, K, s);
    return;
  }
  // Unsplit launches of 1-8 tokens (gate_up) on the K-slice kernel (w4a16_gemv_kslice).
  if (T <= 8 && splits == 1 && gate == GemvGate::kNone && g_kslice && w4a16_gemv_tma() &&
      qgemv::kslice_fits(K)) {
    qgemv::launch_kslice(w, x, x_f16, parts, T, N, K, s);
    return;
  }
  // Split launches of 2-8 tokens on its split form (w4a16_gemv_kslice_split).
  if (gate == GemvGate::kNone && takes_kslice_split(T, K, splits)) {
    qgemv::launch_kslice_split(w, x, x_f16, parts, partial, counters, splits, T, N, K, s);
    return;
  }
#ifdef DS_GEMV_STAMPS
  arm_gemv_stamps();
#endif
  with_kernel(T, [&](auto k) {
    using Kn = decltype(k);
    if (w4a16_gemv_tma())
      qgemv::launch_tma<Kn::NT, Kn::TmaMinBlocks, Kn::TmaXAhead>(w, x, xb, gate, parts, partial, counters, splits, T,
                                                                 N, K, g_x_smem, w4a16_gemv_takes_f16(T), x_f16, s);
    else
      qgemv::launch<W4Tiled, Kn::NT, Kn::U>(w, x, parts, partial, counters, splits, T, N, K, s);
  });
}

void launch_w4a16_dequant(const uint32_t* tiled, bf16* w, int N, int K, int group, bool paired, cudaStream_t s) {
  DS_ASSERT(!paired || N % 16 == 0, "dequantising a paired W4A16 weight takes whole 16-row blocks (N %d)", N);
  const int64_t n_words = int64_t((N + 15) / 16) * (K / 64) * 128;
  w4a16_dequant_kernel<<<grid_for(n_words), 256, 0, s>>>(tiled_weight(tiled, K, group), w, n_words, N, K,
                                                         paired ? N / 2 : 0);
  cuda_check_launch("w4a16_dequant", s);
}

void launch_fill_random_bits(uint32_t* x, int64_t n, uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  fill_random_bits_kernel<<<grid_for(n), 256, 0, s>>>(x, n, seed);
  cuda_check_launch("fill_random_bits", s);
}

}  // namespace ds::cuda
