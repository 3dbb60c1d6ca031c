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
