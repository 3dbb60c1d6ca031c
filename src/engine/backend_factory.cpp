// make_backend: --device name -> backend instance.
#include "engine/backend_factory.h"

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

Result<std::unique_ptr<Ops>> make_backend(const std::string& device) {
  if (device == "cpu") return std::unique_ptr<Ops>(new CpuOps());
  if (device != "cuda" && device != "auto")
    return invalid_argument("unknown --device '" + device + "' (expected cpu, cuda or auto)");
  if (gpu_count() == 0) {
    if (device == "cuda") return unsupported("--device cuda: no CUDA GPU is available (or this build has no CUDA)");
    return std::unique_ptr<Ops>(new CpuOps());
  }
#ifdef DS_HAVE_CUDA
  DS_LOG_INFO("backend", "using the CUDA backend");
  return std::unique_ptr<Ops>(new CudaOps());
#else
  return unsupported("unreachable: a GPU was counted without CUDA support");
#endif
}

}  // namespace ds
