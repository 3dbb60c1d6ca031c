// Instruction-fetch probe: how fast an SM runs straight-line code it has not run lately, against
// the same instructions run as a loop whose body stays in its instruction cache. The step's small
// kernels (GDN, attention prep, the split merges) and the GEMVs' prologues and epilogues run their
// code once a launch, 30-80 KB of it a kernel (sm_90 SASS), and several forms that only made a
// kernel's code longer ran 1.5-3 times slower with no other cause found (a fully unrolled key-tile
// loader, the conv inside the GDN verify kernel, a fully unrolled chunked GDN verify: docs/perf/
// experiments.md). This gives the fetch rate such code can run at, as a figure.
//
// The work is FFMAs on kChains independent chains a thread (volatile asm: one FFMA each, 16 bytes
// of SASS, none merged or dropped), so an SM sub-partition could issue one a cycle; each CTA
// times its part with clock64 between two barriers. Cold: a kernel of kCodeFlushKilobytes of other
// straight-line code has just run on every SM (the probe's code then comes from L2, where a
// step's kernels keep theirs); warm: the same probe launch has just run.
//
// launch_code_flush runs that kernel (or a small one) before the launches DS_FLUSH_CODE_BEFORE
// names (launch.cuh), so a kernel timeline shows what a kernel of the step pays for its code.
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"

namespace ds::cuda {

namespace {

constexpr int kChains = 8;                 // independent FMA chains a thread
constexpr int kRoundBytes = kChains * 16;  // SASS bytes of one round (kChains FFMAs)
constexpr int kRolledRounds = 8;           // rounds in the rolled loop's body (1 KB)
// The FMAs' operands (x = a x + b on each chain), and a sum the chains never reach (keep).
constexpr float kA = 0.999f, kB = 1e-3f, kNever = -12345.f;

// Where the kernels' never-taken stores go (a global, not an allocation: launch_code_flush may run
// while a graph is being captured).
__device__ float g_code_sink[1024];

// One round: a dependent FMA on each chain.
__device__ __forceinline__ void fma_round(float (&x)[kChains], float a, float b) {
#pragma unroll
  for (int c = 0; c < kChains; ++c) asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x[c]) : "f"(a), "f"(b));
}

// The chains' sum, stored only if it equals `never` (it does not), so that nothing is dropped.
__device__ __forceinline__ void keep(const float (&x)[kChains], float never) {
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s += x[c];
  if (s == never) g_code_sink[threadIdx.x] = s;
}

// Rounds rounds of straight-line code (Rolled false), or `loops` turns of a loop of kRolledRounds
// rounds (Rolled true); cycles[blockIdx.x]: thread 0's clock64 from the first barrier to the last.
template <int Rounds, bool Rolled>
__global__ void code_probe_kernel(int loops, float a, float b, float never, long long* cycles) {
  float x[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) x[c] = static_cast<float>(threadIdx.x + c);
  __syncthreads();
  const long long t0 = clock64();
  if constexpr (Rolled) {
#pragma unroll 1
    for (int i = 0; i < loops; ++i) {
#pragma unroll
      for (int r = 0; r < kRolledRounds; ++r) fma_round(x, a, b);
    }
  } else {
#pragma unroll
    for (int r = 0; r < Rounds; ++r) fma_round(x, a, b);
  }
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  keep(x, never);
}

// Rounds in KB of straight-line code.
template <int KB>
__host__ __device__ constexpr int rounds_of() {
  return KB * 1024 / kRoundBytes;
}

// KB of other straight-line code, run on every SM before a cold probe (and by launch_code_flush):
// the large form takes the SMs' instruction caches (the probe's code stays in L2).
template <int KB>
__global__ void code_flush_kernel(float a, float b, float never) {
  float x[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) x[c] = static_cast<float>(threadIdx.x - c);
#pragma unroll
  for (int r = 0; r < rounds_of<KB>(); ++r) fma_round(x, b, a);
  keep(x, never);
}

void flush(int kilobytes, cudaStream_t s) {
  const dim3 grid(2 * sm_count()), block(128);  // blocks on every SM
  auto* kernel = kilobytes == kCodeFlushKilobytes ? code_flush_kernel<kCodeFlushKilobytes>
                                                  : code_flush_kernel<kCodeFlushSmallKilobytes>;
  kernel<<<grid, block, 0, s>>>(kA, kB, kNever);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_code_flush(int kilobytes, cudaStream_t s) {
  DS_ASSERT(kilobytes == kCodeFlushKilobytes || kilobytes == kCodeFlushSmallKilobytes, "code flush: %d KB",
            kilobytes);
  flush(kilobytes, s);
}

double code_probe_cycles(const CodeProbe& p) {
  DS_ASSERT(p.ctas >= 1 && p.ctas <= sm_count() && p.threads % 32 == 0 && p.threads <= 1024 && p.reps >= 1,
            "code probe: %d CTAs of %d threads (at most one an SM, whole warps)", p.ctas, p.threads);
  long long* cycles = nullptr;
  CUDA_CHECK(cudaMalloc(&cycles, size_t(p.ctas) * sizeof(long long)));
  auto probe = [&](auto kb) {
    constexpr int KB = decltype(kb)::value;
    if (p.rolled)
      code_probe_kernel<0, true><<<p.ctas, p.threads>>>(rounds_of<KB>() / kRolledRounds, kA, kB, kNever, cycles);
    else
      code_probe_kernel<rounds_of<KB>(), false><<<p.ctas, p.threads>>>(0, kA, kB, kNever, cycles);
  };
  auto launch = [&] {
    switch (p.kilobytes) {
      case 4: probe(std::integral_constant<int, 4>{}); break;
      case 16: probe(std::integral_constant<int, 16>{}); break;
      case 32: probe(std::integral_constant<int, 32>{}); break;
      case 64: probe(std::integral_constant<int, 64>{}); break;
      case 128: probe(std::integral_constant<int, 128>{}); break;
      default: DS_ASSERT(false, "code probe: %d KB (4, 16, 32, 64 or 128)", p.kilobytes);
    }
    CUDA_CHECK(cudaGetLastError());
  };
  launch();  // the probe's code in L2
  std::vector<double> medians;
  std::vector<long long> host(p.ctas);
  for (int r = 0; r < p.reps; ++r) {
    if (p.cold) flush(kCodeFlushKilobytes, nullptr);
    else launch();
    launch();
    CUDA_CHECK(cudaMemcpy(host.data(), cycles, host.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    std::sort(host.begin(), host.end());
    medians.push_back(static_cast<double>(host[host.size() / 2]));
  }
  CUDA_CHECK(cudaFree(cycles));
  std::sort(medians.begin(), medians.end());
  return medians[medians.size() / 2];
}

}  // namespace ds::cuda
