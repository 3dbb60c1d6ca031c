// CUDA device discovery (a failed query, no driver or no GPU, counts as zero devices), the
// profiler switch, and the process-wide kernel settings of launchers.h: programmatic dependent
// launch (launch.cuh) and the decode attention kernel.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "backend/cuda/device.h"
#include "backend/cuda/launchers.h"
#include "core/check.h"

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
bool g_attention_decode_tc = [] {
  const char* env = std::getenv("DS_ATTN_DECODE");
  const std::string v = env ? env : "tc";
  if (v != "simt" && v != "tc") DS_FATAL("DS_ATTN_DECODE must be simt or tc, not '%s'", v.c_str());
  return v == "tc";
}();
}  // namespace

bool pdl_enabled() { return g_pdl; }
void set_pdl_enabled(bool on) { g_pdl = on; }
bool attention_decode_tc() { return g_attention_decode_tc; }
void set_attention_decode_tc(bool on) { g_attention_decode_tc = on; }
}  // namespace ds::cuda
