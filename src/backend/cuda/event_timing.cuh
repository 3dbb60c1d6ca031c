// median_ms: how the CUDA backend's own measurements (the roofline ceilings, the streaming probes)
// time work on the GPU: CUDA events around each of `reps` runs after two warm-up runs, the median.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace ds::cuda {

// run() enqueues the work on the default stream; a failed launch in it is reported.
template <class F>
float median_ms(F&& run, int reps) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  run();  // warm-up
  run();
  CUDA_CHECK(cudaGetLastError());
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a));
    run();
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace ds::cuda
