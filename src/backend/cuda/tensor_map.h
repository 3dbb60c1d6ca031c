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

}  // namespace ds::cuda
