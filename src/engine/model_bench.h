// Model benchmark: decode, verify-block and prefill step times of a loaded (or synthetic) model
// at chosen batch sizes and context depths, each beside its roofline (bytes over the measured
// copy bandwidth, FLOPs over the measured bf16 matmul rate). Context is set up by planning
// steps with n_past = depth over cache contents that are never computed: the kernels read the
// same bytes either way, and it keeps a 16k x 64 sweep from costing minutes of prefill.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/qwen3_5.h"

namespace ds {

struct BenchRow;

struct ModelBenchOptions {
  std::vector<int> decode_batches = {1, 8, 32, 64};
  std::vector<int> decode_contexts = {1024, 16384};
  int max_decode_tokens = 1 << 20;  // skip batch x context pairs beyond this many KV tokens (64 x 16k)
  std::vector<int> verify_tokens = {1, 4, 8, 16};
  int verify_context = 4096;
  std::vector<int> prefill_lengths = {1024, 4096, 16384, 51200};
  int prefill_chunk = 4096;
  int reps = 10;
  double warmup_ms = 200;    // untimed steps before each decode/verify figure: at least 2, and this long
  int state_bytes = 2;       // bytes per GDN state element (fp16 default)
  double weight_bytes = 0;   // weight bytes one decode step reads (the caller measures them)
  double copy_gbps = 0;      // measured ceilings (0: not measured, no roofline)
  double bf16_tflops = 0;
  // Called around each figure's timed steps (not its warm-up), where the caller reads the GPU's
  // clock and power: clocks_end fills the row's clock fields (clock_samples and those after it).
  std::function<void()> clocks_begin;
  std::function<void(BenchRow&)> clocks_end;
};

struct BenchRow {
  std::string kind;     // decode, verify, prefill
  int batch = 0, tokens = 0, context = 0;
  double ms = 0;        // per step (decode, verify) or per whole prefill
  double tokens_per_s = 0;
  double roofline_ms = 0;
  std::string bound;    // "bytes" or "flops": which ceiling the roofline came from
  int clock_samples = 0;  // 0: the clocks were not read; else medians over the timed steps:
  double sm_mhz = 0, watts = 0;
  double capped = 0;      // fraction of samples with a power or thermal limiter active
  unsigned long long clock_reasons = 0;  // the limiters' and other clock-event bits seen (NVML's)
};

// Cache pools for the sweep in `o`: KV blocks of 16 tokens and state slots.
CacheGeometry model_bench_geometry(const Qwen35Model& model, const ModelBenchOptions& o);
// The step scratch the sweep in `o` takes at most (step_scratch_bytes of its largest step: the
// tokens and logit rows of a decode batch, a verify block or a prefill chunk).
size_t model_bench_step_scratch(const ModelConfig& c, const ModelBenchOptions& o);
// Runs the sweep; the caller has called ops.alloc_caches(model_bench_geometry(...)).
std::vector<BenchRow> run_model_bench(Qwen35Model& model, Ops& ops, const ModelBenchOptions& o);

}  // namespace ds
