// CpuOps::attention: paged KV append + causal GQA softmax attention, one query row at a time.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/thread_pool.h"

namespace ds {

void CpuOps::attention(Tensor q, Tensor k, Tensor v, int kv_layer, float scale, Tensor out) {
  const int64_t T = q.dim(0), nH = q.dim(1), hd = q.dim(2), nKV = k.dim(1);
  const int bs = geo_.block_size;
  DS_ASSERT(nKV == geo_.n_kv_heads && hd == geo_.head_dim, "attention geometry");
  DS_ASSERT(kv_layer >= 0 && kv_layer < geo_.n_kv_layers, "kv layer %d", kv_layer);
  const int64_t token_stride = nKV * hd;
  const int64_t layer_stride = int64_t(geo_.n_blocks) * bs * token_stride;
  float* kc = k_cache_.data() + kv_layer * layer_stride;
  float* vc = v_cache_.data() + kv_layer * layer_stride;
  const int32_t* tables = plan_.block_tables.data();
  auto slot = [&](int s, int64_t i) -> int64_t {  // cache row of token i of sequence s
    const int64_t b = i / bs;
    DS_ASSERT(b < plan_.max_blocks, "sequence %d needs block %lld of %d", s, (long long)b, plan_.max_blocks);
    const int32_t block = tables[s * plan_.max_blocks + b];
    DS_ASSERT(block >= 0 && block < geo_.n_blocks, "block id %d", block);
    return (int64_t(block) * bs + i % bs) * token_stride;
  };

  // Append this step's keys and values first, so every query sees its own token.
  for (int s = 0; s < plan_.n_seqs(); ++s)
    for (int t = plan_.cu_seqlens[s]; t < plan_.cu_seqlens[s + 1]; ++t) {
      const int64_t row = slot(s, plan_.n_past[s] + (t - plan_.cu_seqlens[s]));
      std::memcpy(kc + row, k.f32() + t * token_stride, token_stride * sizeof(float));
      std::memcpy(vc + row, v.f32() + t * token_stride, token_stride * sizeof(float));
    }

  std::vector<int> seq_of(T);
  for (int s = 0; s < plan_.n_seqs(); ++s)
    for (int t = plan_.cu_seqlens[s]; t < plan_.cu_seqlens[s + 1]; ++t) seq_of[t] = s;
  const int64_t group = nH / nKV;
  ThreadPool::global().parallel_for(T * nH, 4, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t t = w / nH, h = w % nH, kvh = h / group;
      const int s = seq_of[t];
      const int64_t n_ctx = plan_.n_past[s] + (t - plan_.cu_seqlens[s]) + 1;  // causal: keys 0..own
      const float* qr = q.f32() + (t * nH + h) * hd;
      scores.resize(n_ctx);
      float mx = -INFINITY;
      for (int64_t j = 0; j < n_ctx; ++j) {
        const float* kr = kc + slot(s, j) + kvh * hd;
        float d = 0.f;
        for (int64_t i = 0; i < hd; ++i) d += qr[i] * kr[i];
        scores[j] = d * scale;
        mx = std::max(mx, scores[j]);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < n_ctx; ++j) sum += scores[j] = std::exp(scores[j] - mx);
      float* o = out.f32() + (t * nH + h) * hd;
      std::fill(o, o + hd, 0.f);
      for (int64_t j = 0; j < n_ctx; ++j) {
        const float p = scores[j] / sum;
        const float* vr = vc + slot(s, j) + kvh * hd;
        for (int64_t i = 0; i < hd; ++i) o[i] += p * vr[i];
      }
    }
  });
  round_act(out);
}

}  // namespace ds
