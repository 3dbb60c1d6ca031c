// Values of the chat-template interpreter (a Jinja subset): undefined, none, bool, int, float,
// string, list, ordered dict (also namespaces) and callables, with Python's str()/repr() and
// json.dumps(ensure_ascii=False) formatting, since Hugging Face renders templates in Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace ds::tok {

struct Value;
using ValueList = std::vector<Value>;
using ValueDict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, like Python
using KwArgs = std::vector<std::pair<std::string, Value>>;
using NativeFn = std::function<Result<Value>(ValueList& args, KwArgs& kwargs)>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                     // string value; for undefined, the name that was missing
  std::shared_ptr<ValueList> list;   // shared: lists and dicts are reference types, as in Python
  std::shared_ptr<ValueDict> dict;
  std::shared_ptr<NativeFn> fn;
  bool is_namespace = false;         // a namespace() object: attributes may be assigned

  static Value undefined(std::string name = "") { Value v; v.s = std::move(name); return v; }
  static Value none() { Value v; v.kind = Kind::kNone; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::kBool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::kInt; v.i = x; return v; }
  static Value floating(double x) { Value v; v.kind = Kind::kFloat; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::kString; v.s = std::move(x); return v; }
  static Value new_list(ValueList x = {}) { Value v; v.kind = Kind::kList; v.list = std::make_shared<ValueList>(std::move(x)); return v; }
  static Value new_dict(ValueDict x = {}) { Value v; v.kind = Kind::kDict; v.dict = std::make_shared<ValueDict>(std::move(x)); return v; }
  static Value callable(NativeFn f) { Value v; v.kind = Kind::kCallable; v.fn = std::make_shared<NativeFn>(std::move(f)); return v; }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }

  // Dict lookup; nullptr when absent (or not a dict).
  const Value* get(const std::string& key) const;
  void set(const std::string& key, Value v);
  bool truthy() const;
  const char* type_name() const;
};

// Python str(v) (what {{ v }} prints); undefined prints as "".
std::string to_str(const Value& v);
// Python repr(v).
std::string to_repr(const Value& v);
// json.dumps(v, ensure_ascii=False, indent=indent) as transformers' tojson filter does; indent<0: none.
Result<std::string> to_json(const Value& v, int indent = -1);
// Python ==.
bool equals(const Value& a, const Value& b);
// Python repr of a float (shortest round-trip digits, "1.0", "1e-05", "1e+16").
std::string python_float(double d);

}  // namespace ds::tok
