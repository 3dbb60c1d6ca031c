// %globaltimer stamps of the TMA GEMV's blocks (qgemv_tma_kernel), a diagnostic compiled only
// into builds with DS_GEMV_STAMPS defined (`tools/gpu_check.sh --pack-stamps`); elsewhere the
// macros are empty. Each block takes a record of kStampFields u64 in a ring of kStampRecords
// (w4a16.cu defines it and, at exit, writes the count and the ring to $DS_GEMV_STAMPS_OUT;
// tools/gemv_stamps.py reads the file). A record, times in ns:
//   [0] the weight's base address (which linear), [1] blockIdx.x | blockIdx.y << 16 | SM << 32 |
//   gridDim.y << 48, [2] start, [3] after pdl_wait, [4] inputs staged, [5] warp 0's first stage
//   done, [6..13] warps 0-7 done with their stages, [14] thread 0 done with the results,
//   [15] N | K << 32.
// A record costs its block a barrier and a few global stores: C1 at 1k took 5.41 against 5.18 ms
// on the H200 (docs/perf/2026-12-04-s44-cuda-27b.md), so compare stamped runs with each other.
#pragma once

#include <cstdint>

#ifdef DS_GEMV_STAMPS
namespace ds::cuda::stamps {
constexpr int kStampFields = 16;
constexpr uint32_t kStampRecords = 1u << 19;
#ifdef DS_GEMV_STAMPS_HERE  // w4a16.cu: the one definition (no relocatable device code)
__device__ unsigned long long g_stamp_count;
__device__ uint64_t g_stamps[kStampRecords * kStampFields];
#else
extern __device__ unsigned long long g_stamp_count;
extern __device__ uint64_t g_stamps[kStampRecords * kStampFields];
#endif
__device__ __forceinline__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t smid() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(v));
  return v;
}
}  // namespace ds::cuda::stamps
// The block's record, taken by thread 0 at the kernel's start (then a block barrier).
#define DS_STAMP_DECL __shared__ uint64_t* ds_stamp_rec;
#define DS_STAMP_BEGIN(tag, N, K)                                                                       \
  do {                                                                                                \
    if (threadIdx.x == 0) {                                                                           \
      namespace st = ::ds::cuda::stamps;                                                              \
      const uint64_t t0 = st::now();                                                                  \
      const unsigned long long i = atomicAdd(&st::g_stamp_count, 1ull);                               \
      ds_stamp_rec = st::g_stamps + (i % st::kStampRecords) * st::kStampFields;                       \
      ds_stamp_rec[0] = reinterpret_cast<uint64_t>(tag);                                              \
      ds_stamp_rec[1] = uint64_t(blockIdx.x) | uint64_t(blockIdx.y) << 16 | uint64_t(st::smid()) << 32 | \
                        uint64_t(gridDim.y) << 48;                                                    \
      ds_stamp_rec[2] = t0;                                                                           \
      for (int f = 3; f < 15; ++f) ds_stamp_rec[f] = 0;                                               \
      ds_stamp_rec[15] = uint64_t(uint32_t(N)) | uint64_t(uint32_t(K)) << 32;                         \
    }                                                                                                 \
    __syncthreads();                                                                                  \
  } while (0)
// Field `field` of the record stamped now by the threads where cond holds.
#define DS_STAMP(field, cond)                                   \
  do {                                                          \
    if (cond) ds_stamp_rec[field] = ::ds::cuda::stamps::now(); \
  } while (0)
#else
#define DS_STAMP_DECL
#define DS_STAMP_BEGIN(tag, N, K) \
  do {                            \
  } while (0)
#define DS_STAMP(field, cond) \
  do {                        \
  } while (0)
#endif
