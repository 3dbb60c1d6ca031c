// StepPlan: one varlen step as the scheduler hands it to a backend. Prefill chunks, single
// decode tokens and verify blocks ride in the same step; each sequence has its own token
// range, KV blocks and GDN state slot. Plain data, no device memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ds {

struct StepPlan {
  std::vector<int32_t> token_ids;     // i32 [n_tokens]
  std::vector<int32_t> positions;     // i32 [n_tokens] RoPE positions
  std::vector<int32_t> cu_seqlens;    // i32 [n_seqs + 1] token rows of sequence s: [cu[s], cu[s+1])
  std::vector<int32_t> n_past;        // i32 [n_seqs] tokens already in the sequence's caches; 0 = fresh state
  std::vector<int32_t> state_slots;   // i32 [n_seqs] GDN conv/recurrent state slot
  std::vector<int32_t> block_tables;  // i32 [n_seqs, max_blocks] KV cache block ids, in order
  int32_t max_blocks = 0;
  std::vector<int32_t> logit_rows;    // i32 [n_out] token rows whose logits are wanted

  int n_tokens() const { return static_cast<int>(token_ids.size()); }
  int n_seqs() const { return cu_seqlens.empty() ? 0 : static_cast<int>(cu_seqlens.size()) - 1; }
  int n_out() const { return static_cast<int>(logit_rows.size()); }
};

// Aborts on a malformed plan (sizes, ordering, row indices): a scheduler bug, not user input.
void check_step_plan(const StepPlan& plan);

// Sizes of the cache pools a backend allocates once at start.
struct CacheGeometry {
  int n_kv_layers = 0;     // full-attention layers (+1 for the MTP layer)
  int n_blocks = 0;        // KV blocks per layer
  int block_size = 16;     // tokens per KV block
  int n_kv_heads = 0;
  int head_dim = 0;
  int n_state_layers = 0;  // GDN layers
  int n_slots = 0;         // sequences whose GDN state can be live at once
  int conv_rows = 0;       // linear_conv_kernel_dim - 1
  int conv_dim = 0;        // 2*Hk*dk + Hv*dv
  int n_v_heads = 0, k_head_dim = 0, v_head_dim = 0;

  // Elements of each pool (backends multiply by their element sizes).
  size_t kv_elems() const { return size_t(n_kv_layers) * n_blocks * block_size * n_kv_heads * head_dim; }  // K or V
  size_t conv_elems() const { return size_t(n_state_layers) * n_slots * conv_rows * conv_dim; }
  size_t rec_elems() const { return size_t(n_state_layers) * n_slots * n_v_heads * k_head_dim * v_head_dim; }
};

}  // namespace ds
