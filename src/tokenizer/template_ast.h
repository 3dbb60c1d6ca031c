// Syntax tree of the chat-template language (a Jinja subset) and its parser. Every node keeps
// the line and column it came from so runtime errors can point at the template source.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/template_value.h"

namespace ds::tok {

struct Expr;
using ExprPtr = std::shared_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kAttr,     // a[0].name
    kIndex,    // a[0][a[1]]
    kSlice,    // a[0][a[1]:a[2]:a[3]] (null parts allowed)
    kCall,     // a[0](a[1..]) with kw_names for the trailing keyword args
    kFilter,   // a[0] | name(a[1..])
    kTest,     // a[0] is [not] name(a[1..])
    kUnary,    // op a[0]  (not, -, +)
    kBinary,   // a[0] op a[1]
    kCond,     // a[0] if a[1] else a[2] (a[2] may be null)
    kList,     // [a...]
    kDict,     // {a[0]: a[1], ...}
  };
  Kind kind;
  int line = 0, col = 0;
  std::string name;  // name, attribute, filter/test, or operator
  bool negated = false;
  Value value;
  std::vector<ExprPtr> a;
  std::vector<std::string> kw_names;  // kCall/kFilter/kTest: names of the last kw_names.size() args
};

struct Node;
using NodePtr = std::shared_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kMacro, kBreak, kContinue };
  Kind kind;
  int line = 0, col = 0;
  std::string text;                                 // kText
  ExprPtr expr;                                     // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: condition (null for else) and body
  std::vector<std::string> targets;                 // kFor / kSet names; kMacro: parameter names
  std::string attr;                                 // kSet: ns.attr target; kMacro: macro name
  ExprPtr cond;                                     // kFor: the `if` filter
  Body body, else_body;                             // kFor, kMacro
  std::vector<ExprPtr> defaults;                    // kMacro: default per parameter (or null)
};

// Parses template source with Jinja's trim_blocks and lstrip_blocks on (as transformers does).
// Errors name the line and column.
Result<Body> parse_template(const std::string& source);

}  // namespace ds::tok
