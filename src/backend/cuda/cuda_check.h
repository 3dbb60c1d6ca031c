// CUDA_CHECK / CUBLAS_CHECK: CUDA and cuBLAS failures are fatal (tier 2 of DESIGN.md §5).
// env: DS_SYNC_DEBUG=1 synchronises after every launch so a fault names its kernel.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/check.h"

#define CUDA_CHECK(expr)                                                                  \
  do {                                                                                    \
    cudaError_t ds_err_ = (expr);                                                         \
    if (ds_err_ != cudaSuccess) DS_FATAL("CUDA error %s: %s", #expr, cudaGetErrorString(ds_err_)); \
  } while (0)

#define CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                      \
    cublasStatus_t ds_st_ = (expr);                                                         \
    if (ds_st_ != CUBLAS_STATUS_SUCCESS) DS_FATAL("cuBLAS error %d: %s", (int)ds_st_, #expr); \
  } while (0)

namespace ds {
// Checks the last launch (and, with DS_SYNC_DEBUG=1, waits for it).
void cuda_check_launch(const char* kernel, cudaStream_t stream);
}  // namespace ds
