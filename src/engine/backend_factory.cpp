// make_backend: --device name -> backend instance.
#include "engine/backend_factory.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "core/log.h"
#ifdef DS_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device.h"
#endif

namespace ds {

namespace {
int gpu_count() {
#ifdef DS_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}
}  // namespace

Result<std::unique_ptr<Ops>> make_backend(const std::string& device, size_t step_scratch) {
  if (device == "cpu") return std::unique_ptr<Ops>(new CpuOps());
  if (device != "cuda" && device != "auto")
    return invalid_argument("unknown --device '" + device + "' (expected cpu, cuda or auto)");
  if (gpu_count() == 0) {
    if (device == "cuda") return unsupported("--device cuda: no CUDA GPU is available (or this build has no CUDA)");
    return std::unique_ptr<Ops>(new CpuOps());
  }
#ifdef DS_HAVE_CUDA
  // env: DS_LM_HEAD_DTYPE=bf16 keeps the embedding table and lm_head in bf16 (default int8 group 128)
  CudaOpsOptions options;
  const char* head = std::getenv("DS_LM_HEAD_DTYPE");
  if (head && std::string(head) != "int8" && std::string(head) != "bf16")
    return invalid_argument("DS_LM_HEAD_DTYPE is bf16 or int8, not '" + std::string(head) + "'");
  options.int8_vocab = !head || std::string(head) == "int8";
  options.scratch_bytes = std::max(options.scratch_bytes, step_scratch);
  DS_LOG_INFO("backend", "using the CUDA backend (%s embedding table and lm_head)", options.int8_vocab ? "int8" : "bf16");
  return std::unique_ptr<Ops>(new CudaOps(options));
#else
  return unsupported("unreachable: a GPU was counted without CUDA support");
#endif
}

}  // namespace ds
