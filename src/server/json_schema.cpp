// JsonSchema::compile: one node per (sub)schema, depth first; unsupported keywords are errors.
#include "server/json_schema.h"

namespace ds::server {

namespace {

using json = nlohmann::json;

// The bytes a string has between the quotes once written as JSON.
std::string escaped(const std::string& s) {
  const std::string d = json(s).dump();
  return d.substr(1, d.size() - 2);
}

Result<uint8_t> type_bit(const json& name, const std::string& where) {
  static const std::pair<const char*, uint8_t> kNames[] = {
      {"object", JsonSchema::kObject}, {"array", JsonSchema::kArray},     {"string", JsonSchema::kString},
      {"number", JsonSchema::kNumber}, {"integer", JsonSchema::kInteger}, {"boolean", JsonSchema::kBoolean},
      {"null", JsonSchema::kNull}};
  if (name.is_string())
    for (const auto& [n, bit] : kNames)
      if (name.get<std::string>() == n) return bit;
  return invalid_argument(where + "type: " + name.dump() + " is not a JSON Schema type name");
}

class Compiler {
 public:
  explicit Compiler(JsonSchema& out) : out_(out) {}

  // Adds the node of `s` (and its children); returns its index.
  Result<int> node(const json& s, const std::string& where) {
    if (!s.is_object()) return invalid_argument(where + "a schema must be an object, got " + s.dump());
    if (++depth_ > 32) return invalid_argument(where + "the schema nests deeper than 32 levels");
    const int index = static_cast<int>(out_.nodes.size());
    out_.nodes.emplace_back();
    JsonSchema::Node n;
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      const json& v = it.value();
      if (k == "title" || k == "description" || k == "$schema" || k == "default" || k == "examples" || k == "strict")
        continue;
      if (k == "type") {
        n.types = 0;
        if (v.is_array()) {
          for (const json& t : v) {
            DS_ASSIGN_OR_RETURN(uint8_t bit, type_bit(t, where));
            n.types |= bit;
          }
        } else {
          DS_ASSIGN_OR_RETURN(uint8_t bit, type_bit(v, where));
          n.types = bit;
        }
        if (n.types == 0) return invalid_argument(where + "type: an empty list allows no value");
      } else if (k == "properties") {
        if (!v.is_object()) return invalid_argument(where + "properties must be an object");
        for (auto p = v.begin(); p != v.end(); ++p) {
          DS_ASSIGN_OR_RETURN(int child, node(p.value(), where + "properties." + p.key() + "."));
          n.prop_names.push_back(escaped(p.key()));
          n.prop_nodes.push_back(child);
          n.prop_required.push_back(0);
        }
      } else if (k == "additionalProperties") {
        if (!v.is_boolean()) return invalid_argument(where + "additionalProperties: only true or false is enforced");
        n.additional = v.get<bool>();
      } else if (k == "items") {
        DS_ASSIGN_OR_RETURN(n.items, node(v, where + "items."));
      } else if (k == "enum" || k == "const") {
        const json values = k == "const" ? json::array({v}) : v;
        if (!values.is_array() || values.empty()) return invalid_argument(where + "enum must be a non-empty list");
        for (const json& e : values) {
          if (!e.is_string()) return invalid_argument(where + k + ": only string values are enforced, got " + e.dump());
          n.enum_strings.push_back(escaped(e.get<std::string>()));
        }
      } else if (k != "required") {
        return invalid_argument(where + "the keyword '" + k + "' is not enforced by this server");
      }
    }
    if (s.contains("required")) {  // after "properties", whatever the key order
      const json& req = s["required"];
      if (!req.is_array()) return invalid_argument(where + "required must be a list of property names");
      for (const json& r : req) {
        if (!r.is_string()) return invalid_argument(where + "required: " + r.dump() + " is not a property name");
        const std::string name = escaped(r.get<std::string>());
        size_t i = 0;
        while (i < n.prop_names.size() && n.prop_names[i] != name) ++i;
        if (i == n.prop_names.size()) {  // required but not described: any value
          n.prop_names.push_back(name);
          n.prop_nodes.push_back(-1);
          n.prop_required.push_back(0);
        }
        n.prop_required[i] = 1;
      }
    }
    if (!n.enum_strings.empty()) n.types &= JsonSchema::kString;
    if (n.types == 0) return invalid_argument(where + "enum/const strings contradict the schema's type");
    if (n.prop_names.size() > 256) return invalid_argument(where + "more than 256 properties");
    out_.nodes[index] = std::move(n);
    --depth_;
    return index;
  }

 private:
  JsonSchema& out_;
  int depth_ = 0;
};

}  // namespace

Result<std::shared_ptr<const JsonSchema>> JsonSchema::compile(const json& schema) {
  auto out = std::make_shared<JsonSchema>();
  Compiler c(*out);
  DS_ASSIGN_OR_RETURN(int root, c.node(schema, ""));
  (void)root;  // 0
  return std::shared_ptr<const JsonSchema>(std::move(out));
}

}  // namespace ds::server
