// Kernel launchers of the CUDA backend: raw device pointers, sizes and a stream; each checks
// its launch. bf16 = __nv_bfloat16 storage. Shapes are outermost first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/sampling.h"

namespace ds::cuda {

using bf16 = __nv_bfloat16;

// out bf16 [T, H] = table bf16 [V, H] [ids i32 [T]]
void launch_embedding(const bf16* table, const int32_t* ids, bf16* out, int T, int H, cudaStream_t s);
// out bf16 [R, D] = x / rms(x) * w; w f32 [D]; may run in place
void launch_rms_norm(const bf16* x, const float* w, bf16* out, int R, int D, float eps, cudaStream_t s);
// out bf16 [R, D] = w * (x / rms(x)) * act(z); act = sigmoid or silu
void launch_gated_rms_norm(const bf16* x, const bf16* z, const float* w, bf16* out, int R, int D, float eps,
                           bool sigmoid_gate, cudaStream_t s);
// x += y (n elements)
void launch_add(bf16* x, const bf16* y, int64_t n, cudaStream_t s);
// out = silu(gate) * up (n elements)
void launch_silu_mul(const bf16* gate, const bf16* up, bf16* out, int64_t n, cudaStream_t s);
// x *= sigmoid(gate) (n elements)
void launch_sigmoid_mul(bf16* x, const bf16* gate, int64_t n, cudaStream_t s);
// out bf16 [n_rows, H] = x bf16 [*, H] [rows i32 [n_rows]]
void launch_gather_rows(const bf16* x, const int32_t* rows, bf16* out, int n_rows, int H, cudaStream_t s);
// out bf16 [T, D1 + D2] = concat(a [T, D1], b [T, D2])
void launch_concat_cols(const bf16* a, const bf16* b, bf16* out, int T, int D1, int D2, cudaStream_t s);
// p bf16 [T, n_heads, 2, hd] -> q bf16 [T, n_heads, hd], gate bf16 [T, n_heads * hd]
void launch_split_query_gate(const bf16* p, bf16* q, bf16* gate, int T, int n_heads, int hd, cudaStream_t s);
// In place NeoX rotation of dims [0, rotary_dim) of x bf16 [T, n, hd] at positions i32 [T]
void launch_rope(bf16* x, const int32_t* positions, int T, int n, int hd, int rotary_dim, float theta,
                 cudaStream_t s);
// g f32 [T, Hv] = -exp(a_log) * softplus(a + dt_bias); beta f32 [T, Hv] = sigmoid(b)
void launch_gdn_gates(const bf16* a, const bf16* b, const float* a_log, const float* dt_bias, float* g, float* beta,
                      int T, int Hv, cudaStream_t s);
// Synthetic weights: x[i] = random_uniform(seed, i, mean, half_range) (ops/random_fill.h)
void launch_fill_random_f32(float* x, int64_t n, float mean, float half_range, uint64_t seed, cudaStream_t s);
void launch_fill_random_bf16(bf16* x, int64_t n, float mean, float half_range, uint64_t seed, cudaStream_t s);
// out = y = x . w^T with cuBLAS lives in cuda_ops.cu (it needs the handle).

// W4A16, compressed-tensors layout: packed u32 [N, K/8] (nibble j of word c = column 8c+j, q+8),
// scales f32 [N, K/group]. out bf16 [T, N] = x bf16 [T, K] . W^T (small T: streams W once per
// 8 tokens).
void launch_w4a16_gemv(const bf16* x, const uint32_t* packed, const float* scales, bf16* out, int T, int N, int K,
                       int group, cudaStream_t s);
// w bf16 [N, K] = dequantised W (for the cuBLAS path of large T)
void launch_w4a16_dequant(const uint32_t* packed, const float* scales, bf16* w, int N, int K, int group,
                          cudaStream_t s);
// x[i] = random 32-bit patterns (synthetic packed weights)
void launch_fill_random_bits(uint32_t* x, int64_t n, uint64_t seed, cudaStream_t s);

// Varlen causal depthwise conv + SiLU from the conv state, then the state update.
// mixed bf16 [T, C]; w f32 [C, K]; state bf16 [n_slots, K-1, C]; out bf16 [T, C].
// seq_of_token i32 [T]; cu_seqlens i32 [n_seqs+1]; n_past, slots i32 [n_seqs].
void launch_conv1d_silu(const bf16* mixed, const float* w, bf16* state, bf16* out, const int32_t* seq_of_token,
                        const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* slots, int T, int n_seqs,
                        int C, int K, cudaStream_t s);

// Gated delta rule, token by token per (sequence, v-head), from and back to the state pool;
// split_columns spreads each head over tiles of 32 state columns (for decode-sized chunks).
// qkv bf16 [T, 2*Hk*dk + Hv*dv]; g, beta f32 [T, Hv]; state [n_slots, Hv, dk, dv] of
// state_dtype (0 f32, 1 f16, 2 bf16); out bf16 [T, Hv, dv].
void launch_gdn_recurrent(const bf16* qkv, const float* g, const float* beta, void* state, int state_dtype,
                          bf16* out, const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* slots, int n_seqs,
                          int Hk, int Hv, int dk, int dv, bool split_columns, cudaStream_t s);

// Paged KV append: k, v bf16 [T, nKV, hd] into k_cache, v_cache bf16 [n_blocks, block_size, nKV, hd]
// at each token's cache row (n_past[seq] + index in the sequence).
void launch_kv_append(const bf16* k, const bf16* v, bf16* k_cache, bf16* v_cache, const int32_t* seq_of_token,
                      const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* block_tables, int max_blocks,
                      int T, int nKV, int hd, int block_size, cudaStream_t s);
// Key splits for attention: one per 256 keys of the longest context, fewer when the step
// already has enough (token, head) warps to fill the GPU or when the partial buffers
// f32 [T, nH, n_splits, hd + 2] would exceed partial_budget_bytes.
int attention_splits(int T, int nH, int hd, int max_ctx, size_t partial_budget_bytes);
// Causal GQA attention of q bf16 [T, nH, hd] over each sequence's paged cache -> out bf16 [T, nH*hd].
// max_ctx: the longest context any token of the step attends to; partial: scratch of
// attention_splits' size when n_splits > 1.
void launch_attention(const bf16* q, const bf16* k_cache, const bf16* v_cache, bf16* out, float* partial,
                      int n_splits, int max_ctx, const int32_t* seq_of_token, const int32_t* cu_seqlens,
                      const int32_t* n_past, const int32_t* block_tables, int max_blocks, int T, int nH, int nKV,
                      int hd, int block_size, float scale, cudaStream_t s);

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
