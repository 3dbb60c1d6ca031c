// CUDA device discovery (a failed query, no driver or no GPU, counts as zero devices), the
// profiler switch, the reading of the environment switches, and the process-wide kernel settings
// of launchers.h: programmatic dependent launch (launch.cuh) and the decode attention kernel.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/launchers.h"
#include "core/check.h"
#include "core/log.h"

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

size_t cuda_free_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}
}  // namespace ds

namespace ds::cuda {
bool env_flag(const char* name, bool dflt) {
  const char* env = std::getenv(name);
  if (!env) return dflt;
  return dflt ? std::string(env) != "0" : std::string(env) == "1";
}

namespace {
// The launch names listed in env `var`, separated by ',' or '+' (the latter for tools/gpu_ab.sh
// settings, whose variables are ','-separated).
std::vector<std::string> env_names(const char* var) {
  std::vector<std::string> v;
  const char* env = std::getenv(var);
  if (!env) return v;
  std::string item;
  for (const char* p = env;; ++p) {
    if (*p == ',' || *p == '+' || *p == '\0') {
      if (!item.empty()) v.push_back(item);
      item.clear();
      if (*p == '\0') break;
    } else {
      item += *p;
    }
  }
  return v;
}
bool listed(const std::vector<std::string>& names, const char* name) {
  for (const std::string& s : names)
    if (s == name) return true;
  return false;
}
}  // namespace

bool kernel_skipped(const char* name) {
  static const std::vector<std::string> skipped = [] {
    std::vector<std::string> v = env_names("DS_SKIP_KERNELS");
    if (!v.empty())
      DS_LOG_WARN("cuda", "DS_SKIP_KERNELS=%s: these kernels are not launched; results are wrong",
                  std::getenv("DS_SKIP_KERNELS"));
    return v;
  }();
  return listed(skipped, name);
}

int code_flush_before(const char* name) {
  static const std::vector<std::string> flushed = env_names("DS_FLUSH_CODE_BEFORE");
  static const int kb = [] {
    const char* env = std::getenv("DS_FLUSH_CODE_KB");
    const int v = env ? std::atoi(env) : kCodeFlushKilobytes;
    if (v != kCodeFlushKilobytes && v != kCodeFlushSmallKilobytes)
      DS_FATAL("DS_FLUSH_CODE_KB must be %d or %d, not '%s'", kCodeFlushKilobytes, kCodeFlushSmallKilobytes, env);
    if (!flushed.empty())
      DS_LOG_WARN("cuda", "DS_FLUSH_CODE_BEFORE=%s: a %d KB code kernel runs before each of these launches",
                  std::getenv("DS_FLUSH_CODE_BEFORE"), v);
    return v;
  }();
  return listed(flushed, name) ? kb : 0;
}

bool env_choice(const char* name, const char* off, const char* on, bool dflt) {
  const char* env = std::getenv(name);
  if (!env) return dflt;
  const std::string v = env;
  if (v != off && v != on) DS_FATAL("%s must be %s or %s, not '%s'", name, off, on, v.c_str());
  return v == on;
}

namespace {
bool g_pdl = env_flag("DS_PDL", true);
bool g_attention_decode_tc = env_choice("DS_ATTN_DECODE", "simt", "tc", true);
bool g_attention_decode_warps = env_flag("DS_ATTN_DECODE_WARPS", true);
bool g_attention_decode_appends = env_flag("DS_ATTN_DECODE_APPENDS", true);

// An attribute of the current device, asked of the driver.
int current_device_attribute(cudaDeviceAttr attr) {
  int dev = 0, v = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
  return v;
}
}  // namespace

bool pdl_enabled() { return g_pdl; }
void set_pdl_enabled(bool on) { g_pdl = on; }

int sm_count() {
  static const int n = current_device_attribute(cudaDevAttrMultiProcessorCount);
  return n;
}
int compute_capability_major() {
  static const int major = [] {
    int dev = 0, v = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
                   cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess
               ? v
               : 0;
  }();
  return major;
}
int smem_per_sm() {
  static const int n = current_device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  return n;
}
int smem_per_block_optin() {
  static const int n = current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return n;
}
bool attention_decode_tc() { return g_attention_decode_tc; }
void set_attention_decode_tc(bool on) { g_attention_decode_tc = on; }
bool attention_decode_warps() { return g_attention_decode_warps; }
void set_attention_decode_warps(bool on) { g_attention_decode_warps = on; }
bool attention_decode_appends() { return g_attention_decode_appends; }
void set_attention_decode_appends(bool on) { g_attention_decode_appends = on; }
}  // namespace ds::cuda
