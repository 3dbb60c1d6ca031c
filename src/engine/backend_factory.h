// make_backend: picks the Ops implementation for a --device name.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "ops/ops.h"

namespace ds {

// "cpu" is the fp32 reference backend, "cuda" the GPU backend; "auto" is cuda where this build
// has CUDA and a GPU is present, else cpu.
Result<std::unique_ptr<Ops>> make_backend(const std::string& device);

}  // namespace ds
