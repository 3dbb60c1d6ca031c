// CUDA device discovery for backend selection (no model ops yet).
#pragma once

namespace ds {
// Number of usable CUDA devices; 0 when there is no driver or no GPU.
int cuda_device_count();
}  // namespace ds
