// CpuOps: memory, elementwise ops, linear and the GDN plumbing (conv, gates, per-sequence
// dispatch of the gated delta rule). Attention lives in attention_ref.cpp.
#include "backend/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/gdn_ref.h"
#include "core/thread_pool.h"
#include "ops/act_int8.h"
#include "ops/int8_rows.h"
#include "ops/random_fill.h"

namespace ds {

namespace {
ThreadPool& pool() { return ThreadPool::global(); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch softplus (beta 1, threshold 20)
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

void check_f32(const Tensor& t, const char* what) {
  DS_ASSERT(t.dtype == DType::kF32 && t.data, "%s must be an allocated F32 tensor (is %s)", what, dtype_name(t.dtype));
}
}  // namespace

void CpuOps::round_act(Tensor t) const {
  if (!bf16_act_) return;
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
}

Tensor CpuOps::alloc_owned(std::vector<std::unique_ptr<float[]>>& owner, DType dtype,
                           std::initializer_list<int64_t> shape) {
  Tensor t(nullptr, dtype, shape);
  size_t n_floats = (t.nbytes() + 3) / 4;
  owner.emplace_back(new float[std::max<size_t>(n_floats, 1)]());
  t.data = owner.back().get();
  if (&owner == &weights_) weight_bytes_ += n_floats * sizeof(float);
  return t;
}

Tensor CpuOps::upload(const void* host, DType host_dtype, std::initializer_list<int64_t> shape, DType want) {
  DS_ASSERT(want == DType::kF32, "the CPU backend stores weights as F32");
  Tensor t = alloc_owned(weights_, DType::kF32, shape);
  convert_to_f32(host_dtype, host, t.f32(), static_cast<size_t>(t.numel()));
  return t;
}

Tensor CpuOps::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  DS_ASSERT(dtype == DType::kF32, "the CPU backend stores F32");
  return alloc_owned(weights_, dtype, shape);
}

void CpuOps::fill_random(Tensor t, float mean, float half_range, uint64_t seed) {
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = random_uniform(seed, static_cast<uint64_t>(i), mean, half_range);
}

Tensor CpuOps::scratch(DType dtype, std::initializer_list<int64_t> shape) { return alloc_owned(scratch_, dtype, shape); }

void CpuOps::download_f32(Tensor src, float* host) {
  convert_to_f32(src.dtype, src.data, host, static_cast<size_t>(src.numel()));
}

size_t CpuOps::cache_bytes_for(const CacheGeometry& g) const {
  return (2 * g.kv_elems() + g.conv_elems() + g.rec_elems()) * sizeof(float);
}

void CpuOps::alloc_caches(const CacheGeometry& g) {
  geo_ = g;
  k_cache_.assign(g.kv_elems(), 0.f);
  v_cache_.assign(g.kv_elems(), 0.f);
  conv_states_.assign(g.conv_elems(), 0.f);
  rec_states_.assign(g.rec_elems(), 0.f);
}

float* CpuOps::conv_state(int layer, int slot) {
  DS_ASSERT(layer >= 0 && layer < geo_.n_state_layers && slot >= 0 && slot < geo_.n_slots, "state %d/%d", layer, slot);
  return conv_states_.data() + (size_t(layer) * geo_.n_slots + slot) * geo_.conv_rows * geo_.conv_dim;
}

float* CpuOps::recurrent_state(int layer, int slot) {
  DS_ASSERT(layer >= 0 && layer < geo_.n_state_layers && slot >= 0 && slot < geo_.n_slots, "state %d/%d", layer, slot);
  return rec_states_.data() + (size_t(layer) * geo_.n_slots + slot) * geo_.n_v_heads * geo_.k_head_dim * geo_.v_head_dim;
}

void CpuOps::begin_step(const StepPlan& plan) {
  check_step_plan(plan);
  plan_ = plan;
}

void CpuOps::prepare_weight(LinearWeight& w, WeightRole role) {
  if (!is_vocab_role(role) || w.quantized() || !keeps_int8_vocab(w.dense.dim(1))) return;
  const int64_t rows = w.dense.dim(0), cols = w.dense.dim(1);
  std::vector<int8_t> q(static_cast<size_t>(rows * cols));
  std::vector<float> scales(static_cast<size_t>(rows * cols / kInt8Group));
  quantize_int8_rows(w.dense.f32(), rows, cols, q.data(), scales.data());
  dequantise_int8_rows(q.data(), scales.data(), rows * cols, w.dense.f32());
}

LinearWeight CpuOps::upload_int8_rows(const int8_t* q, const float* scales, int64_t N, int64_t K) {
  DS_ASSERT(keeps_int8_rows(K), "upload_int8_rows: K %lld is not whole groups of %d", (long long)K, kInt8Group);
  LinearWeight w;
  w.dense = alloc(DType::kF32, {N, K});
  dequantise_int8_rows(q, scales, N * K, w.dense.f32());
  return w;
}

void CpuOps::embedding(const LinearWeight& weight, Tensor out) {
  check_f32(out, "embedding out");
  DS_ASSERT(!weight.quantized(), "the CPU embedding table is dense");
  const Tensor& table = weight.dense;
  const int64_t H = table.dim(1), V = table.dim(0);
  for (int t = 0; t < plan_.n_tokens(); ++t) {
    const int id = plan_.token_ids[t];
    DS_ASSERT(id >= 0 && id < V, "token id %d outside the vocabulary of %lld", id, (long long)V);
    std::memcpy(out.f32() + t * H, table.f32() + int64_t(id) * H, H * sizeof(float));
  }
}

void CpuOps::rms_norm(Tensor x, Tensor w, float eps, Tensor out) {
  const int64_t D = w.numel(), R = x.numel() / D;
  const float* xp = x.f32();
  const float* wp = w.f32();
  float* op = out.f32();
  pool().parallel_for(R, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * D;
      float ss = 0.f;
      for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / D + eps);
      for (int64_t i = 0; i < D; ++i) op[r * D + i] = xr[i] * inv * wp[i];
    }
  });
  round_act(out);
}

void CpuOps::linear(Tensor x, Tensor w, Tensor out) {
  const int64_t T = x.dim(0), K = x.dim(1), N = w.dim(0);
  DS_ASSERT(w.dim(1) == K && out.dim(0) == T && out.numel() == T * N, "linear shapes x%s w%s out%s",
            x.shape_str().c_str(), w.shape_str().c_str(), out.shape_str().c_str());
  const float* xp = x.f32();
  const float* wp = w.f32();
  float* op = out.f32();
  pool().parallel_for(N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* wr = wp + n * K;
      for (int64_t t = 0; t < T; ++t) {
        const float* xr = xp + t * K;
        float acc[8] = {};
        int64_t k = 0;
        for (; k + 8 <= K; k += 8)
          for (int j = 0; j < 8; ++j) acc[j] += xr[k + j] * wr[k + j];
        float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; k < K; ++k) sum += xr[k] * wr[k];
        op[t * N + n] = sum;
      }
    }
  });
  round_act(out);
}

Tensor CpuOps::act_int8_input(Tensor x) {
  const int64_t T = x.dim(0), K = x.dim(1);
  DS_ASSERT(K % kActInt8Chunk == 0, "int8 inputs: x%s is not made of %d-column chunks", x.shape_str().c_str(),
            kActInt8Chunk);
  Tensor r = scratch(DType::kF32, {T, K});
  std::memcpy(r.f32(), x.f32(), size_t(T * K) * sizeof(float));
  round_act_int8(r.f32(), T, K);
  return r;
}

void CpuOps::add(Tensor x, Tensor y) {
  DS_ASSERT(x.numel() == y.numel(), "add shapes");
  float* xp = x.f32();
  const float* yp = y.f32();
  for (int64_t i = 0; i < x.numel(); ++i) xp[i] += yp[i];
  round_act(x);
}

void CpuOps::scale_rows(Tensor out, const RowScale& s, int64_t D) {
  const int64_t T = out.dim(0), N = out.numel() / std::max<int64_t>(T, 1), P = s.ss.dim(0);
  DS_ASSERT(s.ss.ndim == 2 && s.ss.dim(1) == T && s.ss.dtype == DType::kF32, "scale_rows: sums %s for %lld rows",
            s.ss.shape_str().c_str(), static_cast<long long>(T));
  const float* ss = s.ss.f32();
  float* o = out.f32();
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.f;
    for (int64_t p = 0; p < P; ++p) sum += ss[p * T + t];
    const float r = 1.f / std::sqrt(sum / static_cast<float>(D) + s.eps);
    for (int64_t n = 0; n < N; ++n) o[t * N + n] *= r;
  }
  round_act(out);
}

void CpuOps::silu_mul(Tensor gate, Tensor up, Tensor out) {
  const float* g = gate.f32();
  const float* u = up.f32();
  float* o = out.f32();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = silu(g[i]) * u[i];
  round_act(out);
}

void CpuOps::sigmoid_mul(Tensor x, Tensor gate) {
  float* xp = x.f32();
  const float* g = gate.f32();
  for (int64_t i = 0; i < x.numel(); ++i) xp[i] *= sigmoid(g[i]);
  round_act(x);
}

void CpuOps::gather_rows(Tensor x, Tensor out) {
  const int64_t H = x.dim(1);
  for (int i = 0; i < plan_.n_out(); ++i)
    std::memcpy(out.f32() + i * H, x.f32() + int64_t(plan_.logit_rows[i]) * H, H * sizeof(float));
}

void CpuOps::concat_cols(Tensor a, Tensor b, Tensor out) {
  const int64_t T = a.dim(0), D1 = a.dim(1), D2 = b.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(out.f32() + t * (D1 + D2), a.f32() + t * D1, D1 * sizeof(float));
    std::memcpy(out.f32() + t * (D1 + D2) + D1, b.f32() + t * D2, D2 * sizeof(float));
  }
}

void CpuOps::conv1d_silu(Tensor mixed, Tensor w, int layer, Tensor out) {
  const int64_t C = mixed.dim(1), K = w.dim(1), R = K - 1;
  DS_ASSERT(C == geo_.conv_dim && R == geo_.conv_rows, "conv geometry");
  const float* x = mixed.f32();
  const float* wp = w.f32();
  float* o = out.f32();
  for (int s = 0; s < plan_.n_seqs(); ++s) {
    const int t0 = plan_.cu_seqlens[s], T = plan_.cu_seqlens[s + 1] - t0;
    if (T == 0) continue;
    float* state = conv_state(layer, plan_.state_slots[s]);  // [R, C], oldest row first
    if (plan_.n_past[s] == 0) std::fill(state, state + R * C, 0.f);
    // row j of the window [state; x] for j in [0, R + T)
    auto row = [&](int64_t j) { return j < R ? state + j * C : x + (t0 + j - R) * C; };
    pool().parallel_for(C, 256, [&](int64_t c0, int64_t c1) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = c0; c < c1; ++c) {
          float acc = 0.f;
          for (int64_t j = 0; j < K; ++j) acc += wp[c * K + j] * row(t + j)[c];
          o[(t0 + t) * C + c] = silu(acc);
        }
    });
    std::vector<float> tail(R * C);  // the last R rows of the window become the state
    for (int64_t j = 0; j < R; ++j) std::memcpy(tail.data() + j * C, row(T + j), C * sizeof(float));
    std::memcpy(state, tail.data(), tail.size() * sizeof(float));
  }
  round_act(out);
}

void CpuOps::gdn_gates(Tensor a, Tensor b, Tensor a_log, Tensor dt_bias, Tensor g, Tensor beta) {
  const int64_t Hv = a_log.numel(), T = a.numel() / Hv;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t i = t * Hv + h;
      g.f32()[i] = -std::exp(a_log.f32()[h]) * softplus(a.f32()[i] + dt_bias.f32()[h]);
      beta.f32()[i] = sigmoid(b.f32()[i]);
    }
}

void CpuOps::gated_delta_rule(Tensor qkv, Tensor g, Tensor beta, const GdnShape& sh, int layer, Tensor out) {
  const int64_t T = qkv.dim(0), C = qkv.dim(1);
  const int Hk = sh.n_k_heads, Hv = sh.n_v_heads, dk = sh.k_head_dim, dv = sh.v_head_dim, ratio = Hv / Hk;
  DS_ASSERT(C == 2 * Hk * dk + Hv * dv, "qkv width");
  // q and k L2-normalised once per token and k-head (q also scaled by dk^-0.5).
  std::vector<float> qn(T * Hk * dk), kn(T * Hk * dk);
  const float* src = qkv.f32();
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(&qn[t * Hk * dk], src + t * C, Hk * dk * sizeof(float));
    std::memcpy(&kn[t * Hk * dk], src + t * C + Hk * dk, Hk * dk * sizeof(float));
    for (int h = 0; h < Hk; ++h) {
      l2_normalize(&qn[(t * Hk + h) * dk], dk, 1.0f / std::sqrt(static_cast<float>(dk)));
      l2_normalize(&kn[(t * Hk + h) * dk], dk, 1.0f);
    }
  }
  for (int s = 0; s < plan_.n_seqs(); ++s) {
    const int t0 = plan_.cu_seqlens[s], n = plan_.cu_seqlens[s + 1] - t0;
    if (n == 0) continue;
    const int slot = plan_.state_slots[s];
    float* S = recurrent_state(layer, slot);  // [Hv, dk, dv]
    if (plan_.n_past[s] == 0) std::fill(S, S + int64_t(Hv) * dk * dv, 0.f);
    const bool chunked = gdn_mode_ == GdnMode::kChunked || (gdn_mode_ == GdnMode::kAuto && n > 1);
    pool().parallel_for(Hv, 1, [&](int64_t h0, int64_t h1) {
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t kh = h / ratio;
        GdnHeadInputs in{&qn[(t0 * Hk + kh) * dk], &kn[(t0 * Hk + kh) * dk],
                         src + t0 * C + 2 * Hk * dk + h * dv, g.f32() + t0 * Hv + h, beta.f32() + t0 * Hv + h,
                         int64_t(Hk) * dk, C, Hv, n, dk, dv};
        float* o = out.f32() + (t0 * Hv + h) * dv;
        float* Sh = S + h * dk * dv;
        if (chunked) gdn_head_chunked(in, Sh, o, int64_t(Hv) * dv);
        else gdn_head_recurrent(in, Sh, o, int64_t(Hv) * dv);
      }
    });
  }
  round_act(out);
}

void CpuOps::gated_rms_norm(Tensor x, Tensor z, Tensor w, float eps, bool sigmoid_gate, Tensor out) {
  const int64_t D = w.numel(), R = x.numel() / D;
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.f32() + r * D;
    const float* zr = z.f32() + r * D;
    float ss = 0.f;
    for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / D + eps);
    for (int64_t i = 0; i < D; ++i) {
      const float gate = sigmoid_gate ? sigmoid(zr[i]) : silu(zr[i]);
      out.f32()[r * D + i] = w.f32()[i] * (xr[i] * inv) * gate;
    }
  }
  round_act(out);
}

void CpuOps::split_query_gate(Tensor p, int n_heads, int head_dim, Tensor q, Tensor gate) {
  const int64_t T = p.dim(0);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < n_heads; ++h) {
      const float* src = p.f32() + (t * n_heads + h) * 2 * head_dim;
      std::memcpy(q.f32() + (t * n_heads + h) * head_dim, src, head_dim * sizeof(float));
      std::memcpy(gate.f32() + (t * n_heads + h) * head_dim, src + head_dim, head_dim * sizeof(float));
    }
}

void CpuOps::rope(Tensor x, int rotary_dim, double theta) {
  const int64_t T = x.dim(0), n = x.dim(1), hd = x.dim(2);
  const int half = rotary_dim / 2;
  // inv_freq and angles in fp32 as torch computes them: base ** (arange(0, d, 2) / d).
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
  for (int64_t t = 0; t < T; ++t) {
    const float pos = static_cast<float>(plan_.positions[t]);
    for (int i = 0; i < half; ++i) {
      const float ang = pos * inv_freq[i];
      const float c = std::cos(ang), s = std::sin(ang);
      for (int64_t h = 0; h < n; ++h) {
        float* v = x.f32() + (t * n + h) * hd;
        const float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
      }
    }
  }
  round_act(x);
}

}  // namespace ds
