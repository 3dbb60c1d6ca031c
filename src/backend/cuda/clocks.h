// The GPU's SM clock, board power and clock limiters while a benchmark figure is timed, read from
// the driver's NVML library (opened at run time: a build or a machine without it reads nothing).
#pragma once

#include <memory>

namespace ds {

struct ClockFigures {
  int samples = 0;      // 0: nothing was read (no NVML, or the span was too short)
  double sm_mhz = 0;    // medians over the span
  double watts = 0;
  double capped = 0;    // fraction of samples with a power or thermal limiter active (not always a lower clock)
  unsigned long long reasons = 0;  // every NVML clock-event reason seen (the idle bit left out)
};

// Samples the current CUDA device every 2 ms on a thread of its own between begin() and end().
class ClockSampler {
 public:
  ClockSampler();
  ~ClockSampler();
  ClockSampler(const ClockSampler&) = delete;
  ClockSampler& operator=(const ClockSampler&) = delete;

  bool available() const;
  void begin();
  ClockFigures end();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds
