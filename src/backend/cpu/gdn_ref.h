// Reference gated delta rule for one sequence, in both forms (fp32, plain loops). Shared by
// CpuOps and the tests that check chunked == recurrent.
#pragma once

#include "ops/ops.h"

namespace ds {

// One v-head's inputs for T tokens. q, k: rows of dk (already L2-normalised; q also scaled);
// v: rows of dv; g, beta: one value per token; all with the given row strides (in floats).
struct GdnHeadInputs {
  const float* q;
  const float* k;
  const float* v;
  const float* g;
  const float* beta;
  int64_t qk_stride, v_stride, gb_stride;
  int n_tokens, dk, dv;
};

// state f32 [dk, dv] in/out; out rows of dv with stride out_stride.
void gdn_head_recurrent(const GdnHeadInputs& in, float* state, float* out, int64_t out_stride);
void gdn_head_chunked(const GdnHeadInputs& in, float* state, float* out, int64_t out_stride, int chunk_size = 64);

// x[0..n) *= rsqrt(sum x^2 + 1e-6) * scale (HF l2norm, eps inside the sum).
void l2_normalize(float* x, int n, float scale);

}  // namespace ds
