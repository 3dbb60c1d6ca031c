// Tensor maps for the copy engine's box copies (cp.async.bulk.tensor): the wide GEMVs' weights,
// scales and inputs (qgemv_wide.cuh). Host code; the encoder comes from the driver.
#pragma once

#include <cuda.h>

namespace ds::cuda {

// A tensor map of `rank` (2 or 3) dims over `base` (dims[0] contiguous; strides in bytes of dims
// 1..), box `box`, out-of-bounds elements filled with zeros. Fails (DS_ASSERT) where the driver
// refuses the shape.
CUtensorMap tensor_map(CUtensorMapDataType type, int rank, const void* base, const cuuint64_t* dims,
                       const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle);

// The wide GEMVs' inputs, x bf16 [T][K]: a box is one 64-column chunk of every token, swizzled by
// 128 bytes.
CUtensorMap wide_input_map(const void* x, int T, int K);

}  // namespace ds::cuda
