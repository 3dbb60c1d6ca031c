// make_backend: picks the Ops implementation for a --device name.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "ops/ops.h"

namespace ds {

// "cpu" is the fp32 reference backend, "cuda" the GPU backend; "auto" is cuda where this build
// has CUDA and a GPU is present, else cpu. step_scratch: the bytes of step scratch the largest
// step takes (step_scratch_bytes); a backend whose arena is fixed at start makes it at least that.
Result<std::unique_ptr<Ops>> make_backend(const std::string& device, size_t step_scratch = 0);

}  // namespace ds
