// Checkpoint folder loading: config.json, then model.safetensors.index.json (sharded) or
// every *.safetensors file, each mmap'd and validated.
#include "io/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace ds {

namespace fs = std::filesystem;

std::string Checkpoint::canonical_name(const std::string& n) {
  auto starts = [&](const char* p) { return n.rfind(p, 0) == 0; };
  if (starts("model.visual.") || starts("visual.") || starts("model.vision_tower.")) return "";
  if (starts("model.language_model.")) return "model." + n.substr(std::strlen("model.language_model."));
  if (starts("language_model.model.")) return "model." + n.substr(std::strlen("language_model.model."));
  if (starts("language_model.lm_head.")) return n.substr(std::strlen("language_model."));
  return n;
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found("model folder " + dir + " does not exist or is not a directory");
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  DS_ASSIGN_OR_RETURN(ck->config_, load_model_config((fs::path(dir) / "config.json").string()));

  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    std::stringstream ss;
    ss << in.rdbuf();
    auto j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return invalid_argument(index.string() + ": not valid JSON with a 'weight_map' object");
    std::set<std::string> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string()) return invalid_argument(index.string() + ": weight_map entry '" + it.key() + "' is not a file name");
      shards.insert(it->get<std::string>());
    }
    for (const auto& s : shards) {
      if (s.find('/') != std::string::npos || s == "..")
        return invalid_argument(index.string() + ": shard name '" + s + "' must be a plain file name");
      if (!fs::exists(fs::path(dir) / s)) return not_found(index.string() + " names shard " + s + ", which is missing");
      DS_RETURN_IF_ERROR(ck->add_file((fs::path(dir) / s).string()));
    }
  } else {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty()) return not_found("model folder " + dir + " has no *.safetensors file");
    for (const auto& f : files) DS_RETURN_IF_ERROR(ck->add_file(f));
  }
  return ck;
}

Status Checkpoint::add_file(const std::string& path) {
  DS_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
  for (const auto& [name, info] : file->tensors()) {
    std::string c = canonical_name(name);
    if (c.empty()) continue;
    if (tensors_.count(c))
      return invalid_argument("tensor '" + name + "' appears twice (in " + *tensors_[c].file + " and " + path + ")");
    tensors_[c] = CheckpointTensor{&info, file->data(info), &file->path()};
  }
  files_.push_back(std::move(file));
  return Status();
}

bool Checkpoint::has_prefix(const std::string& prefix) const {
  auto it = tensors_.lower_bound(prefix);
  return it != tensors_.end() && it->first.rfind(prefix, 0) == 0;
}

Result<CheckpointTensor> Checkpoint::get_float(const std::string& name, const std::vector<int64_t>& shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return not_found("checkpoint " + dir_ + " has no tensor '" + name + "'");
  const CheckpointTensor& t = it->second;
  if (!dtype_is_float(t.info->dtype))
    return invalid_argument("tensor '" + t.info->name + "' in " + *t.file + ": expected dtype BF16, F16 or F32, found " +
                            dtype_name(t.info->dtype));
  if (t.info->shape != shape)
    return invalid_argument("tensor '" + t.info->name + "' in " + *t.file + ": expected shape " + shape_to_string(shape) +
                            ", found " + shape_to_string(t.info->shape));
  return t;
}

Result<std::vector<float>> Checkpoint::read_f32(const std::string& name, const std::vector<int64_t>& shape) const {
  DS_ASSIGN_OR_RETURN(CheckpointTensor t, get_float(name, shape));
  std::vector<float> out(static_cast<size_t>(t.info->numel()));
  convert_to_f32(t.info->dtype, t.data, out.data(), out.size());
  return out;
}

}  // namespace ds

namespace ds {

Result<CheckpointTensor> Checkpoint::get_exact(const std::string& name, DType dtype,
                                               const std::vector<int64_t>& shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return not_found("checkpoint " + dir_ + " has no tensor '" + name + "'");
  const CheckpointTensor& t = it->second;
  if (t.info->dtype != dtype)
    return invalid_argument("tensor '" + t.info->name + "' in " + *t.file + ": expected dtype " + dtype_name(dtype) +
                            ", found " + dtype_name(t.info->dtype));
  if (t.info->shape != shape)
    return invalid_argument("tensor '" + t.info->name + "' in " + *t.file + ": expected shape " + shape_to_string(shape) +
                            ", found " + shape_to_string(t.info->shape));
  return t;
}

Result<QuantScheme> Checkpoint::packed_scheme(const std::string& module, int64_t rows, int64_t cols) const {
  const QuantConfig& q = config_.quant;
  if (!q.present)
    return invalid_argument("tensor '" + module + ".weight_packed' found but config.json has no quantization_config");
  // The config groups' schemes may differ (int4 linears beside an int8 lm_head): the one whose
  // words and groups a row the tensors have is the one that packed them. Two that both fit must
  // mean the same values (the same bits, and the same groups or one a row).
  auto shape_of = [&](const std::string& name) {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? std::vector<int64_t>{} : it->second.info->shape;
  };
  const std::vector<int64_t> packed_shape = shape_of(module + ".weight_packed");
  const std::vector<int64_t> scale_shape = shape_of(module + ".weight_scale");
  const QuantScheme* scheme = nullptr;
  for (const QuantScheme& s : q.schemes) {
    const int per_word = 32 / s.bits;
    if (packed_shape != std::vector<int64_t>{rows, (cols + per_word - 1) / per_word} ||
        scale_shape != std::vector<int64_t>{rows, (cols + s.group_size - 1) / s.group_size})
      continue;
    if (scheme && (s.bits != scheme->bits || (s.group_size != scheme->group_size && scale_shape[1] > 1)))
      return invalid_argument("tensors '" + module + ".weight_packed' and '.weight_scale' fit two schemes of " +
                              "config.json's quantization_config that read them differently (" + scheme->name +
                              " and " + s.name + ")");
    if (!scheme) scheme = &s;
  }
  if (!scheme) {
    std::string schemes;
    for (const QuantScheme& s : q.schemes)
      schemes += (schemes.empty() ? "" : ", ") + s.name + ": int" + std::to_string(s.bits) + " in groups of " +
                 std::to_string(s.group_size);
    const CheckpointTensor& t = tensors_.at(module + ".weight_packed");
    return invalid_argument("tensors '" + module + ".weight_packed' " + shape_to_string(packed_shape) + " and '" +
                            module + ".weight_scale' " +
                            (scale_shape.empty() ? std::string("(missing)") : shape_to_string(scale_shape)) + " in " +
                            *t.file + " fit no scheme of config.json's quantization_config (" + schemes + ") for a [" +
                            std::to_string(rows) + ", " + std::to_string(cols) + "] weight");
  }
  return *scheme;
}

Result<PackedLinear> Checkpoint::read_packed(const std::string& module, int64_t rows, int64_t cols) const {
  DS_ASSIGN_OR_RETURN(const QuantScheme scheme, packed_scheme(module, rows, cols));
  PackedLinear p;
  p.bits = scheme.bits;
  p.group_size = scheme.group_size;
  p.rows = rows;
  p.cols = cols;
  const int per_word = 32 / p.bits;
  p.words_per_row = (cols + per_word - 1) / per_word;
  const int64_t groups = (cols + p.group_size - 1) / p.group_size;
  DS_ASSIGN_OR_RETURN(CheckpointTensor packed, get_exact(module + ".weight_packed", DType::kI32, {rows, p.words_per_row}));
  DS_ASSIGN_OR_RETURN(p.scales, read_f32(module + ".weight_scale", {rows, groups}));
  if (has(module + ".weight_shape")) {  // the unpadded [rows, cols]
    const CheckpointTensor& ws = tensors_.at(module + ".weight_shape");
    std::vector<int64_t> shape;
    if (ws.info->dtype == DType::kI64 && ws.info->numel() == 2)
      for (int i = 0; i < 2; ++i) shape.push_back(static_cast<const int64_t*>(ws.data)[i]);
    else if (ws.info->dtype == DType::kI32 && ws.info->numel() == 2)
      for (int i = 0; i < 2; ++i) shape.push_back(static_cast<const int32_t*>(ws.data)[i]);
    if (shape != std::vector<int64_t>{rows, cols})
      return invalid_argument("tensor '" + ws.info->name + "' in " + *ws.file + ": expected [" + std::to_string(rows) +
                              ", " + std::to_string(cols) + "] (an I64 or I32 pair)");
  }
  if (has(module + ".weight_zero_point"))
    return unsupported("tensor '" + module + ".weight_zero_point': asymmetric weights are not supported yet");
  if (has(module + ".weight_g_idx")) {  // actorder "group"
    DS_ASSIGN_OR_RETURN(CheckpointTensor gi, get_exact(module + ".weight_g_idx", DType::kI32, {cols}));
    const int32_t* g = static_cast<const int32_t*>(gi.data);
    if (std::any_of(g, g + cols, [](int32_t v) { return v >= 0; })) p.g_idx.assign(g, g + cols);
    for (int32_t v : p.g_idx)
      if (v < 0 || v >= groups)
        return invalid_argument("tensor '" + module + ".weight_g_idx': group index " + std::to_string(v) +
                                " outside [0, " + std::to_string(groups) + ")");
  }
  const int32_t* words = static_cast<const int32_t*>(packed.data);
  p.packed.assign(words, words + rows * p.words_per_row);
  return p;
}

std::vector<int8_t> int8_codes(const PackedLinear& p) {
  DS_ASSERT(p.bits == 8 && p.g_idx.empty(), "int8_codes takes 8-bit weights without a g_idx");
  std::vector<int8_t> q(static_cast<size_t>(p.rows * p.cols));
  for (int64_t o = 0; o < p.rows; ++o)
    for (int64_t i = 0; i < p.cols; ++i) {
      const uint32_t word = static_cast<uint32_t>(p.packed[o * p.words_per_row + i / 4]);
      q[o * p.cols + i] = static_cast<int8_t>(static_cast<int>((word >> (8 * (i % 4))) & 0xFFu) - 128);
    }
  return q;
}

Result<std::vector<float>> Checkpoint::read_linear_f32(const std::string& module, int64_t rows, int64_t cols) const {
  if (!is_quantized(module)) return read_f32(module + ".weight", {rows, cols});
  DS_ASSIGN_OR_RETURN(PackedLinear p, read_packed(module, rows, cols));
  const int per_word = 32 / p.bits;
  const int64_t groups = static_cast<int64_t>(p.scales.size()) / rows;
  const uint32_t mask = (1u << p.bits) - 1, offset = 1u << (p.bits - 1);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t i = 0; i < cols; ++i) {
      const uint32_t word = static_cast<uint32_t>(p.packed[o * p.words_per_row + i / per_word]);
      const int value = static_cast<int>((word >> (p.bits * (i % per_word))) & mask) - static_cast<int>(offset);
      const int64_t grp = p.g_idx.empty() ? i / p.group_size : p.g_idx[i];
      w[o * cols + i] = static_cast<float>(value) * p.scales[o * groups + grp];  // exact in fp32
    }
  return w;
}

}  // namespace ds
