// Hardware ceilings measured on the GPU at hand, for reporting figures beside their roofline.
#pragma once

namespace ds {

struct Roofline {
  double copy_gbps = 0;       // device-to-device copy, bytes read + written per second / 1e9
  double bf16_tflops = 0;     // cuBLAS bf16 GEMM (fp32 accumulate), 8192^3, random data
};

// Runs a 4 GiB copy and an 8192^3 bf16 GEMM several times; medians of the timed runs.
Roofline measure_roofline(int device = 0);

}  // namespace ds
