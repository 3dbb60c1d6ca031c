// CUDA device discovery (a failed query, no driver or no GPU, counts as zero devices) and the
// profiler switch.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "backend/cuda/device.h"

namespace ds {
int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

void cuda_profiler_start() { cudaProfilerStart(); }
}  // namespace ds
