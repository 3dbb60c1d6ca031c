// make_backend: --device name -> backend instance.
#include "engine/backend_factory.h"

#include "backend/cpu/cpu_ops.h"
#include "core/log.h"
#ifdef DS_HAVE_CUDA
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
  if (device == "auto") {
    if (gpu_count() > 0)
      DS_LOG_WARN("backend", "a GPU is present but the CUDA model backend is not built yet; using the CPU reference");
    return std::unique_ptr<Ops>(new CpuOps());
  }
  if (device == "cuda")
    return unsupported(gpu_count() > 0 ? "--device cuda: the CUDA model backend is not implemented yet; use --device cpu"
                                       : "--device cuda: no CUDA GPU is available");
  return invalid_argument("unknown --device '" + device + "' (expected cpu, cuda or auto)");
}

}  // namespace ds
