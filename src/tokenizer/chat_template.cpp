// The chat-template interpreter: walks the syntax tree from template_parser.cpp with Jinja
// scoping (for-loops scope their sets; namespace() crosses them), Python value semantics, and
// the filters, tests, string/dict methods and globals that chat templates use.
#include "tokenizer/chat_template.h"

#include <utf8proc.h>

#include <cmath>
#include <ctime>
#include <unordered_map>

namespace ds::tok {
namespace {

Status err_at(int line, int col, const std::string& msg) {
  return invalid_argument("template line " + std::to_string(line) + " col " + std::to_string(col) + ": " + msg);
}

// Code point boundaries of UTF-8 text: offsets[k] is where code point k starts; offsets.back() == size.
std::vector<size_t> cp_offsets(const std::string& s) {
  std::vector<size_t> o;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) o.push_back(i);
  o.push_back(s.size());
  return o;
}

// Python str.isspace() for one code point.
bool py_space(int32_t cp) {
  if ((cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85) return true;
  auto c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

int32_t decode_at(const std::string& s, size_t i, size_t end) {
  utf8proc_int32_t cp = -1;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i), static_cast<utf8proc_ssize_t>(end - i), &cp);
  return cp;
}

// Python's str.strip family: `chars` null strips whitespace, else any code point in chars.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto off = cp_offsets(s);
  size_t n = off.size() - 1, b = 0, e = n;
  auto strip_cp = [&](size_t k) {
    int32_t cp = decode_at(s, off[k], off[k + 1]);
    if (!chars || chars->is_none() || chars->is_undefined()) return py_space(cp);
    std::string one = s.substr(off[k], off[k + 1] - off[k]);
    return chars->s.find(one) != std::string::npos;
  };
  if (left) while (b < e && strip_cp(b)) ++b;
  if (right) while (e > b && strip_cp(e - 1)) --e;
  return s.substr(off[b], off[e] - off[b]);
}

Value py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  ValueList parts;
  if (!sep || sep->is_none() || sep->is_undefined()) {
    auto off = cp_offsets(s);
    size_t k = 0, n = off.size() - 1;
    while (true) {
      while (k < n && py_space(decode_at(s, off[k], off[k + 1]))) ++k;
      if (k >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(Value::string(py_strip(s.substr(off[k]), nullptr, false, true)));
        break;
      }
      size_t b = k;
      while (k < n && !py_space(decode_at(s, off[k], off[k + 1]))) ++k;
      parts.push_back(Value::string(s.substr(off[b], off[k] - off[b])));
    }
    return Value::new_list(std::move(parts));
  }
  size_t pos = 0;
  while (true) {
    size_t hit = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) ? std::string::npos : s.find(sep->s, pos);
    if (hit == std::string::npos) {
      parts.push_back(Value::string(s.substr(pos)));
      break;
    }
    parts.push_back(Value::string(s.substr(pos, hit - pos)));
    pos = hit + sep->s.size();
  }
  return Value::new_list(std::move(parts));
}

// Python slice semantics over a sequence of length n.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step_v) {
  int64_t step = step_v.kind == Value::Kind::kInt ? step_v.i : 1;
  auto norm = [&](const Value& v, int64_t dflt, bool is_start) {
    if (v.kind != Value::Kind::kInt) return dflt;
    int64_t x = v.i < 0 ? v.i + n : v.i;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    (void)is_start;
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  std::vector<int64_t> idx;
  if (step > 0) {
    for (int64_t k = norm(start, 0, true), e = norm(stop, n, false); k < e; k += step) idx.push_back(k);
  } else if (step < 0) {
    for (int64_t k = norm(start, n - 1, true), e = norm(stop, -1, false); k > e; k += step) idx.push_back(k);
  }
  return idx;
}

class Interp {
 public:
  explicit Interp(std::string* out) : out_(out) { frames_.emplace_back(); }

  void set_var(const std::string& name, Value v) { frames_.back()[name] = std::move(v); }

  Status exec(const Body& body) {
    for (const auto& n : body) {
      DS_RETURN_IF_ERROR(exec_node(*n));
      if (flow_ != Flow::kNormal) return Status();
    }
    return Status();
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Frame = std::unordered_map<std::string, Value>;

  Status exec_node(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kText: *out_ += n.text; return Status();
      case Node::Kind::kOutput: {
        DS_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        *out_ += to_str(v);
        return Status();
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          bool take = true;
          if (cond) {
            DS_ASSIGN_OR_RETURN(Value c, eval(*cond));
            take = c.truthy();
          }
          if (take) return exec(body);
        }
        return Status();
      case Node::Kind::kFor: return exec_for(n);
      case Node::Kind::kSet: {
        DS_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        if (!n.attr.empty()) {
          Value target = lookup(n.targets[0]);
          if (!target.is_dict() || !target.is_namespace)
            return err_at(n.line, n.col, "cannot set attribute '" + n.attr + "' of '" + n.targets[0] + "' (only namespace() objects allow it)");
          target.set(n.attr, std::move(v));
          return Status();
        }
        return assign(n, n.targets, std::move(v));
      }
      case Node::Kind::kMacro: {
        const Node* node = &n;
        set_var(n.attr, Value::callable([this, node](ValueList& args, KwArgs& kwargs) { return call_macro(*node, args, kwargs); }));
        return Status();
      }
      case Node::Kind::kBreak: flow_ = Flow::kBreak; return Status();
      case Node::Kind::kContinue: flow_ = Flow::kContinue; return Status();
    }
    return Status();
  }

  Status assign(const Node& n, const std::vector<std::string>& targets, Value v) {
    if (targets.size() == 1) {
      set_var(targets[0], std::move(v));
      return Status();
    }
    if (!v.is_list() || v.list->size() != targets.size())
      return err_at(n.line, n.col, "cannot unpack " + std::string(v.type_name()) + " into " + std::to_string(targets.size()) + " names");
    for (size_t k = 0; k < targets.size(); ++k) set_var(targets[k], (*v.list)[k]);
    return Status();
  }

  Result<ValueList> iterate(const Value& v, int line, int col) {
    switch (v.kind) {
      case Value::Kind::kList: return *v.list;
      case Value::Kind::kUndefined: return ValueList{};
      case Value::Kind::kDict: {
        ValueList keys;
        for (const auto& kv : *v.dict) keys.push_back(Value::string(kv.first));
        return keys;
      }
      case Value::Kind::kString: {
        ValueList chars;
        auto off = cp_offsets(v.s);
        for (size_t k = 0; k + 1 < off.size(); ++k) chars.push_back(Value::string(v.s.substr(off[k], off[k + 1] - off[k])));
        return chars;
      }
      default: return err_at(line, col, std::string("cannot iterate over ") + v.type_name());
    }
  }

  Status exec_for(const Node& n) {
    DS_ASSIGN_OR_RETURN(Value seq, eval(*n.expr));
    DS_ASSIGN_OR_RETURN(ValueList items, iterate(seq, n.expr->line, n.expr->col));
    if (n.cond) {  // `for x in xs if cond`: filter first, so loop.* counts only kept items
      ValueList kept;
      for (auto& it : items) {
        frames_.emplace_back();
        Status st = assign(n, n.targets, it);
        Result<Value> c = st.ok() ? eval(*n.cond) : Result<Value>(st);
        frames_.pop_back();
        if (!c.ok()) return c.status();
        if (c->truthy()) kept.push_back(it);
      }
      items = std::move(kept);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      frames_.emplace_back();
      Value loop = Value::new_dict({{"index", Value::integer(k + 1)},
                                    {"index0", Value::integer(k)},
                                    {"revindex", Value::integer(len - k)},
                                    {"revindex0", Value::integer(len - k - 1)},
                                    {"first", Value::boolean(k == 0)},
                                    {"last", Value::boolean(k == len - 1)},
                                    {"length", Value::integer(len)},
                                    {"previtem", k > 0 ? items[k - 1] : Value::undefined("previtem")},
                                    {"nextitem", k + 1 < len ? items[k + 1] : Value::undefined("nextitem")}});
      set_var("loop", loop);
      Status st = assign(n, n.targets, items[k]);
      if (st.ok()) st = exec(n.body);
      frames_.pop_back();
      DS_RETURN_IF_ERROR(st);
      Flow f = flow_;
      flow_ = Flow::kNormal;
      if (f == Flow::kBreak) break;
    }
    if (len == 0) return exec(n.else_body);
    return Status();
  }

  Result<Value> call_macro(const Node& m, ValueList& args, KwArgs& kwargs) {
    if (args.size() > m.targets.size()) return err_at(m.line, m.col, "macro '" + m.attr + "' takes " + std::to_string(m.targets.size()) + " arguments");
    Frame local;
    for (size_t k = 0; k < m.targets.size(); ++k) {
      Value v = Value::undefined(m.targets[k]);
      if (k < args.size()) {
        v = args[k];
      } else if (m.defaults[k]) {
        DS_ASSIGN_OR_RETURN(v, eval(*m.defaults[k]));
      }
      local[m.targets[k]] = v;
    }
    for (auto& [name, v] : kwargs) {
      if (!local.count(name)) return err_at(m.line, m.col, "macro '" + m.attr + "' has no parameter '" + name + "'");
      local[name] = v;
    }
    // A macro sees the template's top-level names and its arguments, not the caller's locals.
    std::vector<Frame> saved;
    saved.swap(frames_);
    frames_.push_back(saved.front());
    frames_.push_back(std::move(local));
    std::string text, *saved_out = out_;
    out_ = &text;
    Status st = exec(m.body);
    flow_ = Flow::kNormal;
    out_ = saved_out;
    saved.front() = std::move(frames_.front());
    frames_.swap(saved);
    DS_RETURN_IF_ERROR(st);
    return Value::string(text);
  }

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::undefined(name);
  }

  Result<Value> eval(const Expr& e);
  Result<Value> eval_binary(const Expr& e);
  Result<Value> eval_call(const Expr& e);
  Result<Value> call_method(const Expr& e, Value& obj, const std::string& name, ValueList& args, KwArgs& kw);
  Result<Value> call_global(const Expr& e, const std::string& name, ValueList& args, KwArgs& kw, bool* found);
  Result<Value> apply_filter(const Expr& e, Value v, ValueList& args, KwArgs& kw);
  Result<bool> apply_test(const Expr& e, const Value& v, ValueList& args);
  Status eval_args(const Expr& e, size_t first, ValueList& args, KwArgs& kw) {
    size_t n_pos = e.a.size() - e.kw_names.size();
    for (size_t k = first; k < e.a.size(); ++k) {
      DS_ASSIGN_OR_RETURN(Value v, eval(*e.a[k]));
      if (k < n_pos) args.push_back(std::move(v));
      else kw.emplace_back(e.kw_names[k - n_pos], std::move(v));
    }
    return Status();
  }

  std::string* out_;
  std::vector<Frame> frames_;
  Flow flow_ = Flow::kNormal;
};

#include "tokenizer/template_builtins.inc"

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  DS_ASSIGN_OR_RETURN(Body body, parse_template(source));
  ChatTemplate t;
  t.body_ = std::make_shared<const Body>(std::move(body));
  return t;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) return invalid_argument("chat template context must be a JSON object");
  std::string out;
  Interp in(&out);
  for (auto it = context.begin(); it != context.end(); ++it) in.set_var(it.key(), Value::from_json(it.value()));
  DS_RETURN_IF_ERROR(in.exec(*body_));
  return out;
}

Result<std::string> ChatTemplate::render(const ChatRequest& req) const {
  if (!req.messages.is_array()) return invalid_argument("messages must be a JSON array");
  if (!req.kwargs.is_object()) return invalid_argument("chat template kwargs must be a JSON object");
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = req.messages;
  ctx["tools"] = req.tools;
  ctx["add_generation_prompt"] = req.add_generation_prompt;
  ctx["bos_token"] = req.bos_token;
  ctx["eos_token"] = req.eos_token;
  ctx["pad_token"] = req.pad_token;
  for (auto it = req.kwargs.begin(); it != req.kwargs.end(); ++it) ctx[it.key()] = it.value();
  return render(ctx);
}

}  // namespace ds::tok
