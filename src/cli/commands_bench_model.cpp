// `bench model`: decode / verify / prefill step times of a checkpoint or of random weights of a
// configuration's exact shapes (--synthetic), beside rooflines measured in the same run.
#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "core/log.h"
#include "engine/backend_factory.h"
#include "engine/model_bench.h"
#include "io/checkpoint.h"
#ifdef DS_HAVE_CUDA
#include "backend/cuda/clocks.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device.h"
#include "backend/cuda/roofline.h"
#endif

namespace ds {

namespace {

struct BenchModelArgs {
  std::string config, model_dir, json_out;
  bool synthetic = false;
  bool w4a16 = false;
  std::string w4a8 = "none";
  bool profile = false;
  std::string lm_head_dtype = "int8";
  ModelBenchOptions o;
};


void run(BenchModelArgs& a) {
#ifndef DS_HAVE_CUDA
  cli_fail("bench model needs the CUDA backend; this build has none");
#else
  if (cuda_device_count() == 0) cli_fail("bench model needs a CUDA GPU");
  if (a.synthetic && !a.model_dir.empty()) cli_fail("give either --synthetic or --model, not both");
  if (!a.synthetic && a.model_dir.empty()) cli_fail("give --config C --synthetic, or --model DIR");
  const Roofline roof = measure_roofline();
  a.o.copy_gbps = roof.copy_gbps;
  a.o.bf16_tflops = roof.bf16_tflops;
  DS_LOG_INFO("bench", "measured ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s", roof.copy_gbps, roof.bf16_tflops);

  if (a.lm_head_dtype != "int8" && a.lm_head_dtype != "bf16") cli_fail("--lm-head-dtype is bf16 or int8");
  std::unique_ptr<Checkpoint> ck;
  ModelConfig config;
  if (a.synthetic) {
    if (a.config.empty()) cli_fail("--synthetic needs --config FILE");
    auto cfg = load_model_config(a.config);
    if (!cfg.ok()) cli_fail(cfg.status().message());
    config = cfg.value();
  } else {
    auto c = Checkpoint::open(a.model_dir);
    if (!c.ok()) cli_fail(c.status().message());
    ck = std::move(c.value());
    config = ck->config();
  }
  // The step scratch arena as serve sizes it (step_scratch_bytes), for the sweep's largest step:
  // a bound too small for these figures stops them.
  CudaOpsOptions co;
  co.scratch_bytes = model_bench_step_scratch(config, a.o);
  co.int8_vocab = a.lm_head_dtype == "int8";
  CudaOps ops(co);
  auto a8 = parse_act_int8_layers(a.w4a8);
  if (!a8.ok()) cli_fail(a8.status().message());
  std::unique_ptr<Qwen35Model> model;
  {
    auto m = a.synthetic ? Qwen35Model::synthetic(config, ops, /*with_mtp=*/false, a.w4a16, 1, a8.value())
                         : Qwen35Model::load(*ck, ops, a8.value());
    if (!m.ok()) cli_fail(m.status().message());
    model = std::move(m.value());
  }
  // Bytes a decode step streams: every weight but the embedding table (only B rows are read;
  // int8 rows: 1 byte per value + an f32 scale per 128). A tied table is the lm_head too, read whole.
  const ModelConfig& mc = model->config();
  const bool int8_table = co.int8_vocab && mc.hidden_size % 128 == 0;
  const double table_bytes = (int8_table ? 1.0 + 4.0 / 128 : 2.0) * mc.vocab_size * mc.hidden_size;
  a.o.weight_bytes = double(ops.weight_bytes()) - (mc.tie_word_embeddings ? 0.0 : table_bytes);
  // The caches hold the largest decode pair's KV and the longest prefill: a clear stop where they
  // do not fit (64 x 16k takes 64 GB of KV at the 27B's shape), not an allocation failure.
  const CacheGeometry geometry = model_bench_geometry(*model, a.o);
  const size_t need = ops.cache_bytes_for(geometry), free_bytes = cuda_free_bytes();
  if (need > free_bytes) {
    char msg[320];
    std::snprintf(msg, sizeof msg,
                  "bench model: the caches for these figures need %.1f GiB and %.1f GiB of GPU memory is free; "
                  "lower --max-kv-tokens (now %d: batch x context pairs above it are skipped), --batches, "
                  "--contexts or --prefill",
                  need / double(1 << 30), free_bytes / double(1 << 30), a.o.max_decode_tokens);
    cli_fail(msg);
  }
  ops.alloc_caches(geometry);
  DS_LOG_INFO("bench", "weights %.2f GB, caches %.2f GB", ops.weight_bytes() / 1e9, ops.cache_bytes() / 1e9);
  // Each figure's SM clock and board power, and how often a power or thermal limiter was active
  // while it was timed (its `capped` share of samples).
  ClockSampler clocks;
  if (clocks.available()) {
    a.o.clocks_begin = [&clocks] { clocks.begin(); };
    a.o.clocks_end = [&clocks](BenchRow& r) {
      const ClockFigures f = clocks.end();
      r.clock_samples = f.samples;
      r.sm_mhz = f.sm_mhz;
      r.watts = f.watts;
      r.capped = f.capped;
      r.clock_reasons = f.reasons;
    };
  }
  if (a.profile) cuda_profiler_start();
  std::vector<BenchRow> rows = run_model_bench(*model, ops, a.o);
  DS_LOG_INFO("bench", "step scratch: peak %.1f MiB of the %.1f MiB step_scratch_bytes gives the largest step",
              ops.scratch_peak() / 1048576.0, co.scratch_bytes / 1048576.0);
  std::printf("# ceilings: copy %.0f GB/s, bf16 matmul %.0f TFLOP/s; weights %s, %.2f GB on the GPU, %.2f GB read per "
              "decode step; W4A8 layers: %s\n",
              roof.copy_gbps, roof.bf16_tflops,
              a.w4a16 ? (int8_table ? "W4A16 (g128) + int8 lm_head" : "W4A16 (g128) + bf16 lm_head")
                      : (int8_table ? "bf16 + int8 lm_head" : "bf16"),
              ops.weight_bytes() / 1e9, a.o.weight_bytes / 1e9, a.w4a8.c_str());
  std::printf("%-8s %6s %7s %8s %11s %12s %12s %9s %7s %6s %7s\n", "kind", "batch", "tokens", "context", "ms", "tok/s",
              "roofline_ms", "of_roof", "sm_MHz", "W", "capped");
  std::string json;
  for (const BenchRow& r : rows) {
    const double frac = r.roofline_ms > 0 ? r.roofline_ms / r.ms : 0;
    std::printf("%-8s %6d %7d %8d %11.3f %12.1f %12.3f %8.1f%%", r.kind.c_str(), r.batch, r.tokens, r.context, r.ms,
                r.tokens_per_s, r.roofline_ms, 100 * frac);
    if (r.clock_samples > 0) std::printf(" %7.0f %6.0f %6.0f%%\n", r.sm_mhz, r.watts, 100 * r.capped);
    else std::printf(" %7s %6s %7s\n", "-", "-", "-");
    char line[640];
    int n = std::snprintf(line, sizeof line,
                          "{\"kind\":\"%s\",\"batch\":%d,\"tokens\":%d,\"context\":%d,\"ms\":%.4f,"
                          "\"tokens_per_s\":%.2f,\"roofline_ms\":%.4f,\"bound\":\"%s\"",
                          r.kind.c_str(), r.batch, r.tokens, r.context, r.ms, r.tokens_per_s, r.roofline_ms,
                          r.bound.c_str());
    if (r.clock_samples > 0)
      n += std::snprintf(line + n, sizeof line - n,
                         ",\"sm_mhz\":%.0f,\"watts\":%.1f,\"capped\":%.3f,\"clock_reasons\":\"0x%llx\","
                         "\"clock_samples\":%d",
                         r.sm_mhz, r.watts, r.capped, r.clock_reasons, r.clock_samples);
    std::snprintf(line + n, sizeof line - n, "}\n");
    json += line;
  }
  if (!a.json_out.empty()) std::ofstream(a.json_out) << json;
#endif
}

}  // namespace

void register_bench_model_command(CLI::App& bench) {
  auto a = std::make_shared<BenchModelArgs>();
  CLI::App* m = bench.add_subcommand("model", "decode/verify/prefill step times beside the measured roofline (GPU)");
  m->add_option("--config", a->config, "config.json of the shape to benchmark (with --synthetic)");
  m->add_flag("--synthetic", a->synthetic, "random weights of the config's shapes, drawn on the GPU");
  m->add_option("--model", a->model_dir, "benchmark a checkpoint folder instead");
  m->add_flag("--w4a16", a->w4a16, "synthetic linears as W4A16 group 128 (lm_head, in_proj_a/b stay bf16)");
  m->add_option("--w4a8", a->w4a8, kW4A8Help)->capture_default_str();
  m->add_option("--lm-head-dtype", a->lm_head_dtype, "embedding table and lm_head storage: int8 (group 128) or bf16")
      ->capture_default_str();
  m->add_option("--batches", a->o.decode_batches, "decode batch sizes")->delimiter(',')->capture_default_str();
  m->add_option("--contexts", a->o.decode_contexts, "decode context depths")->delimiter(',')->capture_default_str();
  m->add_option("--verify", a->o.verify_tokens, "verify block sizes (batch 1; 0: none)")->delimiter(',')->capture_default_str();
  m->add_option("--prefill", a->o.prefill_lengths, "prefill lengths (0: none)")->delimiter(',')->capture_default_str();
  m->add_option("--max-kv-tokens", a->o.max_decode_tokens, "skip decode batch x context pairs above this many KV tokens")
      ->capture_default_str();
  m->add_option("--reps", a->o.reps, "timed steps per decode/verify figure")->capture_default_str();
  m->add_option("--warmup-ms", a->o.warmup_ms, "untimed steps before each decode/verify figure, at least this long")
      ->capture_default_str();
  m->add_flag("--profile", a->profile, "start the profiler's capture after setup (ncu --profile-from-start off)");
  m->add_option("--json", a->json_out, "also write one JSON object per figure to this file");
  m->callback([a] { run(*a); });
}

}  // namespace ds
