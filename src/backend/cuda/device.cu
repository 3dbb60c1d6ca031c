// CUDA device discovery: a failed query (no driver, no GPU) counts as zero devices.
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
}  // namespace ds
