// Loading tokenizer.json / tokenizer_config.json into a Tokenizer, and the encode/decode
// pipeline. Only what byte-level BPE checkpoints use is accepted; anything else is a clear
// "unsupported" error rather than a silently different tokenization.
#include "tokenizer/tokenizer.h"

#include <utf8proc.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/unicode_text.h"

namespace ds::tok {
namespace {

using json = nlohmann::json;

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Unicode White_Space (Rust's char::is_whitespace): Zs, Zl, Zp, U+0009..U+000D and U+0085.
bool is_white_space(int32_t cp) {
  if ((cp >= 9 && cp <= 13) || cp == 0x85) return true;
  auto cat = utf8proc_category(cp);
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

// Code point ending at byte `end` of valid UTF-8 `s`; sets *len to its byte length.
int32_t cp_before(std::string_view s, size_t end, size_t* len) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  utf8proc_int32_t cp = 0;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + b), static_cast<utf8proc_ssize_t>(end - b), &cp);
  *len = end - b;
  return cp;
}

int32_t cp_at(std::string_view s, size_t i, size_t* len) {
  utf8proc_int32_t cp = 0;
  auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                            static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  *len = n > 0 ? static_cast<size_t>(n) : 1;
  return cp;
}

// tokenizer_config.json writes tokens as a string, {"content": ...} or null.
std::string token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }

}  // namespace

Result<std::shared_ptr<Tokenizer>> Tokenizer::load_dir(const std::string& dir) {
  DS_ASSIGN_OR_RETURN(std::string tj, read_file(dir + "/tokenizer.json"));
  std::string cj;
  std::ifstream probe(dir + "/tokenizer_config.json");
  if (probe) {
    DS_ASSIGN_OR_RETURN(cj, read_file(dir + "/tokenizer_config.json"));
  }
  return from_json(tj, cj, dir + "/tokenizer.json");
}

Result<std::shared_ptr<Tokenizer>> Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                                                         const std::string& origin) {
  json tj = json::parse(tokenizer_json, nullptr, false);
  if (tj.is_discarded() || !tj.is_object()) return invalid_argument(origin + ": not a JSON object");
  auto bad = [&](const std::string& m) { return invalid_argument(origin + ": " + m); };
  auto unsup = [&](const std::string& m) { return unsupported(origin + ": " + m); };
  std::shared_ptr<Tokenizer> t(new Tokenizer());

  // model
  if (!tj.contains("model") || !tj["model"].is_object()) return bad("missing \"model\"");
  const json& m = tj["model"];
  if (m.contains("type") && type_of(m) != "BPE") return unsup("model.type '" + type_of(m) + "' (only BPE)");
  if (m.value("byte_fallback", false)) return unsup("model.byte_fallback = true");
  if (m.contains("dropout") && !m["dropout"].is_null()) return unsup("model.dropout");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty()) return unsup(std::string("model.") + k);
  if (!m.contains("vocab") || !m["vocab"].is_object()) return bad("model.vocab must be an object");
  if (!m.contains("merges") || !m["merges"].is_array()) return bad("model.merges must be an array");
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(m["vocab"].size());
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) return bad("model.vocab['" + it.key() + "'] is not an integer id");
    vocab.emplace_back(it.key(), it.value().get<int32_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(m["merges"].size());
  for (size_t i = 0; i < m["merges"].size(); ++i) {
    const json& e = m["merges"][i];
    if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else if (e.is_string() && e.get<std::string>().find(' ') != std::string::npos) {
      const std::string s = e.get<std::string>();
      size_t sp = s.find(' ');
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      return bad("model.merges[" + std::to_string(i) + "] is neither [\"a\", \"b\"] nor \"a b\"");
    }
  }
  auto bpe = BpeModel::build(vocab, merges, m.value("ignore_merges", false));
  if (!bpe.ok()) return bad(bpe.status().message());
  t->bpe_ = std::move(bpe).value();

  // normalizer: NFC or nothing
  const json norm = tj.value("normalizer", json());
  if (type_of(norm) == "NFC") {
    t->nfc_ = true;
  } else if (type_of(norm) == "Sequence" && norm.contains("normalizers") && norm["normalizers"].is_array()) {
    for (const json& n : norm["normalizers"]) {
      if (type_of(n) != "NFC") return unsup("normalizer '" + type_of(n) + "' (only NFC)");
      t->nfc_ = true;
    }
  } else if (!norm.is_null()) {
    return unsup("normalizer '" + type_of(norm) + "' (only NFC)");
  }

  // pre_tokenizer: [Split(regex, Isolated)], ByteLevel(use_regex = false)
  const json pre = tj.value("pre_tokenizer", json());
  std::vector<json> pres;
  if (type_of(pre) == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
    for (const json& p : pre["pretokenizers"]) pres.push_back(p);
  } else if (!pre.is_null()) {
    pres.push_back(pre);
  }
  bool byte_level = false;
  for (const json& p : pres) {
    std::string ty = type_of(p);
    if (ty == "Split") {
      if (t->split_ || byte_level) return unsup("pre_tokenizer: more than one Split, or Split after ByteLevel");
      if (p.value("behavior", std::string()) != "Isolated") return unsup("pre_tokenizer Split behavior other than Isolated");
      if (p.value("invert", false)) return unsup("pre_tokenizer Split with invert = true");
      if (!p.contains("pattern") || !p["pattern"].is_object() || !p["pattern"].contains("Regex") ||
          !p["pattern"]["Regex"].is_string())
        return unsup("pre_tokenizer Split pattern must be {\"Regex\": ...}");
      auto rs = RegexSplit::compile(p["pattern"]["Regex"].get<std::string>());
      if (!rs.ok()) return bad(rs.status().message());
      t->split_ = rs.value();
    } else if (ty == "ByteLevel") {
      if (p.value("add_prefix_space", false)) return unsup("pre_tokenizer ByteLevel add_prefix_space = true");
      if (p.value("use_regex", true)) return unsup("pre_tokenizer ByteLevel use_regex = true (GPT-2 regex)");
      byte_level = true;
    } else {
      return unsup("pre_tokenizer '" + ty + "'");
    }
  }
  if (!byte_level) return unsup("pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
  const json dec = tj.value("decoder", json());
  if (!dec.is_null() && type_of(dec) != "ByteLevel") return unsup("decoder '" + type_of(dec) + "' (only ByteLevel)");
  const json post = tj.value("post_processor", json());
  if (!post.is_null() && type_of(post) != "ByteLevel") return unsup("post_processor '" + type_of(post) + "' (only ByteLevel)");

  // added tokens
  t->id_bytes_.resize(static_cast<size_t>(t->bpe_.size()));
  for (int32_t id = 0; id < t->bpe_.size(); ++id) t->id_bytes_[id] = t->bpe_.id_bytes(id);
  const json added = tj.value("added_tokens", json::array());
  if (!added.is_array()) return bad("added_tokens must be an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string())
      return bad(where + " needs an integer \"id\" and a string \"content\"");
    AddedToken tok;
    tok.content = a["content"].get<std::string>();
    tok.id = a["id"].get<int32_t>();
    tok.lstrip = a.value("lstrip", false);
    tok.rstrip = a.value("rstrip", false);
    tok.normalized = a.value("normalized", false);
    tok.special = a.value("special", false);
    if (a.value("single_word", false)) return unsup(where + " has single_word = true");
    if (tok.content.empty() || tok.id < 0) return bad(where + " has empty content or a negative id");
    if (!is_valid_utf8(tok.content)) return bad(where + " content is not UTF-8");
    if (tok.normalized && t->nfc_) tok.content = nfc(tok.content);
    if (static_cast<size_t>(tok.id) >= t->id_bytes_.size()) t->id_bytes_.resize(static_cast<size_t>(tok.id) + 1);
    std::string bytes;  // the ByteLevel decoder maps a token's chars back to bytes when it can
    t->id_bytes_[tok.id] = unicode_to_bytes(tok.content, &bytes) ? bytes : tok.content;
    t->first_byte_[tok.normalized][static_cast<uint8_t>(tok.content[0])] = true;
    t->added_.push_back(std::move(tok));
  }
  t->special_.assign(t->id_bytes_.size(), 0);
  for (const auto& a : t->added_) t->special_[a.id] = a.special ? 1 : 0;

  // tokenizer_config.json: BOS/EOS/PAD and the chat template
  if (!config_json.empty()) {
    json cj = json::parse(config_json, nullptr, false);
    if (cj.is_discarded() || !cj.is_object()) return invalid_argument("tokenizer_config.json: not a JSON object");
    t->bos_token_ = token_text(cj.value("bos_token", json()));
    t->eos_token_ = token_text(cj.value("eos_token", json()));
    std::string pad = token_text(cj.value("pad_token", json()));
    auto resolve = [&](const std::string& s, const char* what, std::optional<int32_t>* id) -> Status {
      if (s.empty()) return Status();
      *id = t->token_id(s);
      if (!*id) return invalid_argument(std::string("tokenizer_config.json: ") + what + " '" + s + "' is not a token");
      return Status();
    };
    DS_RETURN_IF_ERROR(resolve(t->bos_token_, "bos_token", &t->bos_id_));
    DS_RETURN_IF_ERROR(resolve(t->eos_token_, "eos_token", &t->eos_id_));
    DS_RETURN_IF_ERROR(resolve(pad, "pad_token", &t->pad_id_));
    t->add_bos_ = cj.value("add_bos_token", false) && t->bos_id_;
    t->add_eos_ = cj.value("add_eos_token", false) && t->eos_id_;
    const json ct = cj.value("chat_template", json());
    if (ct.is_string()) {
      t->chat_template_ = ct.get<std::string>();
    } else if (ct.is_array()) {  // [{"name": "default", "template": ...}, ...]
      for (const json& e : ct)
        if (e.is_object() && e.value("name", std::string()) == "default" && e.contains("template") && e["template"].is_string())
          t->chat_template_ = e["template"].get<std::string>();
    }
  }
  return t;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token_text) const {
  for (const auto& a : added_)
    if (a.content == token_text) return a.id;
  std::string bytes;
  if (unicode_to_bytes(token_text, &bytes)) {
    int32_t id = bpe_.find(bytes);
    if (id >= 0) return id;
  }
  return std::nullopt;
}

const std::string* Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return nullptr;
  const std::string& b = id_bytes_[id];
  return b.empty() ? nullptr : &b;
}

bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size() && special_[id]; }

void Tokenizer::split_added(std::string_view text, bool normalized,
                            std::vector<std::pair<std::string_view, int32_t>>& out) const {
  const bool* first = first_byte_[normalized];
  size_t piece_start = 0, i = 0;
  while (i < text.size()) {
    if (!first[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    const AddedToken* best = nullptr;  // leftmost-longest, as HF's Aho-Corasick matcher
    for (const auto& a : added_)
      if (a.normalized == normalized && a.content.size() > (best ? best->content.size() : 0) &&
          text.compare(i, a.content.size(), a.content) == 0)
        best = &a;
    if (!best) {
      ++i;
      continue;
    }
    size_t b = i, e = i + best->content.size(), len;
    if (best->lstrip)
      while (b > piece_start && is_white_space(cp_before(text, b, &len))) b -= len;
    if (best->rstrip)
      while (e < text.size() && is_white_space(cp_at(text, e, &len))) e += len;
    if (b > piece_start) out.emplace_back(text.substr(piece_start, b - piece_start), -1);
    out.emplace_back(text.substr(b, e - b), best->id);
    piece_start = i = e;
  }
  if (piece_start < text.size()) out.emplace_back(text.substr(piece_start), -1);
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
  thread_local std::vector<std::string_view> words;
  words.clear();
  if (split_) {
    split_->split(text, words);
  } else {
    words.push_back(text);
  }
  for (std::string_view w : words) bpe_.encode_word(w, ids);
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (!is_valid_utf8(text)) return invalid_argument("text to tokenize is not valid UTF-8");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens && add_bos_) ids.push_back(*bos_id_);
  std::vector<std::pair<std::string_view, int32_t>> raw, normed;
  split_added(text, false, raw);
  for (const auto& [piece, id] : raw) {
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    std::string n = nfc_ ? nfc(piece) : std::string(piece);
    normed.clear();
    split_added(n, true, normed);
    for (const auto& [p2, id2] : normed) {
      if (id2 >= 0) {
        ids.push_back(id2);
      } else {
        encode_plain(p2, ids);
      }
    }
  }
  if (add_special_tokens && add_eos_) ids.push_back(*eos_id_);
  return ids;
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    const std::string* b = token_bytes(id);
    if (!b) return out_of_range("token id " + std::to_string(id) + " is not in the vocabulary");
    if (skip_special_tokens && special_[id]) continue;
    bytes += *b;
  }
  std::string out;
  append_utf8_lossy(bytes, out);
  return out;
}

}  // namespace ds::tok
