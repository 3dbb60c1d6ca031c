// The model benchmark sweep (model_bench.h): plans built directly, host-timed steps after a
// synchronize, rooflines from the configuration's byte and FLOP counts.
#include "engine/model_bench.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "core/log.h"

namespace ds {

namespace {

constexpr int kBlock = 16;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// B sequences, each feeding `tokens` new tokens after `context` cached ones; sequence s owns
// slot s and a contiguous run of blocks.
StepPlan make_plan(int B, int tokens, int context, int blocks_per_seq, int vocab, std::mt19937& rng, bool all_logits) {
  StepPlan p;
  p.cu_seqlens = {0};
  p.max_blocks = blocks_per_seq;
  for (int s = 0; s < B; ++s) {
    for (int i = 0; i < tokens; ++i) {
      p.token_ids.push_back(static_cast<int32_t>(rng() % vocab));
      p.positions.push_back(context + i);
      if (all_logits || i == tokens - 1) p.logit_rows.push_back(p.n_tokens() - 1);
    }
    p.cu_seqlens.push_back(p.n_tokens());
    p.n_past.push_back(context);
    p.state_slots.push_back(s);
    for (int b = 0; b < blocks_per_seq; ++b) p.block_tables.push_back(s * blocks_per_seq + b);
  }
  return p;
}

// Linear-weight parameters touched per token (each decoder layer's projections and MLP).
double layer_linear_params(const ModelConfig& c) {
  const double H = c.hidden_size, I = c.intermediate_size;
  const double gdn = (c.conv_dim() + 2.0 * c.linear_num_value_heads * c.linear_value_head_dim +
                      2.0 * c.linear_num_value_heads) * H;  // qkv, z, b, a, out_proj
  const double attn = (2.0 * c.num_attention_heads * c.head_dim + 2.0 * c.num_key_value_heads * c.head_dim) * H +
                      H * c.num_attention_heads * c.head_dim;
  return c.n_linear_attention_layers() * gdn + c.n_full_attention_layers() * attn + c.num_hidden_layers * 3.0 * H * I;
}

}  // namespace

CacheGeometry model_bench_geometry(const Qwen35Model& model, const ModelBenchOptions& o) {
  int max_tokens = o.verify_context + 64;
  int max_batch = 1;
  for (int B : o.decode_batches)
    for (int ctx : o.decode_contexts)
      if (int64_t(B) * ctx <= o.max_decode_tokens) {
        max_tokens = std::max(max_tokens, B * (ctx + kBlock));
        max_batch = std::max(max_batch, B);
      }
  for (int n : o.prefill_lengths) max_tokens = std::max(max_tokens, n + kBlock);
  return model.cache_geometry(max_tokens / kBlock + max_batch + 1, kBlock, max_batch);
}

size_t model_bench_step_scratch(const ModelConfig& c, const ModelBenchOptions& o) {
  int64_t tokens = 1, logit_rows = 1;  // decode and verify steps take every row's logits, prefill its last
  for (int B : o.decode_batches) tokens = std::max<int64_t>(tokens, B), logit_rows = std::max<int64_t>(logit_rows, B);
  for (int k : o.verify_tokens) tokens = std::max<int64_t>(tokens, k), logit_rows = std::max<int64_t>(logit_rows, k);
  for (int n : o.prefill_lengths) tokens = std::max<int64_t>(tokens, std::min(n, o.prefill_chunk));
  return step_scratch_bytes(c, tokens, logit_rows);
}

std::vector<BenchRow> run_model_bench(Qwen35Model& model, Ops& ops, const ModelBenchOptions& o) {
  const ModelConfig& c = model.config();
  std::mt19937 rng(1234);
  std::vector<BenchRow> rows;
  DS_ASSERT(o.weight_bytes > 0, "ModelBenchOptions::weight_bytes must be set");
  const double w_bytes = o.weight_bytes;
  const double kv_bytes_per_token = 2.0 * c.n_full_attention_layers() * c.num_key_value_heads * c.head_dim * 2;
  const double state_bytes_per_seq = 2.0 * c.n_linear_attention_layers() * c.linear_num_value_heads *
                                     c.linear_key_head_dim * c.linear_value_head_dim * o.state_bytes;
  auto bytes_roofline = [&](double bytes) { return o.copy_gbps > 0 ? bytes / (o.copy_gbps * 1e9) * 1e3 : 0.0; };

  auto clocks_begin = [&] {
    if (o.clocks_begin) o.clocks_begin();
  };
  auto clocks_end = [&](BenchRow& r) {
    if (o.clocks_end) o.clocks_end(r);
  };
  auto time_step = [&](const StepPlan& plan, BenchRow& r) {
    // Warm-up: two steps (the first records the step's graph); then, with warmup_ms, one step
    // timed and as many more as fill warmup_ms, so that the GPU's clocks and power settle before
    // the timed steps. (With two only, C1's 10-step figures read 0.7% slower than 200-step
    // ones on an H100, with 200 ms 0.2%: docs/perf/2026-12-06-s73-cuda-27b.md.)
    auto steps = [&](int n) {
      for (int i = 0; i < n; ++i) {
        ops.reset_scratch();
        model.forward(plan);
      }
      ops.synchronize();
    };
    steps(2);
    if (o.warmup_ms > 0) {
      const double w0 = now_ms();
      steps(1);
      const double step_ms = now_ms() - w0;
      steps(step_ms > 0 ? static_cast<int>(std::min(1e4, o.warmup_ms / step_ms)) : 0);
    }
    clocks_begin();
    const double t0 = now_ms();
    steps(o.reps);
    r.ms = (now_ms() - t0) / o.reps;
    clocks_end(r);
  };

  for (int ctx : o.decode_contexts)
    for (int B : o.decode_batches) {
      if (int64_t(B) * ctx > o.max_decode_tokens) continue;
      const int blocks = (ctx + 1 + kBlock - 1) / kBlock;
      StepPlan plan = make_plan(B, 1, ctx, blocks, c.vocab_size, rng, true);
      BenchRow r{"decode", B, 1, ctx, 0, 0, 0, "bytes"};
      time_step(plan, r);
      r.tokens_per_s = B / (r.ms * 1e-3);
      r.roofline_ms = bytes_roofline(w_bytes + B * (ctx * kv_bytes_per_token + state_bytes_per_seq));
      DS_LOG_INFO("bench", "decode B=%d ctx=%d: %.3f ms (roofline %.3f ms)", B, ctx, r.ms, r.roofline_ms);
      rows.push_back(r);
    }

  for (int k : o.verify_tokens) {
    if (k <= 0) continue;  // 0: no verify figures
    const int blocks = (o.verify_context + k + kBlock - 1) / kBlock;
    StepPlan plan = make_plan(1, k, o.verify_context, blocks, c.vocab_size, rng, true);
    BenchRow r{"verify", 1, k, o.verify_context, 0, 0, 0, "bytes"};
    time_step(plan, r);
    r.tokens_per_s = k / (r.ms * 1e-3);
    r.roofline_ms = bytes_roofline(w_bytes + o.verify_context * kv_bytes_per_token + state_bytes_per_seq);
    DS_LOG_INFO("bench", "verify k=%d ctx=%d: %.3f ms", k, o.verify_context, r.ms);
    rows.push_back(r);
  }

  const double linear_flops_per_token = 2.0 * layer_linear_params(c);
  for (int n : o.prefill_lengths) {
    if (n <= 0) continue;  // 0: no prefill figures
    auto run_prefill = [&] {
      for (int done = 0; done < n;) {
        const int take = std::min(o.prefill_chunk, n - done);
        StepPlan plan = make_plan(1, take, done, (n + kBlock - 1) / kBlock, c.vocab_size, rng, false);
        ops.reset_scratch();
        model.forward(plan);
        done += take;
      }
      ops.synchronize();
    };
    run_prefill();  // warm-up at full length (also allocates nothing new: plans only)
    BenchRow r{"prefill", 1, n, 0, 0, 0, 0, "flops"};
    clocks_begin();
    const double t0 = now_ms();
    run_prefill();
    r.ms = now_ms() - t0;
    clocks_end(r);
    r.tokens_per_s = n / (r.ms * 1e-3);
    // causal attention: 2 matmuls of 2*hd FLOPs per (query, key<=query) pair per head
    const double attn_flops = 2.0 * 2.0 * c.head_dim * c.num_attention_heads * c.n_full_attention_layers() *
                              (double(n) * (n + 1) / 2);
    const double flops = linear_flops_per_token * n + attn_flops + 2.0 * c.vocab_size * c.hidden_size;
    r.roofline_ms = o.bf16_tflops > 0 ? flops / (o.bf16_tflops * 1e12) * 1e3 : 0.0;
    DS_LOG_INFO("bench", "prefill %d: %.1f ms, %.0f tok/s", n, r.ms, r.tokens_per_s);
    rows.push_back(r);
  }
  return rows;
}

}  // namespace ds
