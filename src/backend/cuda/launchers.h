// Kernel launchers of the CUDA backend: raw device pointers, sizes and a stream; each checks
// its launch. bf16 = __nv_bfloat16 storage. Shapes are outermost first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ops/sampling.h"

namespace ds::cuda {

using bf16 = __nv_bfloat16;

// out bf16 [T, H] = table bf16 [V, H] [ids i32 [T]]
void launch_embedding(const bf16* table, const int32_t* ids, bf16* out, int T, int H, cudaStream_t s);
// out bf16 [R, D] = x / rms(x) * w; w f32 [D]; may run in place
void launch_rms_norm(const bf16* x, const float* w, bf16* out, int R, int D, float eps, cudaStream_t s);
// x bf16 [R, D] += y, then out bf16 [R, D] = rms_norm(x) * w in one pass; false (nothing
// launched) when the shape or alignment does not suit the vector kernel
bool launch_add_rms_norm(bf16* x, const bf16* y, const float* w, bf16* out, int R, int D, float eps, cudaStream_t s);
// out bf16 [R, D] = w * (x / rms(x)) * act(z); act = sigmoid or silu
void launch_gated_rms_norm(const bf16* x, const bf16* z, const float* w, bf16* out, int R, int D, float eps,
                           bool sigmoid_gate, cudaStream_t s);
// out bf16 [T, N] *= 1 / sqrt((ss[0, t] + .. + ss[P - 1, t]) / D + eps) of each row t (ss f32
// [P, T], summed in order: Ops::scale_rows, RowScale)
void launch_scale_rows(bf16* out, const float* ss, int T, int N, int P, int D, float eps, cudaStream_t s);
// x += y (n elements)
void launch_add(bf16* x, const bf16* y, int64_t n, cudaStream_t s);
// out = silu(gate) * up (n elements)
void launch_silu_mul(const bf16* gate, const bf16* up, bf16* out, int64_t n, cudaStream_t s);
// in bf16 [T, 2 half]: a paired weight's GEMV output in its tiled row order (column 16 b + r is
// row 8 b + r of gate for r < 8, row 8 b + r - 8 of up else). With swiglu: a bf16 [T, half] =
// silu(gate) * up (as launch_silu_mul), else a = gate and b = up, bf16 [T, half] each.
void launch_paired_rows(const bf16* in, bf16* a, bf16* b, int T, int half, bool swiglu, cudaStream_t s);
// x *= sigmoid(gate) (n elements)
void launch_sigmoid_mul(bf16* x, const bf16* gate, int64_t n, cudaStream_t s);
// out bf16 [n_rows, H] = x bf16 [*, H] [rows i32 [n_rows]]
void launch_gather_rows(const bf16* x, const int32_t* rows, bf16* out, int n_rows, int H, cudaStream_t s);
// out bf16 [T, D1 + D2] = concat(a [T, D1], b [T, D2])
void launch_concat_cols(const bf16* a, const bf16* b, bf16* out, int T, int D1, int D2, cudaStream_t s);
// p bf16 [T, n_heads, 2, hd] -> q bf16 [T, n_heads, hd], gate bf16 [T, n_heads * hd]
void launch_split_query_gate(const bf16* p, bf16* q, bf16* gate, int T, int n_heads, int hd, cudaStream_t s);
// In place NeoX rotation of dims [0, rotary_dim) of x bf16 [T, n, hd] at positions i32 [T]
// split_query_gate + rms_norm of every query and key head + rope of both, in one launch:
// p bf16 [T, nH * 2 * hd] -> q bf16 [T, nH, hd], gate bf16 [T, nH * hd]; k bf16 [T, nKV, hd] in
// place; q_norm, k_norm f32 [hd]; positions i32 [T].
bool attention_prep_supported(int hd, int rotary_dim);
void launch_attention_prep(const bf16* p, bf16* k, const float* q_norm, const float* k_norm, bf16* q, bf16* gate,
                           const int32_t* positions, int T, int nH, int nKV, int hd, int rotary_dim, float theta,
                           float eps, cudaStream_t s);
void launch_rope(bf16* x, const int32_t* positions, int T, int n, int hd, int rotary_dim, float theta,
                 cudaStream_t s);
// g f32 [T, Hv] = -exp(a_log) * softplus(a + dt_bias); beta f32 [T, Hv] = sigmoid(b)
void launch_gdn_gates(const bf16* a, const bf16* b, const float* a_log, const float* dt_bias, float* g, float* beta,
                      int T, int Hv, cudaStream_t s);
// Synthetic weights: x[i] = random_uniform(seed, i, mean, half_range) (ops/random_fill.h)
void launch_fill_random_f32(float* x, int64_t n, float mean, float half_range, uint64_t seed, cudaStream_t s);
void launch_fill_random_bf16(bf16* x, int64_t n, float mean, float half_range, uint64_t seed, cudaStream_t s);
// out = y = x . w^T with cuBLAS lives in cuda_ops.cu (it needs the handle).

// Quantized GEMVs (qgemv_kernel.cuh): out bf16 [T, N] = x bf16 [T, K] . W^T, x 16-byte aligned,
// the weights streamed once for all T tokens. `splits` from *_gemv_splits(T, N, K); when it is
// > 1, partial is scratch f32 [splits, T, N] and counters i32 [kGemvMaxSplitTiles], zero before
// the first launch and left zero by each (one stream at a time).
constexpr int kGemvMaxSplitTiles = 4096;
constexpr int kW4A16GemvMaxTokens = 128;  // the wgmma kernel's limit per launch (NT 16); 64 for the others
constexpr int kInt8GemvMaxTokens = 64;
constexpr int kGemvMaxParts = 4;

// Where a GEMV's N output rows go: part p is bf16 [T, rows[p]] at ptr[p] and holds the next
// rows[p] rows (a fused weight, Ops::linear_parts); one part is a plain [T, N] output (for a paired
// weight, LinearWeight::paired, in its tiled row order: launch_paired_rows). swiglu (a paired
// weight, W4A16 launches of up to kGemvSwigluMaxTokens tokens, their one token tile): the GEMV
// writes only bf16 [T, N / 2] = silu(gate) * up of each pair, each rounded to bf16 first.
constexpr int kGemvSwigluMaxTokens = 8;
// norm (Ops::linear_add_rms_norm and RowScale: a pre-norm whose division by the RMS is left to the
// linears after it). Producer, x set (w4a16_gemv_norms_output): the launch's output rows, each
// rounded to bf16, are added to the residual stream x bf16 [T, N] (as launch_add_rms_norm adds
// them), the single part receives bf16(x * w) (w f32 [N]), and tile p of kGemvTileRows rows
// writes the sum of its new x^2 of token t to ss[p * T + t] (ss f32 [tiles, T]). Consumer, x null
// and ss set (W4A16 launches of w4a16_gemv_scales_output, the small GEMV; parts <=
// kGemvNormMaxParts): each output of token t is multiplied by 1 / sqrt(S * inv_d + eps), S the
// sum of ss[0, t] .. ss[parts - 1, t] (OutParts::row_scale's order). A producer with q8 set (W4A8,
// N % 64 == 0, T <= 8) also writes the int8 twin of its part (GemvInt8In's layout) into q8 and
// q8_scale (and its fp16 copy into GemvOut::f16 where that is set).
constexpr int kGemvTileRows = 128;
constexpr int kGemvNormMaxParts = 64;  // a consumer's parts: D up to 8192
struct GemvNorm {
  bf16* x = nullptr;
  const float* w = nullptr;
  float* ss = nullptr;
  float eps = 0.f, inv_d = 0.f;
  int parts = 0;
  int8_t* q8 = nullptr;
  float* q8_scale = nullptr;
};
// A W4A16 GEMV's inputs as int8 (W4A8): on, the launch rounds them as it stages them (ops/act_int8.h
// rounding), or, with q set, it reads a twin a producer made: q i8 [T, K], each 4 columns stored in
// the order 0, 2, 1, 3 (the order the GEMV's int8 mma pairs them in), scale f32 [T, K / 64] =
// max |x| / (127 * 16) of each 64-column chunk (the 16: the GEMV's int4 codes are 16 q).
struct GemvInt8In {
  bool on = false;
  const int8_t* q = nullptr;
  const float* scale = nullptr;
};
struct GemvOut {
  bf16* ptr[kGemvMaxParts] = {};
  int rows[kGemvMaxParts] = {};
  int n_parts = 0;
  bf16* swiglu = nullptr;
  GemvNorm norm;  // norm.ss null: none
  // Optional: the fp16 copy / 16 of the launch's output for the linear after it (launch_w4a16_gemv's
  // x_f16, the inputs of the GEMV's F16 form), each value as the F16 staging makes it of the bf16
  // one: of a norm producer's h (norm.x set), f16 [T, N], or of the swiglu output, f16 [T, N / 2].
  __half* f16 = nullptr;

  static GemvOut whole(bf16* out, int N) {
    GemvOut o;
    o.ptr[0] = out;
    o.rows[0] = N;
    o.n_parts = 1;
    return o;
  }
  static GemvOut swiglu_of(bf16* out, int N) {
    GemvOut o = whole(nullptr, N);
    o.swiglu = out;
    return o;
  }
  // The same parts from token t0 on.
  GemvOut from_token(int t0) const {
    GemvOut o = *this;
    for (int p = 0; p < n_parts; ++p)
      if (ptr[p]) o.ptr[p] += int64_t(t0) * rows[p];
    if (swiglu) o.swiglu += int64_t(t0) * (rows[0] / 2);
    if (f16) o.f16 += int64_t(t0) * (swiglu ? rows[0] / 2 : rows[0]);
    return o;
  }
};

// The environment switches of the settings below. env_flag: unset gives dflt; with dflt true
// only "0" turns it off, with dflt false only "1" turns it on. env_choice: unset gives dflt,
// else the value must be `off` or `on` (a fatal error naming the variable otherwise).
bool env_flag(const char* name, bool dflt);
bool env_choice(const char* name, const char* off, const char* on, bool dflt);

// Whether the forward's kernels are launched with programmatic dependent launch (launch.cuh), so
// each is scheduled while the one before it ends. env DS_PDL = 0 | 1 (default 1); tests may
// switch it.
bool pdl_enabled();
void set_pdl_enabled(bool on);
// The current device's SM count, and the shared memory an SM has for its blocks (bytes); each
// asked once.
int sm_count();
int smem_per_sm();
// The current device's compute capability major (9: Hopper's box copies and wgmma); 0 where the
// device cannot be asked. Asked once.
int compute_capability_major();
// The shared memory one block may opt in to (bytes, static and dynamic together).
int smem_per_block_optin();
// Diagnostics: kernels whose launch name (launch_kernel's first argument) is listed in env
// DS_SKIP_KERNELS (separated by ',' or '+', the latter for tools/gpu_ab.sh settings, whose
// variables are ','-separated) are not launched, so a benchmark of steps without them tells
// what they cost in place, with the kernels around them overlapping as they do; every result is
// then wrong. Warned about once when set.
bool kernel_skipped(const char* name);
// Diagnostics: before each launch whose name is listed in env DS_FLUSH_CODE_BEFORE (as
// DS_SKIP_KERNELS lists them), a plain kernel of DS_FLUSH_CODE_KB (kCodeFlushKilobytes, the
// default, or kCodeFlushSmallKilobytes) of straight-line code runs on every SM
// (launch_code_flush), and the launch starts only once it has ended (no early start). After the
// large kernel the launch's code is cold in every SM's instruction caches; after the small one it
// is as the step leaves it. So kernel timelines of the two tell what fetching its code costs the
// launch in place. Results are right. Returns the kilobytes for `name`, 0 where it is not listed.
constexpr int kCodeFlushKilobytes = 256, kCodeFlushSmallKilobytes = 4;
int code_flush_before(const char* name);
void launch_code_flush(int kilobytes, cudaStream_t s);
// Tokens per W4A16 GEMV launch (longer steps up to w4a16_gemv_step_tokens run it in slices; 0:
// always dequantise + cuBLAS). env DS_W4A16_GEMV_MAX_TOKENS = 0 .. kW4A16GemvMaxTokens (default 128
// with the wgmma kernel, 64 with the mma.sync wide kernel, else 32; above 64 only with wgmma).
int w4a16_gemv_tokens();
void set_w4a16_gemv_tokens(int n);
// Which W4A16 GEMV kernel: true, the one fed by the copy unit (qgemv_tma.cuh; the default on
// compute capability 9.0 and up); false, the register one (qgemv_kernel.cuh). env DS_W4A16_GEMV =
// tma | regs; tests may switch it.
bool w4a16_gemv_tma();
void set_w4a16_gemv_tma(bool on);
// Whether the TMA kernel may stage a one-tile launch's inputs in shared memory where they fit
// (qgemv_tma.cuh). env DS_W4A16_X_SMEM = 1 (default) | 0; tests may switch it.
bool w4a16_gemv_x_smem();
void set_w4a16_gemv_x_smem(bool on);
// Whether the TMA kernel's one-tile launches of at most 4 tokens that stage their inputs take them
// as fp16 x / 16 and their codes as fp16 (qgemv_tma.cuh, F16: two instructions a code word fewer;
// the sums are the same), unsplit ones then staging their inputs too, or at 1-8 tokens reading a
// producer's fp16 copy (w4a16_gemv_reads_f16_copy). env DS_W4A16_F16 = 1 (default) | 0; tests may
// switch it.
bool w4a16_gemv_f16();
void set_w4a16_gemv_f16(bool on);
// Whether launches of T tokens take the F16 form (w4a16_gemv_f16, the TMA kernel, inputs staged).
bool w4a16_gemv_takes_f16(int T);
// Whether unsplit launches of T tokens read a producer's fp16 copy of their inputs (x_f16 of
// launch_w4a16_gemv) where there is one: 1-8 tokens, as w4a16_gemv_f16 allows (no conversion).
bool w4a16_gemv_reads_f16_copy(int T);
// Diagnostic, results wrong: on, every W4A16 GEMV launch of the one-tile kernels (1-8 tokens, and
// more without the wide kernel) reads row block r's unit u from unit r + u of its weight: real
// units of the weight, other rows' (so the sums keep their size), from a window of row blocks +
// units units that stays in L2 once read. A launch then runs at the pace its warps take the
// stages rather than at the pace DRAM delivers them, in place, with the kernels around it as they
// are: a benchmark or trace beside one without it tells how much of each GEMV's time the memory
// sets. env DS_W4A16_L2_WEIGHTS = 0 (default) | 1, warned about once when used; tests may switch it.
bool w4a16_l2_weights();
void set_w4a16_l2_weights(bool on);
// Whether unsplit launches of 1-8 tokens whose K is at most 20 whole units (gate_up) take the
// K-slice kernel (qgemv_kslice.cuh: each warp a unit of K of the inputs in registers, the partials
// added through shared memory) rather than the narrow blocks of the TMA kernel, each warp a row
// block over all of K. On an H100: verify 8 at 4k 6.932 against 7.032 ms, verify 4 -0.05, C8
// -0.08 (docs/perf/2026-12-06-s77-cuda-27b.md); at one token too, C1 at 1k 5.94 against 6.07
// (docs/perf/2026-12-07-s80-cuda-27b.md). Since the split form (w4a16_gemv_kslice_split) took down
// at 2-8 tokens, the gain at 8 tokens is gone: verify 8 6.701 against 6.683 ms with it off, C1
// 5.833 against 5.961 (docs/perf/2026-12-07-s81-cuda-27b.md). env DS_W4A16_KSLICE = 1 (default) | 0;
// tests may switch it.
bool w4a16_gemv_kslice();
void set_w4a16_gemv_kslice(bool on);
// Whether split launches of 2-8 tokens of whole units of K take the K-slice kernel's split form
// (qgemv_kslice.cuh: each warp a unit of its block's split of K, the tile's row blocks in turn)
// where its splits hold 4-8 units each (kslice_split_fits: down, qkvz, qkv). On an H100 verify 8
// at 4k 6.740 against 6.909 ms, verify 4 -0.10, C8 -0.17, one token even
// (docs/perf/2026-12-07-s78-cuda-27b.md). env DS_W4A16_KSLICE_SPLIT = 1 (default) | 0; tests may
// switch it.
bool w4a16_gemv_kslice_split();
void set_w4a16_gemv_kslice_split(bool on);
// Whether a launch of T tokens of an N x K W4A16 weight (ungated, not W4A8) takes that split form.
bool w4a16_gemv_takes_kslice_split(int T, int N, int K, int group);
// Whether launches of 9 to 64 tokens take the TMA kernel whose blocks share their inputs
// (qgemv_wide.cuh) rather than the one-tile kernel. env DS_W4A16_WIDE = 1 (default) | 0; tests
// may switch it.
bool w4a16_gemv_wide();
void set_w4a16_gemv_wide(bool on);
// Whether launches of 33-128 tokens take the wide kernel's wgmma form (qgemv_wgmma.cuh), which
// needs a build with sm_90a code (DS_SM90A); else the mma.sync one, and launches take 64 at most.
// env DS_W4A16_WGMMA = 1 (default) | 0; tests may switch it: the setter returns false where the
// build cannot.
bool w4a16_gemv_wgmma();
bool set_w4a16_gemv_wgmma(bool on);
// The most tokens a step may have to take the GEMV (in slices) rather than dequantise + cuBLAS.
// env DS_W4A16_GEMV_STEP_TOKENS (default 448 with the wgmma kernel, else 256).
int w4a16_gemv_step_tokens();

// A read-only streaming probe (stream_probe.cu): GB/s read from a buffer of `megabytes` by
// sms * blocks_per_sm blocks of `threads`, either through per-warp rings of `stages` bulk copies
// of `bytes` (a multiple of 16), or with `unroll` (4 or 8) 16-byte loads in flight per thread;
// the median of `reps` timed passes over the buffer (median_ms, event_timing.cuh). A window
// smaller than L2 reads the same bytes from L2 alone (no DRAM): the rings' ceiling there. sms: the
// GPU's SM count when 0; fewer reads with part of the GPU, one block an SM where only one fits
// (the caller's choice of threads and shared memory).
struct StreamProbe {
  enum Method { kBulk, kAsync, kLoads } method = kBulk;
  enum Order { kStreams, kFront } order = kStreams;  // kBulk, kAsync: a warp's pieces (stream_probe.cu)
  int bytes = 2048, stages = 4, unroll = 8;
  int threads = 256, blocks_per_sm = 2;
  int megabytes = 512, reps = 10;
  int sms = 0;
  int ring_offset = -1;  // kBulk, kAsync: rings right after the barriers, or bytes past a 128-byte boundary
  int window_mb = 0;     // kBulk, kAsync: every piece read from the buffer's first window_mb MB (0: all of it)
};
double stream_probe_gbps(const StreamProbe& p);
// The step's weight stream in one persistent launch (stream_probe.cu): phase_bytes in order (each
// rounded down to whole pieces of `bytes`), sms * blocks_per_sm blocks of `threads` with per-warp
// rings of `stages` pieces running ahead across phases; a phase is read once every warp is done
// with the one before and gap_ns more have passed (a dependent small op). Each warp reads an equal
// share of every phase (grab 0), or claims `grab` pieces at a time of what is left of it. The
// median of `reps` launches, in ms.
struct StepStreamProbe {
  std::vector<int64_t> phase_bytes;
  int bytes = 2176, stages = 6, threads = 512, blocks_per_sm = 1;
  int gap_ns = 0, grab = 0, reps = 5;
};
double step_stream_probe_ms(const StepStreamProbe& p);
// An instruction-fetch probe (code_probe.cu): the median over `reps` launches of the median CTA's
// clock cycles to run `kilobytes` (4, 16, 32, 64 or 128) of FFMA code, 8 independent chains a
// thread, in `ctas` CTAs (at most one an SM) of `threads` (whole warps): as straight-line code,
// or rolled (the same FFMAs as a loop of a 1 KB body); its code cold (other code just run on every
// SM) or warm (the same launch just run).
struct CodeProbe {
  int kilobytes = 64;
  bool rolled = false, cold = true;
  int ctas = 48, threads = 256, reps = 15;
};
double code_probe_cycles(const CodeProbe& p);

// W4A16 in the tiled layout of w4a16.cu, made at load from the compressed-tensors layout
// (packed u32 [N, K/8], nibble j of word c = column 8c+j as q+8; scales f32 [N, K/group]).
// Tiled: u32 [ceil(N/16), w4a16_tiled_block_words(K, group)], scales inside.
bool w4a16_tiled_supports(int K, int group);  // group a power of two >= 64 dividing K
int64_t w4a16_tiled_block_words(int K, int group);  // u32 words of one 16-row block
// paired (N % 16 == 0): tiled row block b takes rows [8b, 8b + 8) of each half (LinearWeight::paired).
void launch_w4a16_repack(const uint32_t* packed, const float* scales, uint32_t* tiled, int N, int K, int group,
                         bool paired, cudaStream_t s);
int w4a16_gemv_splits(int T, int N, int K);
// The input gate a W4A16 GEMV may apply while it stages its input: x_gated = silu(x) * xb
// (kSiluMul: a down_proj whose gate and up are separate weights), rounded to bf16 as launch_silu_mul
// does. (The attention's sigmoid gate is applied where its key splits are merged,
// Ops::gated_attention; other sigmoid-gated inputs take sigmoid_mul first.)
enum class GemvGate : int { kNone, kSiluMul };
// Whether T tokens take one launch that can gate its input (the TMA GEMV, T <= 8 and within
// w4a16_gemv_tokens, its inputs in shared memory).
bool w4a16_gemv_gates_input(int T, int N, int K, int group);
// Whether T tokens of a W4A16 GEMV of N rows take one split-K launch of the one-tile TMA kernel,
// whose epilogue can produce a GemvOut::norm (gated: with its input gated, w4a16_gemv_gates_input).
bool w4a16_gemv_norms_output(int T, int N, int K, int group, bool gated);
// Whether a W4A16 GEMV of T tokens takes one launch of the one-tile TMA kernel, whose epilogues
// scale the outputs by a consumer's GemvOut::norm.
bool w4a16_gemv_scales_output(int T);
// Whether a W4A16 GEMV launch of T tokens can write a swiglu output (GemvOut: one token tile).
bool w4a16_gemv_writes_swiglu(int T);
// Whether a launch of T tokens of a W4A16 GEMV of N rows (gated: its input gated) can take int8
// inputs (W4A8, LinearWeight::act_int8), rounding them itself: a split launch of the one-tile TMA
// kernel of at most 4 tokens (within w4a16_gemv_tokens) whose int8 inputs fit beside its rings
// (qgemv_tma.cuh, tma_a8_fits); or read from a producer's twin (twin, ungated, T <= 8, K a
// multiple of 64): an unsplit launch, or a split one whose int8 inputs fit beside its rings.
bool w4a16_gemv_takes_a8(int T, int N, int K, int group, bool gated, bool twin = false);
// x bf16 [T, K], T <= w4a16_gemv_tokens's limit; N = the sum of out's rows; splits from w4a16_gemv_splits
// With a gate (w4a16_gemv_gates_input), xb bf16 [T, K] is its second input. a8 on (where
// w4a16_gemv_takes_a8): int8 inputs for int8 tensor cores, rounded in the launch or read from a8.q.
// x_f16 (optional, where w4a16_gemv_reads_f16_copy(T)): a producer's fp16 copy of x / 16
// (GemvNorm::f16), which an unsplit launch reads instead of x.
void launch_w4a16_gemv(const bf16* x, const uint32_t* tiled, const GemvOut& out, float* partial, int* counters,
                       int splits, int T, int N, int K, int group, cudaStream_t s, const bf16* xb = nullptr,
                       GemvGate gate = GemvGate::kNone, GemvInt8In a8 = {}, const __half* x_f16 = nullptr);
// w bf16 [N, K] = dequantised tiled W (the cuBLAS path of large T). paired (N % 16 == 0): the
// rows of a paired weight's blocks as the two halves, w [0, N/2) and [N/2, N).
void launch_w4a16_dequant(const uint32_t* tiled, bf16* w, int N, int K, int group, bool paired, cudaStream_t s);

// Int8 group-128 rows (ops/int8_rows.h's values) in the GEMV's tile layout (qgemv_kernel.cuh,
// Int8Tiled): rows padded to int8_tiled_rows, q i8 [padded rows * H], scales f32 [padded rows *
// H/128]. Quantises w bf16 [rows, H] into them (the padding zeroed).
int64_t int8_tiled_rows(int64_t rows);
void launch_int8_quantize_rows(const bf16* w, int8_t* q, float* scales, int64_t rows, int H, cudaStream_t s);
// Copies a table already quantised so, q_host i8 [rows, H] and scales_host f32 [rows, H/128], into
// q and scales in the tile layout (the padding zeroed); tiled on the host a piece at a time.
void upload_int8_tiled(const int8_t* q_host, const float* scales_host, int64_t rows, int H, int8_t* q, float* scales);
// Whether int8 GEMV launches of 9 to kInt8GemvMaxTokens tokens take the wide kernel (qgemv_wide.cuh:
// a block's stages share their inputs; compute capability 9.0 and up) rather than the one whose
// warps each read their inputs. env DS_INT8_WIDE = 1 (default) | 0; tests may switch it.
bool int8_gemv_wide();
void set_int8_gemv_wide(bool on);
// The split count and the partial sums' floats (0: none) of an int8 GEMV launch of T tokens.
int int8_gemv_splits(int T, int N, int K);
int64_t int8_gemv_partial_floats(int T, int N, int K);
// out's parts (no norm, swiglu or fp16 copy) = x bf16 [T, K] . w^T, T <= kInt8GemvMaxTokens; q,
// scales: tiled int8 rows, N rows and K columns; partial: f32 [int8_gemv_partial_floats] (16-byte
// aligned) where that is not 0; splits from int8_gemv_splits.
void launch_int8_gemv(const bf16* x, const int8_t* q, const float* scales, const GemvOut& out, float* partial,
                      int64_t partial_floats, int* counters, int splits, int T, int N, int K, cudaStream_t s);
// w bf16 [rows, H] = dequantised rows [row0, row0 + rows) of a tiled table of H columns
void launch_int8_dequant_rows(const int8_t* q, const float* scales, bf16* w, int64_t row0, int rows, int H,
                              cudaStream_t s);
// out bf16 [T, H] = the dequantised rows ids i32 [T] of a tiled table of H columns
void launch_int8_embedding(const int8_t* q, const float* scales, const int32_t* ids, bf16* out, int T, int H,
                           cudaStream_t s);
// x[i] = random 32-bit patterns (synthetic packed weights)
void launch_fill_random_bits(uint32_t* x, int64_t n, uint64_t seed, cudaStream_t s);

// Dense bf16 out [T, N] = x [T, K] . w [N, K]^T for N <= kSmallGemvMaxRows output rows and
// T <= kSmallGemvMaxTokens tokens (x and w 16-byte aligned, K % 8 == 0): a block per row and pass
// of up to 8 tokens. Up to 32 tokens (cuBLAS above): taking 33-64 tokens too made C64 at 1k 0.6 ms
// slower on an H100 (20.95-21.00 against 20.32-20.41 ms; docs/perf/2026-12-06-s66-cuda-27b.md).
constexpr int kSmallGemvMaxTokens = 32;
constexpr int kSmallGemvMaxRows = 256;
bool small_gemv_supported(const void* x, const void* w, int T, int N, int K);
// out.norm: a consumer's scale (GemvNorm). independent: x (and out.norm's sums) was complete
// before the previous kernel began (it read x too), so the blocks compute at once and wait for
// that kernel only before they end, and the next kernel launches at once (programmatic dependent
// launch: the kernels after still see everything before complete; what the next kernel touches
// before its pdl_wait, no kernel of the step writes).
void launch_small_gemv(const bf16* x, const bf16* w, const GemvOut& out, int T, int N, int K, cudaStream_t s,
                       bool independent = false);

// Varlen causal depthwise conv + SiLU from the conv state, then the state update.
// mixed bf16 [T, C]; w f32 [C, K]; state bf16 [n_slots, K-1, C]; out bf16 [T, C].
// seq_of_token i32 [T]; cu_seqlens i32 [n_seqs+1]; n_past, slots i32 [n_seqs]. max_chunk: the
// most tokens of one sequence; up to kConvShortChunk take the one-kernel path.
constexpr int kConvShortChunk = 16;
constexpr int kConvMaxShortK = 8;  // conv widths the one-kernel path holds in registers
void launch_conv1d_silu(const bf16* mixed, const float* w, bf16* state, bf16* out, const int32_t* seq_of_token,
                        const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* slots, int T, int n_seqs,
                        int C, int K, int max_chunk, cudaStream_t s);

// Gated delta rule, token by token per (sequence, v-head), from and back to the state pool;
// short_chunks (every sequence feeds <= kGdnDecodeMaxTokens tokens: decode, verify) picks the
// register-state kernel that spreads each head over tiles of 32 state columns (dk <= 128).
// qkv bf16 [T, 2*Hk*dk + Hv*dv]; state [n_slots, Hv, dk, dv] of state_dtype (0 f32, 1 f16,
// 2 bf16); out bf16 [T, Hv, dv].
constexpr int kGdnDecodeMaxTokens = 16;
// The gates: g (log-decay) and beta f32 [T, Hv] as launch_gdn_gates makes them, or, for the
// register-state kernel only, a and b bf16 [T, Hv] with a_log, dt_bias f32 [Hv], from which
// it makes them itself (gdn_gate, common.cuh) and saves the gates launch.
struct GdnGates {
  const float* g = nullptr;
  const float* beta = nullptr;
  const bf16* a = nullptr;
  const bf16* b = nullptr;
  const float* a_log = nullptr;
  const float* dt_bias = nullptr;
};
// The gated RMSNorm the decode kernel of a CTA a head may apply to each v-head's output row
// before it is stored (launch_gated_rms_norm's math, on the output rounded to bf16): out = w * (o /
// rms(o)) * act(z), act = sigmoid if sigmoid_gate else silu. z bf16 [T, Hv*dv]; w f32 [dv]. Off (z
// null): out gets the rule's output as it is. f16 (optional, where gdn_norm_copies): f16 [T,
// Hv*dv], the normed output's fp16 copy / 16 for the linear after it (out_proj: launch_w4a16_gemv's
// x_f16), each value as the GEMV's F16 staging makes it of the bf16 one.
struct GdnNorm {
  const bf16* z = nullptr;
  const float* w = nullptr;
  float eps = 0.f;
  bool sigmoid_gate = false;
  __half* f16 = nullptr;
};
// The causal conv1d + SiLU (launch_conv1d_silu's math, bit for bit) that the one-token decode
// kernel (kGdnOneToken, with a GdnNorm) may apply to its inputs itself: qkv is then the pre-conv
// mixed rows bf16 [T, C], and the kernel also writes each sequence's new conv state. The CTAs of
// a k-head's v-heads each read its q and k state rows, so they count their reads (counters: one
// per (sequence, k-head), zero between launches) and the last to arrive writes those rows; each
// CTA writes its own v channels' rows. w f32 [C, K], K <= kGdnConvMaxK; state bf16 [n_slots, K-1,
// C]; counters i32 [kGdnConvCounters]. Off: w null (the conv is launch_conv1d_silu's, before).
struct GdnConv {
  const float* w = nullptr;
  bf16* state = nullptr;
  int* counters = nullptr;
  int K = 0;
};
constexpr int kGdnConvMaxK = 4;
constexpr int kGdnConvCounters = 4096;
// Whether CudaOps gives decode steps a GdnConv (env DS_GDN_CONV = 1, the default | 0; tests may
// switch it).
bool gdn_conv_fused();
void set_gdn_conv_fused(bool on);
// Whether the one-token kernel's CTAs of n_seqs sequences of Hv heads fit one wave, where it takes
// the conv (in a second wave the conv's loads before pdl_wait would no longer overlap the kernels
// before).
bool gdn_conv_fits(int n_seqs, int Hv);
bool gdn_decode_supported(int dk);
// Whether launch_gdn_recurrent can apply a GdnNorm (short chunks; the kernel of a CTA a head holds
// the head's state of state_dtype in shared memory).
bool gdn_decode_norm_supported(int dk, int dv, int state_dtype);
// head_parts: the row parts of a column in the decode kernel of a CTA a head (gdn_recurrent.cu),
// 2 (256 threads) by default, 4 (512 threads) for the steps of few sequences that CudaOps gives it;
// kGdnHeadPair: a CTA pair a head, each with half the columns in 8 parts (512 threads), for the
// verify steps of 4 or more tokens whose pairs fit one wave (gdn_decode_pair_fits).
// kGdnOneToken: every sequence feeds one token (decode steps), the gates come as a and b, and
// gdn_decode_token_supported: a CTA of 256 threads a head whose token takes no barrier
// (gdn_decode_token_kernel).
// kGdnVerifyMma: verify steps (up to kGdnDecodeMaxTokens tokens a sequence), the gates as a and
// b, gdn_verify_mma_supported: a CTA of 256 threads a head that takes the step's tokens at once
// in closed form on tensor cores (gdn_verify_mma_kernel).
constexpr int kGdnHeadParts = 2;
constexpr int kGdnHeadFewSeqsParts = 4;
constexpr int kGdnVerifyMma = -3;
constexpr int kGdnHeadPair = -2;
constexpr int kGdnOneToken = -1;
bool gdn_verify_mma_supported(int dk, int dv, int state_dtype);
// Whether CudaOps gives verify steps kGdnVerifyMma (env DS_GDN_MMA = 1, the default | 0; tests may
// switch it).
bool gdn_verify_mma();
void set_gdn_verify_mma(bool on);
bool gdn_decode_token_supported(int dk, int dv);
// Whether CudaOps gives decode steps kGdnOneToken (env DS_GDN_TOKEN = 1, the default | 0; tests
// may switch it).
bool gdn_decode_token();
void set_gdn_decode_token(bool on);
// Whether the CTA pairs of n_seqs sequences of Hv heads fit one wave (one 512-thread CTA an SM),
// and the pairs are on (env DS_GDN_PAIR = 1, the default | 0; gdn_decode_pair, set_gdn_decode_pair).
bool gdn_decode_pair_fits(int n_seqs, int Hv);
bool gdn_decode_pair();
void set_gdn_decode_pair(bool on);
// Whether the kernel of head_parts makes GdnNorm::f16: kGdnOneToken and kGdnVerifyMma, the decode
// and verify kernels (the others' registers would spill).
constexpr bool gdn_norm_copies(int head_parts) { return head_parts == kGdnOneToken || head_parts == kGdnVerifyMma; }
void launch_gdn_recurrent(const bf16* qkv, const GdnGates& gates, void* state, int state_dtype, bf16* out,
                          const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* slots, int n_seqs, int Hk,
                          int Hv, int dk, int dv, bool short_chunks, cudaStream_t s, const GdnNorm& norm = {},
                          int head_parts = kGdnHeadParts, const GdnConv& conv = {});

// Gated delta rule prefill in chunks of 64 tokens on tensor cores (gdn_chunked.cu), same
// contract as launch_gdn_recurrent for head dims up to 128 (gdn_chunked_supported). T: tokens
// of the step; max_seq_len: the most tokens of one sequence; scratch: device memory of
// gdn_chunked_scratch_bytes(T, Hk, Hv), 256-byte aligned.
bool gdn_chunked_supported(int dk, int dv);
size_t gdn_chunked_scratch_bytes(int T, int Hk, int Hv);
void launch_gdn_chunked(const bf16* qkv, const float* g, const float* beta, void* state, int state_dtype, bf16* out,
                        const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* slots, int n_seqs, int T,
                        int max_seq_len, int Hk, int Hv, int dk, int dv, void* scratch, cudaStream_t s);

// Paged KV append: k, v bf16 [T, nKV, hd] into k_cache, v_cache bf16 [n_blocks, block_size, nKV, hd]
// at each token's cache row (n_past[seq] + index in the sequence).
void launch_kv_append(const bf16* k, const bf16* v, bf16* k_cache, bf16* v_cache, const int32_t* seq_of_token,
                      const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* block_tables, int max_blocks,
                      int T, int nKV, int hd, int block_size, cudaStream_t s);
// Query-row groups per (sequence, KV head): a CTA takes 8 rows (token, head of the group).
int attention_row_groups(int max_chunk, int nH, int nKV);
// Key splits for attention: one per 64 keys of the longest context, fewer when the step
// already has enough CTAs to fill the GPU or when the partial buffers
// f32 [T, nH, n_splits, hd + 2] would exceed partial_budget_bytes.
int attention_splits(int n_seqs, int row_groups, int nH, int nKV, int hd, int T, int max_ctx,
                     size_t partial_budget_bytes);
// Causal GQA attention of q bf16 [T, nH, hd] over each sequence's paged cache -> out bf16
// [T, nH*hd] for the sequences with at most max_chunk new tokens, whose tokens lie in
// [t_begin, t_end) (other rows are left untouched). max_ctx: the longest context any of those
// tokens attends to; row_groups from attention_row_groups(max_chunk); partial: f32
// [t_end - t_begin, nH, n_splits, hd + 2] when n_splits > 1.
void launch_attention(const bf16* q, const bf16* k_cache, const bf16* v_cache, bf16* out, float* partial,
                      int n_splits, int row_groups, int max_ctx, const int32_t* seq_of_token, const int32_t* cu_seqlens,
                      const int32_t* n_past, const int32_t* block_tables, int max_blocks, int t_begin, int t_end,
                      int n_seqs, int max_chunk, int nH, int nKV, int hd, int block_size, float scale, cudaStream_t s);
// The attention's output gate, applied where the split partials are merged (launch_attention_combine):
// out = bf16(out * sigmoid(gate)), rounded as launch_sigmoid_mul rounds it, and, with half, its fp16
// copy half = out / 16 (the gated attention's o_proj reads it: CudaOps::gated_attention). gate bf16
// and half f16 of out's shape, [T, nH*hd]; both null: no gate.
struct AttnGate {
  const bf16* gate = nullptr;
  __half* half = nullptr;
};
// Merges split partials f32 [t_end - t_begin, nH, n_splits, hd + 2] (accumulator, max, sum)
// into out bf16 [T, nH*hd] for the tokens t_begin <= t < t_end of sequences with
// min_chunk < new tokens <= max_chunk; gate (optional) then applied to those rows.
void launch_attention_combine(const float* partial, bf16* out, const int32_t* seq_of_token, const int32_t* cu_seqlens,
                              int t_begin, int t_end, int min_chunk, int max_chunk, int nH, int hd, int n_splits,
                              cudaStream_t s, AttnGate gate = {});
// Whether launch_attention_prefill has a kernel for this head dim (64, 128, 256).
bool attention_prefill_supported(int hd);
// Whether launch_attention_prefill gives the sequences of at most max_len new tokens, their
// query heads packed per KV head (pack = nH / nKV), to attention_decode_kernel: at most 32 rows
// and attention_decode_warps().
bool attention_decode_takes(int max_len, int pack);
// Key splits for launch_attention_prefill: enough CTAs for `waves` waves on this GPU (one CTA an
// SM) when the step has few query tiles and long contexts (at least min_split_keys keys per
// split), within the partial budget (f32 [T, nH, n_splits, hd + 2]). With one wave the count
// is rounded down, so every CTA runs at once.
// n_seqs: sequences the launch serves (each has at least one tile); T: tokens of the partials.
int attention_prefill_splits(int n_seqs, int T, int nH, int hd, int max_ctx, int pack, int min_split_keys,
                             int waves, size_t partial_budget_bytes);
// Tensor-core causal GQA attention (flash, tiles of 128 query rows) for the sequences with
// min_len < new tokens <= max_len; rows of the other sequences are left untouched. pack 1 (a
// CTA per query head: prefill) or nH / nKV (a CTA per KV head, its query heads packed into the
// rows: decode and verify). Same q, caches and out as launch_attention; cu_seqlens i32
// [n_seqs + 1]; partial: scratch of attention_prefill_splits' size when n_splits > 1.
// k_new, v_new: null when the step's keys and values are in the caches (launch_kv_append), or
// those (bf16 [T, nKV, hd]) for attention_decode_kernel to append itself (min_len 0, and
// attention_decode_takes(max_len, pack)), so that it can ask for the cached ones before pdl_wait.
// gate: applied by the merge of the splits (n_splits > 1), to the rows of those sequences.
void launch_attention_prefill(const bf16* q, bf16* k_cache, bf16* v_cache, const bf16* k_new, const bf16* v_new,
                              bf16* out, float* partial, int n_splits, const int32_t* seq_of_token,
                              const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* block_tables,
                              int max_blocks, int T, int n_seqs, int min_len, int max_len, int pack, int nH, int nKV,
                              int hd, int block_size, float scale, cudaStream_t s, AttnGate gate = {});
// Which kernel takes the sequences of at most 16 new tokens (decode, verify) where the tensor-
// core kernel has the head dim: true (default), launch_attention_prefill with GQA packing; false,
// the CUDA-core split-KV kernel (launch_attention). env DS_ATTN_DECODE = tc | simt; tests may
// switch it. (tc measured faster at every shape on the H200: docs/perf/2026-11-29-s5-cuda-27b.md.)
bool attention_decode_tc();
void set_attention_decode_tc(bool on);
// Within launch_attention_prefill, whether sequences of at most 32 packed rows (new tokens times
// the GQA group) take attention_decode_kernel, every warp on each 64-key tile (true, default), or
// the flash kernel whose one warp owns 16 rows. env DS_ATTN_DECODE_WARPS = 1 | 0; tests may
// switch it.
bool attention_decode_warps();
void set_attention_decode_warps(bool on);
// Whether CudaOps::attention lets attention_decode_kernel append the step's keys and values
// (true, default; steps it takes whole) or appends them with launch_kv_append first.
// env DS_ATTN_DECODE_APPENDS = 1 | 0; tests may switch it.
bool attention_decode_appends();
void set_attention_decode_appends(bool on);

// Per-row parameters of launch_sample, built on the host from a SampleRowSpec.
struct SampleRowParams {
  int64_t work_offset;  // the row's f32 [V] edited copy in `work`, or -1 when it has no edits
  uint64_t seed, draw;
  float temperature, top_p, min_p;
  int32_t row, top_k, n_logprobs;
  int32_t edit_begin, edit_end;  // its LogitEdits: edits[edit_begin, edit_end)
};
// One token per row (sampler.cu): logits bf16 [*, V]; rows [n_rows]; edits [sum of ranges];
// work f32 [rows with edits, V]; out [n_rows].
void launch_sample(const bf16* logits, int V, const SampleRowParams* rows, int n_rows, const LogitEdit* edits,
                   float* work, SampledToken* out, cudaStream_t s);

}  // namespace ds::cuda
