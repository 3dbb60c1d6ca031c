// GPU sampler: one thread block per logit row, no full-vocabulary sort. Top-k, top-p and the
// top logprobs are found by radix selection over the float bits (histograms of 11-bit digits,
// ties resolved by index as the CPU sampler does); a top-k of at most kCandidates is then
// sorted in shared memory and truncated exactly like engine/sampler.cpp, larger supports are
// drawn from in index order with fixed-point masses (sums independent of thread order, so a
// seed always gives the same token).
#include <climits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"

namespace ds::cuda {

namespace {

using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kCandidates = 2048;  // largest top-k sorted in shared memory (2 per thread)
constexpr int kDigitBits = 11;
constexpr int kBins = 1 << kDigitBits;  // 2 per thread
constexpr float kMassScale = 1099511627776.0f;  // 2^40: a token's mass exp((w - max) / T) in fixed point
constexpr uint32_t kAllIndices = 0xffffffffu;

// Monotone map float -> u32 (larger float, larger key). NaN sorts as -inf; -0 as +0, since the
// CPU sampler compares them equal. Every real key is > 0 (the key of -inf is 0x007fffff).
__device__ __forceinline__ uint32_t order_key(float f) {
  if (f != f) f = -INFINITY;
  if (f == 0.0f) f = 0.0f;
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Token order of the CPU sampler (value desc, then index asc) as one descending u64.
__device__ __forceinline__ u64 rank_key(uint32_t key, int i) { return (u64(key) << 32) | u64(~uint32_t(i)); }
__device__ __forceinline__ int rank_index(u64 r) { return int(~uint32_t(r & 0xffffffffu)); }

// The first elements of the token order: those with key > key, and those with key == key
// and index <= last_index. Cut{0, kAllIndices} holds every token.
struct Cut {
  uint32_t key = 0;
  uint32_t last_index = kAllIndices;
  __device__ bool holds(uint32_t k, int i) const { return k > key || (k == key && uint32_t(i) <= last_index); }
};

__device__ __forceinline__ u64 mass_fixed(float w, float w_max, float inv_t) {
  return __float2ull_rn(expf((w - w_max) * inv_t) * kMassScale);  // w = -inf: 0; w = w_max: 2^40
}

__device__ __forceinline__ u64 splitmix64(u64 z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// [0, 1) from 53 bits of a counter-based hash of (seed, draw).
__device__ __forceinline__ double uniform01(u64 seed, u64 draw) {
  return double(splitmix64(seed ^ splitmix64(draw)) >> 11) * (1.0 / 9007199254740992.0);
}

// Block-wide reductions in a fixed order (deterministic); every thread gets the result.
template <class T, class Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T part[kWarps];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = part[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, part[w]);
  return r;
}
struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct Min {
  template <class T>
  __device__ T operator()(T a, T b) const { return b < a ? b : a; }
};
struct Max {
  template <class T>
  __device__ T operator()(T a, T b) const { return a < b ? b : a; }
};

// Inclusive prefix sum over the threads of the block, in thread order.
template <class T>
__device__ T block_inclusive_sum(T v) {
  __shared__ T warp_total[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const T up = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += up;
  }
  __syncthreads();
  if (lane == 31) warp_total[warp] = v;
  __syncthreads();
  T before = 0;
  for (int w = 0; w < warp; ++w) before += warp_total[w];
  return v + before;
}

// One logit row: the model's bf16 logits and, when the request has edits, an f32 copy with
// them applied (`edited`).
struct Row {
  const bf16* raw;      // bf16 [V]
  const float* edited;  // f32 [V] or null
  int V;
  __device__ float raw_at(int i) const { return to_f32(raw[i]); }
  __device__ float w_at(int i) const { return edited ? edited[i] : to_f32(raw[i]); }
};

struct Shared {
  u64 hist_w[kBins];       // weight per digit
  uint32_t hist_n[kBins];  // count per digit
  u64 cand[kCandidates];   // rank keys of the candidate set
  int n_cand;
  uint32_t pick_bin;
  u64 pick_before, pick_w;
  uint32_t pick_n;
  double total;
};

// Adds (bin, wt) of every lane to the histograms; bin == kBins: nothing. Lanes with the same
// bin are summed first (one shared atomic per distinct bin), all in integers.
__device__ __forceinline__ void hist_add(Shared& sm, int bin, u64 wt) {
  const unsigned peers = __match_any_sync(0xffffffffu, bin);
  // wt <= 2^40: 32 lanes' high (<= 2^20) and low (< 2^20) parts each fit in 32 bits
  const unsigned hi = __reduce_add_sync(peers, unsigned(wt >> 20));
  const unsigned lo = __reduce_add_sync(peers, unsigned(wt & 0xfffffu));
  if (bin < kBins && int(threadIdx.x & 31) == __ffs(peers) - 1) {
    atomicAdd(&sm.hist_w[bin], (u64(hi) << 20) + lo);
    atomicAdd(&sm.hist_n[bin], unsigned(__popc(peers)));
  }
}

struct RadixResult {
  uint32_t key;  // the selected key
  u64 above;     // weight of the elements with a larger key
  u64 w_at;      // weight and count of the elements with exactly this key
  uint32_t n_at;
};

// Descending radix select over the n_bits-bit keys of the elements that take part
// (elem(i, &key, &weight) returns true): the key at which the running weight, largest keys
// first, first reaches `target` (>= 1). If the total never reaches it: the smallest key.
template <class Elem>
__device__ RadixResult radix_select(Shared& sm, int V, int n_bits, u64 target, Elem elem) {
  uint32_t prefix = 0;
  u64 above = 0, w_at = 0;
  uint32_t n_at = 0;
  for (int done = 0; done < n_bits;) {
    const int bits = min(kDigitBits, n_bits - done);
    const int shift = n_bits - done - bits;
    const int hi_shift = shift + bits;  // bits above this digit, fixed by earlier passes
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sm.hist_w[b] = 0;
      sm.hist_n[b] = 0;
    }
    __syncthreads();
    for (int base = 0; base < V; base += kThreads) {
      const int i = base + threadIdx.x;
      uint32_t key = 0;
      u64 wt = 0;
      int bin = kBins;
      if (i < V && elem(i, key, wt) && (u64(key) >> hi_shift) == (u64(prefix) >> hi_shift))
        bin = int((key >> shift) & ((1u << bits) - 1));
      hist_add(sm, bin, wt);
    }
    __syncthreads();
    // Bins in descending order: thread t holds positions 2t and 2t+1.
    const int b0 = kBins - 1 - 2 * int(threadIdx.x), b1 = b0 - 1;
    const u64 w0 = sm.hist_w[b0], w1 = sm.hist_w[b1];
    const uint32_t n0 = sm.hist_n[b0], n1 = sm.hist_n[b1];
    const u64 incl1 = block_inclusive_sum<u64>(w0 + w1);
    const u64 incl0 = incl1 - w1;
    int pos = INT_MAX;
    if (n0 && above + incl0 >= target) pos = 2 * threadIdx.x;
    else if (n1 && above + incl1 >= target) pos = 2 * threadIdx.x + 1;
    pos = block_reduce(pos, Min());
    if (pos == INT_MAX) pos = block_reduce(n1 ? 2 * int(threadIdx.x) + 1 : n0 ? 2 * int(threadIdx.x) : -1, Max());
    if (pos < 0 && threadIdx.x == 0) {  // nothing takes part: callers never ask for that
      sm.pick_bin = 0;
      sm.pick_before = sm.pick_w = 0;
      sm.pick_n = 0;
    }
    if (pos >= 0 && pos >> 1 == int(threadIdx.x)) {
      const bool first = (pos & 1) == 0;
      sm.pick_bin = uint32_t(first ? b0 : b1);
      sm.pick_before = first ? incl0 - w0 : incl0;
      sm.pick_w = first ? w0 : w1;
      sm.pick_n = first ? n0 : n1;
    }
    __syncthreads();
    prefix |= sm.pick_bin << shift;
    above += sm.pick_before;
    w_at = sm.pick_w;
    n_at = sm.pick_n;
    done += bits;
    __syncthreads();  // the histograms are cleared by the next pass
  }
  return {prefix, above, w_at, n_at};
}

// The shortest prefix, in token order, of the tokens t with in(value, key, i) whose weight
// (1 per token when mass is false, else mass_fixed) reaches target: returned as a Cut.
// value(i) gives the float a token is ordered by.
template <class Value, class In>
__device__ Cut select_prefix(Shared& sm, int V, u64 target, bool mass, float w_max, float inv_t, Value value, In in) {
  const RadixResult r = radix_select(sm, V, 32, target, [&](int i, uint32_t& key, u64& wt) {
    const float v = value(i);
    key = order_key(v);
    if (!in(key, i)) return false;
    wt = mass ? mass_fixed(v, w_max, inv_t) : 1ull;
    return true;
  });
  Cut cut{r.key, kAllIndices};
  // Ties at r.key (each of the same weight) enter in index order: how many are needed?
  const u64 need = target > r.above ? target - r.above : 1ull;
  const u64 per_tie = r.n_at ? r.w_at / r.n_at : 1ull;
  u64 m = mass ? (per_tie ? (need + per_tie - 1) / per_tie : u64(r.n_at)) : need;
  m = m < 1 ? 1 : (m > r.n_at ? r.n_at : m);
  if (m < r.n_at) {
    const int n_bits = V > 1 ? 32 - __clz(V - 1) : 1;
    // ascending index = descending (V - 1 - index)
    const RadixResult t = radix_select(sm, V, n_bits, m, [&](int i, uint32_t& key, u64& wt) {
      const uint32_t k = order_key(value(i));
      if (k != r.key || !in(k, i)) return false;
      key = uint32_t(V - 1 - i);
      wt = 1;
      return true;
    });
    cut.last_index = uint32_t(V - 1) - t.key;
  }
  return cut;
}

// Gathers the n (<= kCandidates) tokens inside `cut` and sorts them into token order:
// sm.cand[0, n) holds their rank keys.
template <class Value>
__device__ void gather_sorted(Shared& sm, int V, Cut cut, int n, Value value) {
  if (threadIdx.x == 0) sm.n_cand = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const uint32_t k = order_key(value(i));
    if (cut.holds(k, i)) {
      const int slot = atomicAdd(&sm.n_cand, 1);
      if (slot < kCandidates) sm.cand[slot] = rank_key(k, i);
    }
  }
  __syncthreads();
  int size = 2;
  while (size < n) size <<= 1;
  for (int j = threadIdx.x; j < size; j += kThreads)
    if (j >= min(sm.n_cand, kCandidates)) sm.cand[j] = 0;  // below every real rank key
  __syncthreads();
  // Bitonic sort of sm.cand[0, size), descending.
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += kThreads) {
        const int p = i ^ j;
        if (p > i) {
          const u64 a = sm.cand[i], b = sm.cand[p];
          if ((i & k) == 0 ? a < b : a > b) {
            sm.cand[i] = b;
            sm.cand[p] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// Top-k of at most kCandidates (cut holds exactly n tokens): sorted probabilities in double,
// top-p and min-p on the sorted prefix, one draw - the CPU sampler's steps.
__device__ int sample_candidates(Shared& sm, const Row& row, Cut cut, int n, const SampleRowParams& p, float w_max,
                                 float inv_t) {
  gather_sorted(sm, row.V, cut, n, [&](int i) { return row.w_at(i); });
  const double mx = double(w_max) * inv_t;
  const int j0 = 2 * threadIdx.x, j1 = j0 + 1;
  // exp(w * inv_t - mx) rounded step by step as on the host (no fused multiply-add)
  auto weight = [&](int j) {
    return j < n ? exp(__dsub_rn(__dmul_rn(double(key_value(uint32_t(sm.cand[j] >> 32))), inv_t), mx)) : 0.0;
  };
  const double e0 = weight(j0), e1 = weight(j1);
  const double z = block_reduce(e0 + e1, Sum());
  const double p0 = e0 / z, p1 = e1 / z;
  const double c1 = block_inclusive_sum(p0 + p1), c0 = c1 - p1;
  int keep = n;
  if (p.top_p < 1.0f) {
    int k = INT_MAX;
    if (j0 < n && c0 >= p.top_p) k = j0 + 1;
    else if (j1 < n && c1 >= p.top_p) k = j1 + 1;
    keep = min(keep, block_reduce(k, Min()));
  }
  if (p.min_p > 0.0f) {
    const double floor_p = p.min_p * (1.0 / z);  // p of the first candidate: exp(0) / z
    int k = INT_MAX;
    if (j0 >= 1 && j0 < keep && p0 < floor_p) k = j0;
    else if (j1 < keep && p1 < floor_p) k = j1;
    keep = min(keep, block_reduce(k, Min()));
  }
  if (j0 == keep - 1) sm.total = c0;
  if (j1 == keep - 1) sm.total = c1;
  __syncthreads();
  const double target = uniform01(p.seed, p.draw) * sm.total;
  int pick = INT_MAX;
  if (j0 < keep && target < c0) pick = j0;
  else if (j1 < keep && target < c1) pick = j1;
  pick = block_reduce(pick, Min());
  if (pick == INT_MAX) pick = keep - 1;
  return rank_index(sm.cand[pick]);
}

// Supports larger than kCandidates: top-p by a mass select inside the top-k cut, min-p by
// value, then a draw in index order (warp chunks, then one warp walks its chunk).
__device__ int sample_large(Shared& sm, const Row& row, Cut top_k, const SampleRowParams& p, float w_max, float inv_t,
                            int fallback) {
  const int V = row.V;
  auto w_of = [&](int i) { return row.w_at(i); };
  Cut top_p;
  if (p.top_p < 1.0f) {
    u64 z = 0;
    for (int i = threadIdx.x; i < V; i += kThreads) {
      const float v = row.w_at(i);
      if (top_k.holds(order_key(v), i)) z += mass_fixed(v, w_max, inv_t);
    }
    z = block_reduce(z, Sum());
    u64 target = u64(ceil(double(p.top_p) * double(z)));
    target = target < 1 ? 1 : (target > z ? z : target);
    top_p = select_prefix(sm, V, target, true, w_max, inv_t, w_of,
                          [&](uint32_t k, int i) { return top_k.holds(k, i); });
  }
  auto support_mass = [&](int i) -> u64 {
    const float v = row.w_at(i);
    const uint32_t k = order_key(v);
    if (!top_k.holds(k, i) || !top_p.holds(k, i)) return 0;
    if (p.min_p > 0.0f && expf((v - w_max) * inv_t) < p.min_p) return 0;
    return mass_fixed(v, w_max, inv_t);
  };
  // Warp w owns indices [w * chunk, (w + 1) * chunk); its lanes stride by 32.
  const int chunk = ((V + kWarps - 1) / kWarps + 31) / 32 * 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int begin = warp * chunk, end = min(V, begin + chunk);
  u64 mine = 0;
  for (int i = begin + lane; i < end; i += 32) mine += support_mass(i);
  for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
  __shared__ u64 warp_mass[kWarps];
  __shared__ int picked;
  if (lane == 0) warp_mass[warp] = mine;
  if (threadIdx.x == 0) picked = fallback;
  __syncthreads();
  u64 total = 0;
  for (int w = 0; w < kWarps; ++w) total += warp_mass[w];
  u64 target = u64(uniform01(p.seed, p.draw) * double(total));
  if (target >= total) target = total - 1;
  int owner = 0;
  u64 before = 0;
  while (owner < kWarps - 1 && before + warp_mass[owner] <= target) before += warp_mass[owner++];
  if (warp == owner && total > 0) {
    for (int base = begin; base < end; base += 32) {
      const int i = base + lane;
      u64 v = i < end ? support_mass(i) : 0;
      for (int o = 1; o < 32; o <<= 1) {
        const u64 up = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += up;
      }
      const unsigned over = __ballot_sync(0xffffffffu, before + v > target);
      if (over) {
        if (lane == 0) picked = base + __ffs(over) - 1;
        break;
      }
      before += __shfl_sync(0xffffffffu, v, 31);
    }
  }
  __syncthreads();
  return picked;
}

__global__ void __launch_bounds__(kThreads, 1)
    sample_kernel(const bf16* logits, int V, const SampleRowParams* params, const LogitEdit* edits, float* work,
                  SampledToken* out) {
  __shared__ Shared sm;
  const SampleRowParams p = params[blockIdx.x];
  Row row{logits + int64_t(p.row) * V, nullptr, V};
  if (p.work_offset >= 0) {
    float* w = work + p.work_offset;
    for (int i = threadIdx.x; i < V; i += kThreads) w[i] = row.raw_at(i);
    __syncthreads();
    for (int e = p.edit_begin + threadIdx.x; e < p.edit_end; e += kThreads) {
      const LogitEdit d = edits[e];
      if (d.token < 0 || d.token >= V) continue;
      // rounded step by step, as the CPU sampler's separate statements are
      float x = __fadd_rn(w[d.token], d.bias);
      if (d.repetition != 1.0f) x = x > 0 ? __fdiv_rn(x, d.repetition) : __fmul_rn(x, d.repetition);
      w[d.token] = __fsub_rn(x, d.subtract);
    }
    __syncthreads();
    row.edited = w;
  }

  // Argmax of the processed logits (first index on ties) and the raw maximum.
  u64 best = 0;
  float raw_max = -INFINITY;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const u64 r = rank_key(order_key(row.w_at(i)), i);
    best = r > best ? r : best;
    raw_max = fmaxf(raw_max, row.raw_at(i));
  }
  best = block_reduce(best, Max());
  const int argmax = rank_index(best);
  const float w_max = key_value(uint32_t(best >> 32));

  // Every logit -inf (or NaN) after the edits: no token, -1, as the CPU sampler answers.
  int token = w_max == -INFINITY ? -1 : argmax;
  const bool greedy = p.temperature <= 0.0f || p.top_k == 1;
  // A row whose maximum is +inf has no distribution either: it gets the argmax.
  if (!greedy && isfinite(w_max)) {
    const float inv_t = 1.0f / p.temperature;
    const int k = p.top_k > 0 && p.top_k < V ? p.top_k : V;
    Cut top_k;
    if (k < V)
      top_k = select_prefix(sm, V, u64(k), false, w_max, inv_t, [&](int i) { return row.w_at(i); },
                            [](uint32_t, int) { return true; });
    token = k <= kCandidates ? sample_candidates(sm, row, top_k, k, p, w_max, inv_t)
                             : sample_large(sm, row, top_k, p, w_max, inv_t, argmax);
  }

  SampledToken res;
  res.token = token;
  if (p.n_logprobs >= 0) {
    raw_max = block_reduce(raw_max, Max());
    float s = 0.0f;
    for (int i = threadIdx.x; i < V; i += kThreads) s += expf(row.raw_at(i) - raw_max);
    const double lse = double(raw_max) + log(block_reduce(double(s), Sum()));
    res.logprob = float(double(row.raw_at(token)) - lse);
    const int n = min(min(p.n_logprobs, kMaxTopLogprobs), V);
    if (n > 0) {
      __syncthreads();  // sm.cand may still be read by the sampling above
      auto raw_of = [&](int i) { return row.raw_at(i); };
      const Cut top = n < V ? select_prefix(sm, V, u64(n), false, 0.0f, 1.0f, raw_of, [](uint32_t, int) { return true; })
                            : Cut{};
      gather_sorted(sm, V, top, n, raw_of);
      res.n_top = n;
      for (int j = 0; j < n; ++j) {
        res.top_ids[j] = rank_index(sm.cand[j]);
        res.top_logprobs[j] = float(double(key_value(uint32_t(sm.cand[j] >> 32))) - lse);
      }
    }
  }
  if (threadIdx.x == 0) out[blockIdx.x] = res;
}

}  // namespace

void launch_sample(const bf16* logits, int V, const SampleRowParams* rows, int n_rows, const LogitEdit* edits,
                   float* work, SampledToken* out, cudaStream_t s) {
  if (n_rows == 0) return;
  sample_kernel<<<n_rows, kThreads, 0, s>>>(logits, V, rows, edits, work, out);
  cuda_check_launch("sample_kernel", s);
}

}  // namespace ds::cuda
