// launch_kernel: how the kernels of a forward step are launched (and raise_dynamic_smem_limit, for
// kernels that opt in to more than 48 KB of shared memory). With programmatic dependent
// launch on (pdl_enabled(), DS_PDL=1) each launch carries the programmatic-serialization
// attribute, so its blocks are scheduled while the kernel before it finishes and the launch gap
// disappears. Every kernel launched here therefore begins with pdl_wait() before it touches any
// memory the previous kernel writes or reads (weights may be prefetched before it), then calls
// pdl_trigger() so the next one may be scheduled in turn (ptx.cuh). Kernels launched otherwise
// (cuBLAS, <<<>>>) are ordinary stream dependencies, which keeps the chain correct.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"

namespace ds::cuda {

// Raises kernel's dynamic shared-memory limit to what an SM's opt-in allows beside its static
// shared memory; returns that limit. (Once per kernel: callers keep the result.)
inline int raise_dynamic_smem_limit(const void* kernel) {
  int dev = 0, max_smem = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes attr{};
  CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const int limit = max_smem - static_cast<int>(attr.sharedSizeBytes);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
  return limit;
}

// carveout: the launch's preferred shared-memory share of an SM's L1/shared memory in percent
// (cudaLaunchAttributePreferredSharedMemoryCarveout), or -1 to leave it to the driver.
template <class... Params, class... Args>
void launch_kernel_carveout(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            int carveout, cudaStream_t s, Args&&... args) {
  if (kernel_skipped(name)) return;
  if (const int kb = code_flush_before(name)) launch_code_flush(kb, s);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attrs[2] = {};
  int n = 0;
  if (pdl_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (carveout >= 0) {
    attrs[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attrs[n++].val.sharedMemCarveout = static_cast<unsigned>(carveout);
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  cuda_check_launch(name, s);
}
template <class... Params, class... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   Args&&... args) {
  launch_kernel_carveout(name, kernel, grid, block, smem, -1, s, std::forward<Args>(args)...);
}

}  // namespace ds::cuda
