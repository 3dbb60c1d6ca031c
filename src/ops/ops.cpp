// Default implementations of Ops operations that are written in terms of other ops (a backend
// may override them with a kernel of its own).
#include "ops/ops.h"

namespace ds {

namespace {

// N of a weight [N, K] in whichever form it is stored.
int64_t rows_of(const LinearWeight& w) {
  return !w.quantized()                   ? w.dense.dim(0)
         : w.format == WeightFormat::kW4A16 ? w.packed.dim(0)
                                            : w.rows;
}

}  // namespace

void Ops::check_parts(Tensor x, const LinearWeight& w, std::span<const Tensor> outs) {
  const int64_t T = x.dim(0);
  const int64_t N = rows_of(w);
  int64_t sum = 0;
  for (const Tensor& out : outs) {
    DS_ASSERT(out.ndim == 2 && out.dim(0) == T, "linear_parts: out %s is not [T = %lld, N_i]", out.shape_str().c_str(),
              (long long)T);
    sum += out.dim(1);
  }
  DS_ASSERT(!outs.empty() && sum == N, "linear_parts: %zu outs of %lld columns in all, the weight has %lld rows",
            outs.size(), (long long)sum, (long long)N);
}

void Ops::linear_parts(Tensor x, const LinearWeight& w, std::span<const Tensor> outs, bool /*after_same_input*/,
                       const RowScale& scale) {
  check_parts(x, w, outs);
  if (!scale.empty()) {
    linear_parts(x, w, outs);
    for (const Tensor& out : outs) scale_rows(out, scale, x.dim(1));
    return;
  }
  if (outs.size() == 1) {  // the whole weight, in whatever form this backend stores it
    linear_weight(x, w, outs[0]);
    return;
  }
  DS_ASSERT(!w.quantized() || w.format == WeightFormat::kW4A16,
            "%s: linear_parts cuts only dense or raw W4A16 weights into rows; this format needs an override", name());
  const Tensor xd = !w.quantized() && w.act_int8 ? act_int8_input(x) : x;  // the dense parts' input
  int64_t r = 0;  // first weight row of the part
  for (const Tensor& out : outs) {
    const int64_t n = out.dim(1);
    if (w.quantized()) {
      LinearWeight part = w;
      part.packed = w.packed.rows(r, n);  // i32 [n, K/8]
      part.scales = w.scales.rows(r, n);  // f32 [n, K/group]
      linear_quantized(x, part, out);
    } else {
      linear(xd, w.dense.rows(r, n), out);  // act [n, K]
    }
    r += n;
  }
}

Tensor Ops::gated_input(Tensor a, Tensor b, GateAct act) {
  if (act == GateAct::kMulSigmoid) {
    sigmoid_mul(a, b);  // in place
    return a;
  }
  Tensor x = scratch(a.dtype, {a.dim(0), a.dim(1)});
  silu_mul(a, b, x);
  return x;
}

void Ops::gated_linear(Tensor a, Tensor b, GateAct act, const LinearWeight& w, Tensor out) {
  linear_weight(gated_input(a, b, act), w, out);
}

void Ops::linear_swiglu(Tensor x, const LinearWeight& w, Tensor gate, Tensor up, Tensor out, const RowScale& scale,
                        Tensor* half) {
  if (half) *half = {};
  const Tensor parts[2] = {gate, up};
  linear_parts(x, w, parts, false, scale);
  silu_mul(gate, up, out);
}

void Ops::linear_add_rms_norm(Tensor a, const Tensor* b, GateAct act, const LinearWeight& w, Tensor x,
                              Tensor norm_w, float eps, Tensor /*ss*/, NormedAct& out, Int8Twin /*twin*/,
                              Tensor /*half*/, Tensor /*a_half*/) {
  const int64_t T = x.dim(0), D = x.dim(1);
  DS_ASSERT(rows_of(w) == D && out.h.numel() == T * D, "linear_add_rms_norm: %lld rows for x%s, out%s",
            static_cast<long long>(rows_of(w)), x.shape_str().c_str(), out.h.shape_str().c_str());
  Tensor y = scratch(act_dtype(), {T, D});
  if (b) gated_linear(a, *b, act, w, y);
  else linear_weight(a, w, y);
  add_rms_norm(x, y, norm_w, eps, out.h);
  out.scale = {};
}

void Ops::gated_attention(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor gate, Tensor out,
                          Tensor* half) {
  if (half) *half = {};
  attention(q, k, v, kv_layer, scale, out);
  sigmoid_mul(out, gate);
}

void Ops::gdn_gates_delta_rule(Tensor qkv, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, const GdnShape& shape,
                               int state_layer, Tensor out) {
  const int64_t T = a.dim(0), Hv = a.dim(1);
  Tensor g = scratch(DType::kF32, {T, Hv});     // log-decay
  Tensor beta = scratch(DType::kF32, {T, Hv});  // write strength
  gdn_gates(a, b, a_log, dt_bias, g, beta);
  gated_delta_rule(qkv, g, beta, shape, state_layer, out);
}

void Ops::gdn_gates_delta_rule_norm(Tensor qkv, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias,
                                    const GdnShape& shape, int state_layer, Tensor z, Tensor norm_w, float eps,
                                    bool sigmoid_gate, Tensor out, Tensor* half) {
  if (half) *half = {};
  const int64_t T = a.dim(0), Hv = shape.n_v_heads, dv = shape.v_head_dim;
  Tensor core = scratch(act_dtype(), {T, Hv, dv});
  gdn_gates_delta_rule(qkv, a, b, a_log, dt_bias, shape, state_layer, core);
  gated_rms_norm(core.view({T * Hv, dv}), z.view({T * Hv, dv}), norm_w, eps, sigmoid_gate, out.view({T * Hv, dv}));
}

void Ops::conv_gdn_norm(Tensor mixed, Tensor conv_w, Tensor a, Tensor b, Tensor a_log, Tensor dt_bias,
                        const GdnShape& shape, int state_layer, Tensor z, Tensor norm_w, float eps, bool sigmoid_gate,
                        Tensor out, Tensor* half) {
  Tensor qkv = scratch(act_dtype(), {mixed.dim(0), mixed.dim(1)});  // silu(causal_conv1d(mixed)) = [q | k | v]
  conv1d_silu(mixed, conv_w, state_layer, qkv);
  gdn_gates_delta_rule_norm(qkv, a, b, a_log, dt_bias, shape, state_layer, z, norm_w, eps, sigmoid_gate, out, half);
}

void Ops::attention_prep(Tensor p, Tensor k, Tensor q_norm, Tensor k_norm, float eps, int rotary_dim, double theta,
                         Tensor q, Tensor gate) {
  const int64_t T = q.dim(0), nH = q.dim(1), hd = q.dim(2), nKV = k.dim(1);
  split_query_gate(p, static_cast<int>(nH), static_cast<int>(hd), q, gate);
  rms_norm(q.view({T * nH, hd}), q_norm, eps, q.view({T * nH, hd}));
  rms_norm(k.view({T * nKV, hd}), k_norm, eps, k.view({T * nKV, hd}));
  rope(q, rotary_dim, theta);
  rope(k, rotary_dim, theta);
}

}  // namespace ds
