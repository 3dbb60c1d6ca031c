// CUDA device discovery for backend selection, and the profiler switch for benchmarks.
#pragma once

#include <cstddef>

namespace ds {
// Number of usable CUDA devices; 0 when there is no driver or no GPU.
int cuda_device_count();
// Starts the profiler's capture (for `ncu --profile-from-start off`: setup kernels are skipped).
void cuda_profiler_start();
// Bytes of the current device's memory free now (cudaMemGetInfo).
size_t cuda_free_bytes();
}  // namespace ds
