// ClockSampler: NVML (libnvidia-ml.so.1, the driver's) opened with dlopen, so that nothing links
// against it and CPU-only machines run without it; the few entry points used are declared here
// from NVML's public C API.
#include "backend/cuda/clocks.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/log.h"

namespace ds {

namespace {

using NvmlReturn = int;  // nvmlReturn_t: 0 is success
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr int kNvmlClockSm = 1;  // nvmlClockType_t NVML_CLOCK_SM
constexpr unsigned kFieldPowerInstant = 186;  // NVML_FI_DEV_POWER_INSTANT: milliwatts now
// nvmlFieldValue_t (its value a union of 8 bytes)
struct NvmlFieldValue {
  unsigned field_id, scope_id;
  long long timestamp, latency_us;
  int value_type, nvml_return;
  union {
    double d;
    unsigned ui;
    unsigned long long ull;
  } value;
};
static_assert(sizeof(NvmlFieldValue) == 40, "nvmlFieldValue_t is 40 bytes");
// nvmlClocksEventReasons bits of a limiter that may lower the clock: software power cap, hardware
// slowdown, software and hardware thermal slowdown, hardware power brake.
constexpr uint64_t kLimiterBits = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

struct Nvml {
  void* lib = nullptr;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*clock_info)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*power_usage)(NvmlDevice, unsigned*) = nullptr;  // milliwatts, the last second's average
  NvmlReturn (*field_values)(NvmlDevice, int, NvmlFieldValue*) = nullptr;
  NvmlReturn (*reasons)(NvmlDevice, unsigned long long*) = nullptr;

  template <typename F>
  bool sym(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib, name));
    return f != nullptr;
  }
  bool open() {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    if (sym(init, "nvmlInit_v2") && sym(shutdown, "nvmlShutdown") &&
        sym(by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") && sym(clock_info, "nvmlDeviceGetClockInfo") &&
        sym(power_usage, "nvmlDeviceGetPowerUsage") && sym(reasons, "nvmlDeviceGetCurrentClocksThrottleReasons") &&
        init() == 0) {
      sym(field_values, "nvmlDeviceGetFieldValues");  // the instant power where the driver has it
      return true;
    }
    dlclose(lib);
    lib = nullptr;
    return false;
  }
};

struct Sample {
  double mhz, watts;
  unsigned long long reasons;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

struct ClockSampler::Impl {
  Nvml nvml;
  NvmlDevice dev = nullptr;
  std::thread thread;
  std::atomic<bool> running{false};
  std::vector<Sample> samples;  // written by the thread only while running

  bool instant_power = true;  // until the driver says it has no such field

  // Milliwatts: the instant reading where there is one (the average lags a figure by a second).
  bool power_mw(unsigned* mw) {
    if (instant_power && nvml.field_values) {
      NvmlFieldValue v{};
      v.field_id = kFieldPowerInstant;
      if (nvml.field_values(dev, 1, &v) == 0 && v.nvml_return == 0) {
        *mw = v.value.ui;
        return true;
      }
      instant_power = false;
    }
    return nvml.power_usage(dev, mw) == 0;
  }
  void sample() {
    unsigned mhz = 0, mw = 0;
    unsigned long long why = 0;
    if (nvml.clock_info(dev, kNvmlClockSm, &mhz) != 0 || !power_mw(&mw) || nvml.reasons(dev, &why) != 0) return;
    samples.push_back({double(mhz), mw / 1000.0, why & ~1ull});  // bit 0: the GPU is idle
  }
};

ClockSampler::ClockSampler() : impl_(std::make_unique<Impl>()) {
  int device = 0;
  char bus_id[32] = {};
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (!impl_->nvml.open()) {
    DS_LOG_INFO("bench", "NVML not found: no clock or power figures");
    return;
  }
  if (impl_->nvml.by_pci_bus_id(bus_id, &impl_->dev) != 0) {
    DS_LOG_INFO("bench", "NVML has no device at PCI %s: no clock or power figures", bus_id);
    impl_->dev = nullptr;
  }
}

ClockSampler::~ClockSampler() {
  if (impl_->running) end();
  if (impl_->nvml.lib) {
    impl_->nvml.shutdown();
    dlclose(impl_->nvml.lib);
  }
}

bool ClockSampler::available() const { return impl_->dev != nullptr; }

void ClockSampler::begin() {
  if (!available() || impl_->running) return;
  impl_->samples.clear();
  impl_->running = true;
  impl_->thread = std::thread([impl = impl_.get()] {
    while (impl->running.load(std::memory_order_relaxed)) {
      impl->sample();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
}

ClockFigures ClockSampler::end() {
  ClockFigures f;
  if (!impl_->running) return f;
  impl_->running = false;
  impl_->thread.join();
  const std::vector<Sample>& s = impl_->samples;
  if (s.empty()) return f;
  std::vector<double> mhz, watts;
  int capped = 0;
  for (const Sample& x : s) {
    mhz.push_back(x.mhz);
    watts.push_back(x.watts);
    capped += (x.reasons & kLimiterBits) != 0;
    f.reasons |= x.reasons;
  }
  f.samples = static_cast<int>(s.size());
  f.sm_mhz = median(mhz);
  f.watts = median(watts);
  f.capped = double(capped) / s.size();
  return f;
}

}  // namespace ds
