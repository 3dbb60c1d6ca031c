// Weights of Qwen35Model: canonical tensor names and expected shapes from the config, read
// from a checkpoint (zero-centred norms turned into plain gains, 1 + w in fp32) or drawn at
// random on the backend for synthetic benchmarks; linears of one input fused (group_parts).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "model/qwen3_5.h"

namespace ds {

namespace {

// How a fp32 parameter is stored and, for synthetic weights, drawn.
enum class ParamKind { kNorm1p, kGain, kALog, kDtBias, kConv };

// The module of weight `name` ("m.weight" -> "m"), whose packed tensors are m.weight_packed, ...
std::string module_of(const std::string& name) { return name.substr(0, name.size() - std::strlen(".weight")); }

// Where weight values come from: a checkpoint folder, or random values of the right shapes.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // An embedding table [rows, cols] in the backend's activation dtype (dequantised where the
  // checkpoint publishes it quantized).
  virtual Result<Tensor> embedding(const std::string& name, int64_t rows, int64_t cols) = 0;
  // The weights `names` of linears that share one input, part i [rows[i], cols]: each W4A16, or
  // int8 rows where int8_rows, where the source has it so and the backend runs it, else dense; the
  // parts stacked into one weight per group of group_parts(storage, fuse). act_int8: the parts
  // published as W4A16 (kept or dequantised) read int8 inputs (LinearWeight::act_int8).
  virtual Result<FusedLinear> fused(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                                    int64_t cols, bool fuse, bool act_int8, bool int8_rows) = 0;
  // A vocabulary table [rows, cols] the source publishes as int8 groups of 128, in the backend's
  // int8 storage with the published codes and scales, where the backend keeps int8 tables
  // (Ops::upload_int8_rows); else std::nullopt, and the table is read as any other.
  virtual Result<std::optional<LinearWeight>> published_int8(const std::string& name, int64_t rows, int64_t cols) {
    return std::optional<LinearWeight>();
  }
  // A fp32 parameter published with `shape`, stored as [rows, cols] (cols 0: a vector of rows).
  virtual Result<Tensor> f32(const std::string& name, const std::vector<int64_t>& shape, int64_t rows, int64_t cols,
                             ParamKind kind) = 0;
};

class CheckpointSource final : public WeightSource {
 public:
  CheckpointSource(const Checkpoint& ck, Ops& ops) : ck_(ck), ops_(ops) {}
  Result<Tensor> embedding(const std::string& name, int64_t rows, int64_t cols) override {
    const std::string module = module_of(name);
    if (ck_.is_quantized(module)) {  // a table published quantized (int8): dequantised, exact in fp32
      DS_ASSIGN_OR_RETURN(std::vector<float> v, ck_.read_linear_f32(module, rows, cols));
      return ops_.upload(v.data(), DType::kF32, {rows, cols}, ops_.act_dtype());
    }
    DS_ASSIGN_OR_RETURN(CheckpointTensor t, ck_.get_float(name, {rows, cols}));
    return ops_.upload(t.data, t.info->dtype, {rows, cols}, ops_.act_dtype());
  }
  // The codes and scales go to the backend as published: no f32 copy of the table on the host,
  // no bf16 one on the device, and the scales are not rounded.
  Result<std::optional<LinearWeight>> published_int8(const std::string& name, int64_t rows, int64_t cols) override {
    const std::string module = module_of(name);
    if (!ck_.is_quantized(module) || !ops_.keeps_int8_vocab(cols)) return std::optional<LinearWeight>();
    DS_ASSIGN_OR_RETURN(const QuantScheme scheme, ck_.packed_scheme(module, rows, cols));
    DS_ASSIGN_OR_RETURN(std::optional<PackedLinear> p, int8_rows_of(module, rows, cols, scheme));
    if (!p) return std::optional<LinearWeight>();  // read as any other
    HostLinear h;
    h.rows = rows;
    h.bits = 8;
    h.packed = std::move(p);
    return std::optional<LinearWeight>(upload_int8(std::span<const HostLinear>(&h, 1), cols));
  }
  // Every part is read to the host first; a group is stacked there and uploaded once, so the
  // device never holds a part and its group at the same time.
  Result<FusedLinear> fused(const std::vector<std::string>& names, const std::vector<int64_t>& rows, int64_t cols,
                            bool fuse, bool act_int8, bool int8_rows) override {
    std::vector<HostLinear> parts;
    std::vector<PartStorage> storage;
    for (size_t i = 0; i < names.size(); ++i) {
      DS_ASSIGN_OR_RETURN(HostLinear p, read(names[i], rows[i], cols, int8_rows));
      const bool kept_int8 = p.packed && p.bits == 8;
      storage.push_back({p.packed ? p.packed->group_size : 0, act_int8 && p.bits == 4, kept_int8});
      parts.push_back(std::move(p));
    }
    FusedLinear f;
    f.rows = rows;
    size_t first = 0;
    for (int n : group_parts(storage, fuse)) {
      const std::span<const HostLinear> group(parts.data() + first, n);
      LinearWeight w = storage[first].int8_rows    ? upload_int8(group, cols)
                       : storage[first].group_size ? upload_packed(group, cols)
                                                   : upload_dense(group, cols);
      w.act_int8 = storage[first].act_int8;
      f.groups.push_back({std::move(w), n});
      first += n;
    }
    return f;
  }
  Result<Tensor> f32(const std::string& name, const std::vector<int64_t>& shape, int64_t rows, int64_t cols,
                     ParamKind kind) override {
    DS_ASSIGN_OR_RETURN(std::vector<float> v, ck_.read_f32(name, shape));
    if (kind == ParamKind::kNorm1p)  // zero-centred RMSNorm: the gain is 1 + w, added in fp32
      for (float& x : v) x = 1.0f + x;
    return cols ? ops_.upload(v.data(), DType::kF32, {rows, cols}, DType::kF32)
                : ops_.upload(v.data(), DType::kF32, {rows}, DType::kF32);
  }

 private:
  // One linear's weight [rows, cols] on the host, as the backend will store it: exactly one of
  // packed (W4A16 kept, or int8 rows kept: bits 8), tensor (dense as published) or dequantised
  // (dense from a packed form the backend does not run) is set.
  struct HostLinear {
    int64_t rows = 0;
    int bits = 0;  // of the published packed form; 0: dense as published
    std::optional<PackedLinear> packed;
    CheckpointTensor tensor;         // a view into the mapped file
    std::vector<float> dequantised;  // f32 [rows, cols]
  };

  // The packed form of `module` (of `scheme`, Checkpoint::packed_scheme) where it is int8 rows the
  // backend keeps (8 bits, groups of 128, no g_idx: Ops::keeps_int8_rows), else std::nullopt;
  // other forms' words are not read.
  Result<std::optional<PackedLinear>> int8_rows_of(const std::string& module, int64_t rows, int64_t cols,
                                                   const QuantScheme& scheme) {
    if (scheme.bits != 8 || scheme.group_size != 128 || !ops_.keeps_int8_rows(cols))
      return std::optional<PackedLinear>();
    DS_ASSIGN_OR_RETURN(PackedLinear p, ck_.read_packed(module, rows, cols));
    if (!p.g_idx.empty()) return std::optional<PackedLinear>();
    return std::optional<PackedLinear>(std::move(p));
  }

  // int8_rows: a linear published as int8 rows is kept so where the backend keeps them.
  Result<HostLinear> read(const std::string& name, int64_t rows, int64_t cols, bool int8_rows) {
    const std::string module = module_of(name);
    HostLinear h;
    h.rows = rows;
    if (!ck_.is_quantized(module)) {
      DS_ASSIGN_OR_RETURN(h.tensor, ck_.get_float(name, {rows, cols}));
      return h;
    }
    DS_ASSIGN_OR_RETURN(const QuantScheme scheme, ck_.packed_scheme(module, rows, cols));
    h.bits = scheme.bits;
    if (int8_rows) {
      DS_ASSIGN_OR_RETURN(h.packed, int8_rows_of(module, rows, cols, scheme));
      if (h.packed) return h;
    }
    if (ops_.supports_w4a16() && scheme.bits == 4) {
      DS_ASSIGN_OR_RETURN(PackedLinear p, ck_.read_packed(module, rows, cols));
      if (p.g_idx.empty() && cols % p.group_size == 0) {
        h.packed = std::move(p);
        return h;
      }
    }
    // Dequantised at load: exact in fp32, rounded once for a bf16 backend.
    DS_ASSIGN_OR_RETURN(h.dequantised, ck_.read_linear_f32(module, rows, cols));
    return h;
  }

  // Dense parts stacked into act [sum rows, cols]: in their checkpoint dtype when they all share
  // one (converted by upload, as a single matrix is), else through f32.
  LinearWeight upload_dense(std::span<const HostLinear> parts, int64_t cols) {
    LinearWeight w;
    int64_t n = 0;
    const CheckpointTensor& first = parts[0].tensor;
    bool same_dtype = first.data != nullptr;
    for (const HostLinear& p : parts) {
      n += p.rows;
      same_dtype = same_dtype && p.tensor.data && p.tensor.info->dtype == first.info->dtype;
    }
    const DType act = ops_.act_dtype();
    if (parts.size() == 1) {  // uploaded from where it lies
      const HostLinear& p = parts[0];
      w.dense = p.tensor.data ? ops_.upload(p.tensor.data, p.tensor.info->dtype, {n, cols}, act)
                              : ops_.upload(p.dequantised.data(), DType::kF32, {n, cols}, act);
    } else if (same_dtype) {
      const DType dtype = first.info->dtype;
      std::vector<uint8_t> bytes;
      bytes.reserve(static_cast<size_t>(n * cols) * dtype_size(dtype));
      for (const HostLinear& p : parts) {
        const auto* data = static_cast<const uint8_t*>(p.tensor.data);
        bytes.insert(bytes.end(), data, data + static_cast<size_t>(p.rows * cols) * dtype_size(dtype));
      }
      w.dense = ops_.upload(bytes.data(), dtype, {n, cols}, act);
    } else {
      std::vector<float> values(static_cast<size_t>(n * cols));
      float* dst = values.data();
      for (const HostLinear& p : parts) {
        const size_t count = static_cast<size_t>(p.rows * cols);
        if (p.tensor.data) convert_to_f32(p.tensor.info->dtype, p.tensor.data, dst, count);
        else std::copy(p.dequantised.begin(), p.dequantised.end(), dst);
        dst += count;
      }
      w.dense = ops_.upload(values.data(), DType::kF32, {n, cols}, act);
    }
    return w;
  }

  // Int8 rows stacked row-wise, i8 [sum rows, cols] with scales f32 [sum rows, cols / 128] on the
  // host, in the backend's int8 storage (Ops::upload_int8_rows).
  LinearWeight upload_int8(std::span<const HostLinear> parts, int64_t cols) {
    int64_t n = 0;
    std::vector<int8_t> q;  // a single part's codes as they come (the 27B's lm_head: 1.3 GB, not copied)
    std::vector<float> scales;
    for (const HostLinear& p : parts) {
      DS_ASSERT(p.packed && p.packed->bits == 8 && p.packed->group_size == 128, "an int8 group mixes storage");
      std::vector<int8_t> codes = int8_codes(*p.packed);
      if (q.empty()) q = std::move(codes);
      else q.insert(q.end(), codes.begin(), codes.end());
      scales.insert(scales.end(), p.packed->scales.begin(), p.packed->scales.end());
      n += p.rows;
    }
    return ops_.upload_int8_rows(q.data(), scales.data(), n, cols);
  }

  // W4A16 parts of one group size stacked row-wise: packed i32 [sum rows, cols/8], scales f32
  // [sum rows, cols/group_size].
  LinearWeight upload_packed(std::span<const HostLinear> parts, int64_t cols) {
    LinearWeight w;
    w.group_size = parts[0].packed->group_size;
    int64_t n = 0;
    std::vector<int32_t> packed;
    std::vector<float> scales;
    for (const HostLinear& p : parts) {
      DS_ASSERT(p.packed->group_size == w.group_size, "a W4A16 group mixes group sizes");
      n += p.rows;
      packed.insert(packed.end(), p.packed->packed.begin(), p.packed->packed.end());
      scales.insert(scales.end(), p.packed->scales.begin(), p.packed->scales.end());
    }
    w.packed = ops_.upload(packed.data(), DType::kI32, {n, cols / 8}, DType::kI32);
    w.scales = ops_.upload(scales.data(), DType::kF32, {n, cols / w.group_size}, DType::kF32);
    return w;
  }

  const Checkpoint& ck_;
  Ops& ops_;
};

// Random weights drawn on the backend (uniform, scaled so activations stay O(1)). Each part of
// a group is drawn with its own seeds, so the values do not depend on DS_FUSE_LINEARS.
class SyntheticSource final : public WeightSource {
 public:
  SyntheticSource(Ops& ops, bool w4a16, uint64_t seed) : ops_(ops), w4a16_(w4a16 && ops.supports_w4a16()), seed_(seed) {}
  Result<Tensor> embedding(const std::string&, int64_t rows, int64_t cols) override {
    Tensor t = ops_.alloc(ops_.act_dtype(), {rows, cols});
    ops_.fill_random(t, 0.f, 1.f, seed_++);
    return t;
  }
  Result<FusedLinear> fused(const std::vector<std::string>& names, const std::vector<int64_t>& rows, int64_t cols,
                            bool fuse, bool act_int8, bool /*int8_rows*/) override {
    std::vector<PartStorage> storage;
    for (const std::string& name : names) {
      const bool keep_dense = name == "lm_head.weight" || name.find("in_proj_a") != std::string::npos ||
                              name.find("in_proj_b") != std::string::npos || name.rfind("mtp.", 0) == 0;
      const int group = w4a16_ && !keep_dense && cols % kGroup == 0 ? kGroup : 0;
      storage.push_back({group, act_int8 && group > 0});
    }
    FusedLinear f;
    f.rows = rows;
    size_t first = 0;
    for (int n : group_parts(storage, fuse)) {
      int64_t total = 0;
      for (size_t i = first; i < first + n; ++i) total += rows[i];
      LinearWeight w;
      w.act_int8 = storage[first].act_int8;
      if (storage[first].group_size == 0) {
        w.dense = ops_.alloc(ops_.act_dtype(), {total, cols});  // act [total, cols]
      } else {
        w.packed = ops_.alloc(DType::kI32, {total, cols / 8});
        w.scales = ops_.alloc(DType::kF32, {total, cols / kGroup});
        w.group_size = kGroup;
      }
      int64_t r = 0;
      for (size_t i = first; i < first + n; ++i) {
        if (!w.quantized()) {
          ops_.fill_random(w.dense.rows(r, rows[i]), 0.f, 1.7f / std::sqrt(static_cast<float>(cols)), seed_++);
        } else {
          ops_.fill_random(w.packed.rows(r, rows[i]), 0.f, 0.f, seed_++);  // random nibbles: q uniform in [-8, 7]
          // |q| averages 4: scales of 0.4/sqrt(K) give the dense weights' spread
          ops_.fill_random(w.scales.rows(r, rows[i]), 0.f, 0.4f / std::sqrt(static_cast<float>(cols)), seed_++);
        }
        r += rows[i];
      }
      f.groups.push_back({std::move(w), n});
      first += n;
    }
    return f;
  }
  Result<Tensor> f32(const std::string&, const std::vector<int64_t>&, int64_t rows, int64_t cols,
                     ParamKind kind) override {
    Tensor t = cols ? ops_.alloc(DType::kF32, {rows, cols}) : ops_.alloc(DType::kF32, {rows});
    static constexpr float kMean[] = {1.f, 1.f, 0.f, 0.f, 0.f};
    static constexpr float kRange[] = {0.1f, 0.1f, 1.f, 0.5f, 0.5f};
    ops_.fill_random(t, kMean[static_cast<int>(kind)], kRange[static_cast<int>(kind)], seed_++);
    return t;
  }

 private:
  static constexpr int kGroup = 128;
  Ops& ops_;
  bool w4a16_;
  uint64_t seed_;
};

class Loader {
 public:
  Loader(WeightSource& src, Ops& ops, bool fuse, ActInt8Layers a8) : src_(src), ops_(ops), fuse_(fuse), a8_(a8) {}

  // A weight matrix handed to the backend's prepare_weight once its values are final (a
  // vocabulary table published as int8 goes to the backend's int8 storage directly, where it has
  // one). act_int8: its layer class reads int8 inputs (ActInt8Layers).
  Result<LinearWeight> lin(const std::string& name, int64_t rows, int64_t cols, WeightRole role = WeightRole::kLinear,
                           bool act_int8 = false) {
    if (is_vocab_role(role)) {
      DS_ASSIGN_OR_RETURN(std::optional<LinearWeight> int8, src_.published_int8(name, rows, cols));
      if (int8) return std::move(*int8);  // already in the backend's storage
    }
    LinearWeight w;
    if (role == WeightRole::kEmbedding) {
      DS_ASSIGN_OR_RETURN(w.dense, src_.embedding(name, rows, cols));
    } else {
      // A vocabulary table published as int8 and not kept so above is read through its values.
      DS_ASSIGN_OR_RETURN(FusedLinear f,
                          src_.fused({name}, {rows}, cols, /*fuse=*/false, act_int8, !is_vocab_role(role)));
      w = std::move(f.groups[0].w);
    }
    ops_.prepare_weight(w, role);
    return w;
  }
  // The linears p + names[i] + ".weight" [rows[i], cols] of one input, fused where their storage
  // agrees (and fusion is on); prepare_weight once per group weight, as `role` for a group of
  // every part (kGateUp: the MLP's gate and up) and kLinear otherwise.
  Result<FusedLinear> fused(const std::string& p, const std::vector<std::string>& names,
                            const std::vector<int64_t>& rows, int64_t cols, WeightRole role, bool act_int8) {
    std::vector<std::string> full;
    for (const std::string& n : names) full.push_back(p + n + ".weight");
    DS_ASSIGN_OR_RETURN(FusedLinear f, src_.fused(full, rows, cols, fuse_, act_int8, /*int8_rows=*/true));
    for (FusedLinear::Group& g : f.groups)
      ops_.prepare_weight(g.w, g.n_parts == static_cast<int>(names.size()) ? role : WeightRole::kLinear);
    return f;
  }
  Result<Tensor> norm(const std::string& name, int64_t n) { return src_.f32(name, {n}, n, 0, ParamKind::kNorm1p); }

  Status attention(const std::string& p, const ModelConfig& c, AttnWeights* a) {
    const int64_t H = c.hidden_size, hd = c.head_dim, nH = c.num_attention_heads, nKV = c.num_key_value_heads;
    const bool a8 = a8_.self_attn;
    DS_ASSIGN_OR_RETURN(a->qkv_proj, fused(p, {"q_proj", "k_proj", "v_proj"}, {nH * hd * 2, nKV * hd, nKV * hd}, H,
                                           WeightRole::kLinear, a8));
    DS_ASSIGN_OR_RETURN(a->o_proj, lin(p + "o_proj.weight", H, nH * hd, WeightRole::kLinear, a8));
    DS_ASSIGN_OR_RETURN(a->q_norm, norm(p + "q_norm.weight", hd));
    DS_ASSIGN_OR_RETURN(a->k_norm, norm(p + "k_norm.weight", hd));
    return Status();
  }

  Status mlp(const std::string& p, const ModelConfig& c, MlpWeights* m) {
    const int64_t H = c.hidden_size, I = c.intermediate_size;
    DS_ASSIGN_OR_RETURN(m->gate_up, fused(p, {"gate_proj", "up_proj"}, {I, I}, H, WeightRole::kGateUp, a8_.mlp));
    DS_ASSIGN_OR_RETURN(m->down_proj, lin(p + "down_proj.weight", H, I, WeightRole::kLinear, a8_.mlp));
    return Status();
  }

  Status gdn(const std::string& p, const ModelConfig& c, GdnWeights* g) {
    const int64_t H = c.hidden_size, C = c.conv_dim(), Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
    const int64_t K = c.linear_conv_kernel_dim;
    DS_ASSIGN_OR_RETURN(g->in_proj, fused(p, {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"},
                                          {C, Hv * dv, Hv, Hv}, H, WeightRole::kLinear, a8_.linear_attn));
    DS_ASSIGN_OR_RETURN(g->conv1d, src_.f32(p + "conv1d.weight", {C, 1, K}, C, K, ParamKind::kConv));
    DS_ASSIGN_OR_RETURN(g->a_log, src_.f32(p + "A_log", {Hv}, Hv, 0, ParamKind::kALog));
    DS_ASSIGN_OR_RETURN(g->dt_bias, src_.f32(p + "dt_bias", {Hv}, Hv, 0, ParamKind::kDtBias));
    DS_ASSIGN_OR_RETURN(g->norm, src_.f32(p + "norm.weight", {dv}, dv, 0, ParamKind::kGain));
    DS_ASSIGN_OR_RETURN(g->out_proj, lin(p + "out_proj.weight", H, Hv * dv, WeightRole::kLinear, a8_.linear_attn));
    return Status();
  }

 private:
  WeightSource& src_;
  Ops& ops_;
  bool fuse_;
  ActInt8Layers a8_;
};

// Every tensor the config implies, from `src`; the MTP head when with_mtp.
Result<ModelWeights> build_weights(const ModelConfig& c, WeightSource& src, Ops& ops, bool with_mtp,
                                   ActInt8Layers a8) {
  const int64_t H = c.hidden_size, V = c.vocab_size;
  Loader ld(src, ops, fuse_linears_from_env(), a8);
  ModelWeights w;
  DS_ASSIGN_OR_RETURN(w.embed, ld.lin("model.embed_tokens.weight", V, H, WeightRole::kEmbedding));
  DS_ASSIGN_OR_RETURN(w.final_norm, ld.norm("model.norm.weight", H));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;  // one table (in the backend's storage) serves both
  } else {
    DS_ASSIGN_OR_RETURN(w.lm_head, ld.lin("lm_head.weight", V, H, WeightRole::kLmHead));
  }
  int n_gdn = 0, n_attn = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights L;
    L.type = c.layer_types[i];
    DS_ASSIGN_OR_RETURN(L.input_norm, ld.norm(p + "input_layernorm.weight", H));
    DS_ASSIGN_OR_RETURN(L.post_attn_norm, ld.norm(p + "post_attention_layernorm.weight", H));
    if (L.type == LayerType::kLinearAttention) {
      L.cache_index = n_gdn++;
      DS_RETURN_IF_ERROR(ld.gdn(p + "linear_attn.", c, &L.gdn));
    } else {
      L.cache_index = n_attn++;
      DS_RETURN_IF_ERROR(ld.attention(p + "self_attn.", c, &L.attn));
    }
    DS_RETURN_IF_ERROR(ld.mlp(p + "mlp.", c, &L.mlp));
    w.layers.push_back(std::move(L));
  }
  if (with_mtp) {
    MtpWeights m;
    DS_ASSIGN_OR_RETURN(m.fc, ld.lin("mtp.fc.weight", H, 2 * H));
    DS_ASSIGN_OR_RETURN(m.pre_fc_norm_embedding, ld.norm("mtp.pre_fc_norm_embedding.weight", H));
    DS_ASSIGN_OR_RETURN(m.pre_fc_norm_hidden, ld.norm("mtp.pre_fc_norm_hidden.weight", H));
    DS_ASSIGN_OR_RETURN(m.norm, ld.norm("mtp.norm.weight", H));
    m.layer.type = LayerType::kFullAttention;
    m.layer.cache_index = n_attn;
    DS_ASSIGN_OR_RETURN(m.layer.input_norm, ld.norm("mtp.layers.0.input_layernorm.weight", H));
    DS_ASSIGN_OR_RETURN(m.layer.post_attn_norm, ld.norm("mtp.layers.0.post_attention_layernorm.weight", H));
    DS_RETURN_IF_ERROR(ld.attention("mtp.layers.0.self_attn.", c, &m.layer.attn));
    DS_RETURN_IF_ERROR(ld.mlp("mtp.layers.0.mlp.", c, &m.layer.mlp));
    w.mtp = std::move(m);
  }
  return w;
}

}  // namespace

std::vector<int> group_parts(const std::vector<PartStorage>& parts, bool fuse) {
  std::vector<int> n_parts;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (fuse && i > 0 && parts[i] == parts[i - 1]) ++n_parts.back();
    else n_parts.push_back(1);
  }
  return n_parts;
}

bool fuse_linears_from_env() {
  const char* env = std::getenv("DS_FUSE_LINEARS");  // env: DS_FUSE_LINEARS=0 turns fusion off
  return !(env && std::string(env) == "0");
}

Result<ActInt8Layers> parse_act_int8_layers(const std::string& s) {
  ActInt8Layers a;
  if (s == "none" || s.empty()) return a;
  if (s == "all") return ActInt8Layers{true, true, true};
  size_t begin = 0;
  while (begin <= s.size()) {
    const size_t end = std::min(s.find(',', begin), s.size());
    const std::string word = s.substr(begin, end - begin);
    if (word == "mlp") a.mlp = true;
    else if (word == "linear_attn") a.linear_attn = true;
    else if (word == "self_attn") a.self_attn = true;
    else
      return invalid_argument("W4A8 layers: '" + word +
                                      "' is not one of mlp, linear_attn, self_attn (or 'all', 'none')");
    begin = end + 1;
  }
  return a;
}

Result<ModelWeights> load_weights(const Checkpoint& ck, Ops& ops, ActInt8Layers a8) {
  CheckpointSource src(ck, ops);
  // The MTP head is optional; when any mtp.* tensor exists, all of them must.
  return build_weights(ck.config(), src, ops, ck.has_prefix("mtp."), a8);
}

Result<ModelWeights> synthetic_weights(const ModelConfig& config, Ops& ops, bool with_mtp, bool w4a16, uint64_t seed,
                                       ActInt8Layers a8) {
  SyntheticSource src(ops, w4a16, seed);
  return build_weights(config, src, ops, with_mtp, a8);
}

}  // namespace ds
