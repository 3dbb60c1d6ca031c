// Tensor maps (tensor_map.h): cuTensorMapEncodeTiled, asked of the driver once.
#include "backend/cuda/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/qgemv_kernel.cuh"
#include "core/log.h"

namespace ds::cuda {

namespace {
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    DS_ASSERT(p && q == cudaDriverEntryPointSuccess, "the CUDA driver lacks cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}
}  // namespace

CUtensorMap tensor_map(CUtensorMapDataType type, int rank, const void* base, const cuuint64_t* dims,
                       const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
  CUtensorMap m;
  const cuuint32_t ones[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(&m, type, rank, const_cast<void*>(base), dims, strides, box, ones,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DS_ASSERT(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled: error %d (rank %d, dims %llu x %llu)", static_cast<int>(r),
            rank, static_cast<unsigned long long>(dims[0]), static_cast<unsigned long long>(dims[1]));
  return m;
}

CUtensorMap wide_input_map(const void* x, int T, int K) {
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(T)};
  const cuuint64_t strides[1] = {cuuint64_t(K) * 2};
  const cuuint32_t box[2] = {qgemv::kChunk, cuuint32_t(T)};
  return tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, x, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace ds::cuda
