// libFuzzer target for the safetensors header parser: any byte string must parse or fail
// cleanly, and every accepted tensor range must lie inside the input.
#include <cstddef>
#include <cstdint>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = ds::SafetensorsFile::parse(data, size, "fuzz");
  if (r.ok()) {
    for (const auto& [name, info] : r.value()->tensors()) {
      const uint8_t* p = static_cast<const uint8_t*>(r.value()->data(info));
      volatile uint8_t sink = 0;
      for (uint64_t i = 0; i < info.end - info.begin; ++i) sink = sink ^ p[i];
    }
  }
  return 0;
}
