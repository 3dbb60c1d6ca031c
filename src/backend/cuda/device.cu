// CUDA device discovery (a failed query, no driver or no GPU, counts as zero devices), the
// profiler switch and the programmatic-dependent-launch setting (launch.cuh).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "backend/cuda/device.h"
#include "backend/cuda/launchers.h"

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

namespace ds::cuda {
namespace {
bool g_pdl = [] {
  const char* env = std::getenv("DS_PDL");
  return !(env && std::string(env) == "0");
}();
}  // namespace

bool pdl_enabled() { return g_pdl; }
void set_pdl_enabled(bool on) { g_pdl = on; }
}  // namespace ds::cuda
