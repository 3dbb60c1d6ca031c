// Kernel timeline tracer for the device machine, which has no Nsight Systems: a CUDA injection
// library (the driver loads it at cuInit when CUDA_INJECTION64_PATH names it) that records every
// kernel's start and end through CUPTI's activity API, graph-launched kernels included, and writes
// them as CSV when the program exits. tools/kernel_trace.py turns a trace into a per-step table.
//   build:  g++ -std=c++17 -O2 -shared -fPIC tools/kernel_trace.cpp -I$CUDA/include -L$CUDA/lib64
//           -lcupti -o libds_kernel_trace.so            (tools/gpu_check.sh --pack does it)
//   run:    CUDA_INJECTION64_PATH=$PWD/libds_kernel_trace.so DS_KERNEL_TRACE=trace.csv PROGRAM ...
// CSV columns: name (demangled), start_ns, end_ns, grid x/y/z, block x, dynamic shared memory
// bytes, graph node id, correlation id. Times are the GPU's (CUPTI timestamps, ns).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = size_t(16) << 20;

std::mutex g_mutex;
FILE* g_out = nullptr;
size_t g_records = 0;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kernel_trace: %s: %s\n", what, msg ? msg : "unknown CUPTI error");
}

std::string demangled(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  for (char& c : s)
    if (c == ',') c = ';';  // one CSV field
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    if (g_out)
      std::fprintf(g_out, "%s,%llu,%llu,%d,%d,%d,%d,%d,%llu,%u\n", demangled(k->name).c_str(),
                   static_cast<unsigned long long>(k->start), static_cast<unsigned long long>(k->end), k->gridX,
                   k->gridY, k->gridZ, k->blockX, k->dynamicSharedMemory,
                   static_cast<unsigned long long>(k->graphNodeId), k->correlationId);
    ++g_records;
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped) std::fprintf(stderr, "kernel_trace: %zu records dropped\n", dropped);
  std::free(buffer);
}

void finish() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out) {
    std::fclose(g_out);
    g_out = nullptr;
    std::fprintf(stderr, "kernel_trace: %zu kernels written\n", g_records);
  }
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* path = std::getenv("DS_KERNEL_TRACE");
  g_out = std::fopen(path && *path ? path : "kernel_trace.csv", "w");
  if (!g_out) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path ? path : "kernel_trace.csv");
    return 0;
  }
  std::fprintf(g_out, "name,start,end,grid_x,grid_y,grid_z,block_x,dyn_smem,graph_node,correlation\n");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  std::atexit(finish);
  return 1;
}
