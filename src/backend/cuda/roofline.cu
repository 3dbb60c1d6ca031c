// measure_roofline: the two ceilings every benchmark figure is compared with, measured with
// CUDA events after warm-up, on random (not zero) data.
#include "backend/cuda/roofline.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/event_timing.cuh"
#include "backend/cuda/launchers.h"

namespace ds {

Roofline measure_roofline(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  Roofline r;
  const size_t bytes = size_t(4) << 30;
  void *src, *dst;
  CUDA_CHECK(cudaMalloc(&src, bytes));
  CUDA_CHECK(cudaMalloc(&dst, bytes));
  cuda::launch_fill_random_bf16(static_cast<cuda::bf16*>(src), bytes / 2, 0.f, 1.f, 1, nullptr);
  const float copy_ms =
      cuda::median_ms([&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  r.copy_gbps = 2.0 * bytes / (copy_ms * 1e-3) / 1e9;
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(dst));

  const int n = 8192;
  cuda::bf16 *A, *B, *C;
  CUDA_CHECK(cudaMalloc(&A, size_t(n) * n * 2));
  CUDA_CHECK(cudaMalloc(&B, size_t(n) * n * 2));
  CUDA_CHECK(cudaMalloc(&C, size_t(n) * n * 2));
  cuda::launch_fill_random_bf16(A, int64_t(n) * n, 0.f, 1.f, 2, nullptr);
  cuda::launch_fill_random_bf16(B, int64_t(n) * n, 0.f, 1.f, 3, nullptr);
  cublasHandle_t h;
  CUBLAS_CHECK(cublasCreate(&h));
  const float alpha = 1.f, beta = 0.f;
  const float gemm_ms = cuda::median_ms(
      [&] {
        CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n,
                                  &beta, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      },
      10);
  r.bf16_tflops = 2.0 * n * double(n) * n / (gemm_ms * 1e-3) / 1e12;
  cublasDestroy(h);
  CUDA_CHECK(cudaFree(A));
  CUDA_CHECK(cudaFree(B));
  CUDA_CHECK(cudaFree(C));
  return r;
}

}  // namespace ds
