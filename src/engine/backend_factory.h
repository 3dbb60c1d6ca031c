// make_backend: picks the Ops implementation for a --device name.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "ops/ops.h"

namespace ds {

// "cpu" is the fp32 reference backend. "auto" is the GPU backend where one is built and a GPU
// is present, else cpu.
Result<std::unique_ptr<Ops>> make_backend(const std::string& device);

}  // namespace ds
