// JsonSchema: the subset of JSON Schema that constrained decoding (response_format json_schema)
// enforces, compiled from a request's schema into a tree of nodes the JsonAutomaton walks:
// "type" (a name or a list), "properties", "required", "additionalProperties" (a boolean),
// "items" (one schema), "enum" / "const" of strings, and the annotations "title",
// "description", "$schema", "default", "examples" and "strict", which constrain nothing. Any
// other keyword is an error naming it, so a schema is never silently half-enforced.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace ds::server {

struct JsonSchema {
  enum Type : uint8_t {
    kObject = 1, kArray = 2, kString = 4, kNumber = 8, kInteger = 16, kBoolean = 32, kNull = 64,
    kAnyType = 127,
  };
  struct Node {
    uint8_t types = kAnyType;              // JSON types the value may have
    std::vector<std::string> prop_names;   // declared keys, JSON-escaped (the bytes between the quotes)
    std::vector<int> prop_nodes;           // their value schemas (-1: any value)
    std::vector<uint8_t> prop_required;    // 1: the key must appear
    bool additional = true;                // keys beyond the declared ones are allowed
    int items = -1;                        // node of every array item (-1: any value)
    std::vector<std::string> enum_strings; // non-empty: the value is one of these strings, JSON-escaped
  };
  std::vector<Node> nodes;  // nodes[0] is the root

  // Errors name the keyword (and its path, e.g. "properties.a.items").
  static Result<std::shared_ptr<const JsonSchema>> compile(const nlohmann::json& schema);
};

}  // namespace ds::server
