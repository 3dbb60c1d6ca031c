// Parser for the chat-template language: splits source into text and tags, applies Jinja's
// whitespace rules (trim_blocks, lstrip_blocks, "-" markers), and builds the syntax tree.
#include <cstring>

#include "tokenizer/template_ast.h"

namespace ds::tok {
namespace {

struct Tok {
  enum class Kind { kName, kInt, kFloat, kString, kOp, kEnd };
  Kind kind;
  std::string text;
  int line, col;
};

struct Segment {
  enum class Kind { kText, kVar, kBlock, kComment };
  Kind kind;
  std::string text;        // kText
  std::vector<Tok> toks;   // kVar, kBlock (ends with kEnd)
  bool strip_left = false, strip_right = false, plus_left = false;
  int line, col;
};

Status error_at(int line, int col, const std::string& msg) {
  return invalid_argument("template line " + std::to_string(line) + " col " + std::to_string(col) + ": " + msg);
}

class Scanner {
 public:
  explicit Scanner(const std::string& s) : s_(s) {}

  Result<std::vector<Segment>> run() {
    std::vector<Segment> segs;
    while (pos_ < s_.size()) {
      size_t open = find_open(pos_);
      if (open > pos_) segs.push_back(text_seg(open));
      if (open >= s_.size()) break;
      Segment tag;
      tag.line = line_;
      tag.col = col_;
      char c = s_[open + 1];
      tag.kind = c == '{' ? Segment::Kind::kVar : c == '%' ? Segment::Kind::kBlock : Segment::Kind::kComment;
      advance(2);
      if (pos_ < s_.size() && s_[pos_] == '-') { tag.strip_left = true; advance(1); }
      else if (pos_ < s_.size() && s_[pos_] == '+') { tag.plus_left = true; advance(1); }
      if (tag.kind == Segment::Kind::kComment) {
        size_t end = s_.find("#}", pos_);
        if (end == std::string::npos) return error_at(tag.line, tag.col, "comment is never closed with #}");
        tag.strip_right = end > pos_ && s_[end - 1] == '-';
        advance(end + 2 - pos_);
      } else {
        DS_RETURN_IF_ERROR(lex_tag(tag));
      }
      segs.push_back(std::move(tag));
    }
    return segs;
  }

 private:
  size_t find_open(size_t from) const {
    for (size_t i = from; i + 1 < s_.size(); ++i)
      if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    return s_.size();
  }
  Segment text_seg(size_t end) {
    Segment t;
    t.kind = Segment::Kind::kText;
    t.line = line_;
    t.col = col_;
    t.text = s_.substr(pos_, end - pos_);
    advance(end - pos_);
    return t;
  }
  void advance(size_t n) {
    for (size_t k = 0; k < n && pos_ < s_.size(); ++k, ++pos_) {
      if (s_[pos_] == '\n') { ++line_; col_ = 1; }
      else if ((static_cast<unsigned char>(s_[pos_]) & 0xC0) != 0x80) { ++col_; }
    }
  }
  Status lex_tag(Segment& tag) {
    const char* close = tag.kind == Segment::Kind::kVar ? "}}" : "%}";
    for (;;) {
      while (pos_ < s_.size() && std::strchr(" \t\r\n", s_[pos_])) advance(1);
      if (pos_ >= s_.size()) return error_at(tag.line, tag.col, std::string("tag is never closed with ") + close);
      int l = line_, c = col_;
      if (s_.compare(pos_, 3, std::string("-") + close) == 0) {
        tag.strip_right = true;
        tag.toks.push_back({Tok::Kind::kEnd, "", l, c});
        advance(3);
        return Status();
      }
      if (s_.compare(pos_, 2, close) == 0) {
        tag.toks.push_back({Tok::Kind::kEnd, "", l, c});
        advance(2);
        return Status();
      }
      char ch = s_[pos_];
      if (std::isalpha(static_cast<unsigned char>(ch)) || ch == '_') {
        size_t b = pos_;
        while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) advance(1);
        tag.toks.push_back({Tok::Kind::kName, s_.substr(b, pos_ - b), l, c});
      } else if (std::isdigit(static_cast<unsigned char>(ch))) {
        size_t b = pos_;
        bool is_float = false;
        while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_' ||
                                    (s_[pos_] == '.' && !is_float && pos_ + 1 < s_.size() &&
                                     std::isdigit(static_cast<unsigned char>(s_[pos_ + 1]))))) {
          is_float |= s_[pos_] == '.';
          advance(1);
        }
        std::string num;
        for (char d : s_.substr(b, pos_ - b))
          if (d != '_') num += d;
        tag.toks.push_back({is_float ? Tok::Kind::kFloat : Tok::Kind::kInt, num, l, c});
      } else if (ch == '\'' || ch == '"') {
        std::string out;
        advance(1);
        while (true) {
          if (pos_ >= s_.size()) return error_at(l, c, "string literal is never closed");
          char d = s_[pos_];
          if (d == ch) { advance(1); break; }
          if (d == '\\' && pos_ + 1 < s_.size()) {
            char e = s_[pos_ + 1];
            const char* map = "n\nt\tr\r\\\\''\"\"0\0";
            const char* hit = nullptr;
            for (int k = 0; k < 14; k += 2)
              if (map[k] == e) hit = map + k + 1;
            if (hit) out += *hit;
            else { out += '\\'; out += e; }
            advance(2);
            continue;
          }
          out += d;
          advance(1);
        }
        tag.toks.push_back({Tok::Kind::kString, out, l, c});
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                    "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
        const char* hit = nullptr;
        for (const char* op : ops)
          if (s_.compare(pos_, std::strlen(op), op) == 0) { hit = op; break; }
        if (!hit) return error_at(l, c, std::string("unexpected character '") + ch + "'");
        tag.toks.push_back({Tok::Kind::kOp, hit, l, c});
        advance(std::strlen(hit));
      }
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
};

// Jinja whitespace control, with transformers' trim_blocks and lstrip_blocks.
void apply_whitespace(std::vector<Segment>& segs) {
  auto is_block = [](const Segment& s) { return s.kind == Segment::Kind::kBlock || s.kind == Segment::Kind::kComment; };
  for (size_t k = 0; k < segs.size(); ++k) {
    Segment& t = segs[k];
    if (t.kind == Segment::Kind::kText) continue;
    Segment* prev = k > 0 && segs[k - 1].kind == Segment::Kind::kText ? &segs[k - 1] : nullptr;
    Segment* next = k + 1 < segs.size() && segs[k + 1].kind == Segment::Kind::kText ? &segs[k + 1] : nullptr;
    if (prev && t.strip_left) {
      size_t e = prev->text.find_last_not_of(" \t\r\n\f\v");
      prev->text.erase(e == std::string::npos ? 0 : e + 1);
    } else if (prev && is_block(t) && !t.plus_left) {  // lstrip_blocks
      size_t nl = prev->text.rfind('\n');
      size_t from = nl == std::string::npos ? 0 : nl + 1;
      bool at_line_start = nl != std::string::npos || k == 1;
      if (at_line_start && prev->text.find_first_not_of(" \t", from) == std::string::npos) prev->text.erase(from);
    }
    if (next && t.strip_right) {
      size_t b = next->text.find_first_not_of(" \t\r\n\f\v");
      next->text.erase(0, b == std::string::npos ? next->text.size() : b);
    } else if (next && is_block(t) && !next->text.empty() && next->text[0] == '\n') {  // trim_blocks
      next->text.erase(0, 1);
    }
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  Result<Body> parse_all() {
    Body body;
    std::string end;
    DS_RETURN_IF_ERROR(parse_body(body, {}, &end));
    return body;
  }

 private:
  // Parses nodes until a block tag whose keyword is in `stops` (returned in *stop, tokens
  // positioned after the keyword) or the end of the template (*stop empty).
  Status parse_body(Body& body, const std::vector<std::string>& stops, std::string* stop) {
    while (seg_ < segs_.size()) {
      Segment& s = segs_[seg_];
      if (s.kind == Segment::Kind::kText) {
        if (!s.text.empty()) body.push_back(make_text(s));
        ++seg_;
        continue;
      }
      if (s.kind == Segment::Kind::kComment) { ++seg_; continue; }
      toks_ = &s.toks;
      ti_ = 0;
      if (s.kind == Segment::Kind::kVar) {
        auto n = node(Node::Kind::kOutput, s.line, s.col);
        DS_ASSIGN_OR_RETURN(n->expr, parse_expr());
        DS_RETURN_IF_ERROR(expect_end());
        body.push_back(n);
        ++seg_;
        continue;
      }
      const Tok& kw = peek();
      if (kw.kind != Tok::Kind::kName) return error_at(kw.line, kw.col, "expected a statement keyword");
      for (const auto& st : stops)
        if (kw.text == st) {
          *stop = st;
          ++ti_;
          return Status();
        }
      ++ti_;
      ++seg_;
      DS_RETURN_IF_ERROR(parse_statement(kw, body));
    }
    if (!stops.empty()) {
      const Tok& open = openers_.back();
      return error_at(open.line, open.col, "{% " + open.text + " %} is never closed with {% " + stops.back() + " %}");
    }
    stop->clear();
    return Status();
  }

  NodePtr make_text(const Segment& s) {
    auto n = node(Node::Kind::kText, s.line, s.col);
    n->text = s.text;
    return n;
  }
  static NodePtr node(Node::Kind k, int line, int col) {
    auto n = std::make_shared<Node>();
    n->kind = k;
    n->line = line;
    n->col = col;
    return n;
  }
  // After a closing keyword tag (endif, else, ...) nothing else may follow in the tag.
  Status finish_tag() {
    DS_RETURN_IF_ERROR(expect_end());
    ++seg_;
    return Status();
  }

  Status parse_statement(const Tok& kw, Body& body) {
    openers_.push_back(kw);
    Status st = parse_statement_inner(kw, body);
    openers_.pop_back();
    return st;
  }
  Status parse_statement_inner(const Tok& kw, Body& body) {
    const std::string& k = kw.text;
    if (k == "if") {
      auto n = node(Node::Kind::kIf, kw.line, kw.col);
      DS_ASSIGN_OR_RETURN(ExprPtr cond, parse_expr());
      DS_RETURN_IF_ERROR(expect_end());
      while (true) {
        Body b;
        std::string stop;
        DS_RETURN_IF_ERROR(parse_body(b, {"elif", "else", "endif"}, &stop));
        n->branches.emplace_back(cond, std::move(b));
        if (stop == "endif") { DS_RETURN_IF_ERROR(finish_tag()); break; }
        if (stop == "elif") {
          DS_ASSIGN_OR_RETURN(cond, parse_expr());
          DS_RETURN_IF_ERROR(finish_tag());
        } else {
          cond = nullptr;
          DS_RETURN_IF_ERROR(finish_tag());
          Body eb;
          DS_RETURN_IF_ERROR(parse_body(eb, {"endif"}, &stop));
          DS_RETURN_IF_ERROR(finish_tag());
          n->branches.emplace_back(nullptr, std::move(eb));
          break;
        }
      }
      body.push_back(n);
    } else if (k == "for") {
      auto n = node(Node::Kind::kFor, kw.line, kw.col);
      do {
        DS_ASSIGN_OR_RETURN(std::string name, expect_name());
        n->targets.push_back(name);
      } while (accept(","));
      if (!accept_name("in")) return err_here("expected 'in' in for loop");
      DS_ASSIGN_OR_RETURN(n->expr, parse_or(false));
      if (accept_name("if")) {
        DS_ASSIGN_OR_RETURN(n->cond, parse_or(false));
      }
      if (accept_name("recursive")) return error_at(kw.line, kw.col, "recursive for loops are not supported");
      DS_RETURN_IF_ERROR(expect_end());
      std::string stop;
      DS_RETURN_IF_ERROR(parse_body(n->body, {"else", "endfor"}, &stop));
      DS_RETURN_IF_ERROR(finish_tag());
      if (stop == "else") {
        DS_RETURN_IF_ERROR(parse_body(n->else_body, {"endfor"}, &stop));
        DS_RETURN_IF_ERROR(finish_tag());
      }
      body.push_back(n);
    } else if (k == "set") {
      auto n = node(Node::Kind::kSet, kw.line, kw.col);
      DS_ASSIGN_OR_RETURN(std::string name, expect_name());
      n->targets.push_back(name);
      if (accept(".")) {
        DS_ASSIGN_OR_RETURN(n->attr, expect_name());
      } else {
        while (accept(",")) {
          DS_ASSIGN_OR_RETURN(std::string more, expect_name());
          n->targets.push_back(more);
        }
      }
      if (!accept("=")) return error_at(kw.line, kw.col, "block-style {% set %}...{% endset %} is not supported; use {% set x = ... %}");
      DS_ASSIGN_OR_RETURN(n->expr, parse_expr());
      DS_RETURN_IF_ERROR(expect_end());
      body.push_back(n);
    } else if (k == "macro") {
      auto n = node(Node::Kind::kMacro, kw.line, kw.col);
      DS_ASSIGN_OR_RETURN(n->attr, expect_name());
      if (!accept("(")) return err_here("expected '(' after macro name");
      if (!accept(")")) {
        do {
          DS_ASSIGN_OR_RETURN(std::string p, expect_name());
          n->targets.push_back(p);
          ExprPtr def;
          if (accept("=")) {
            DS_ASSIGN_OR_RETURN(def, parse_expr());
          }
          n->defaults.push_back(def);
        } while (accept(","));
        if (!accept(")")) return err_here("expected ')' after macro parameters");
      }
      DS_RETURN_IF_ERROR(expect_end());
      std::string stop;
      DS_RETURN_IF_ERROR(parse_body(n->body, {"endmacro"}, &stop));
      DS_RETURN_IF_ERROR(finish_tag());
      body.push_back(n);
    } else if (k == "break" || k == "continue") {
      body.push_back(node(k == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, kw.line, kw.col));
      DS_RETURN_IF_ERROR(expect_end());
    } else if (k == "generation") {  // transformers' assistant-mask marker: renders its body as is
      DS_RETURN_IF_ERROR(expect_end());
      std::string stop;
      DS_RETURN_IF_ERROR(parse_body(body, {"endgeneration"}, &stop));
      DS_RETURN_IF_ERROR(finish_tag());
    } else {
      return error_at(kw.line, kw.col, "unsupported or unexpected tag '{% " + k + " %}'");
    }
    return Status();
  }

  // ---- expressions ----
  const Tok& peek(size_t k = 0) const { return (*toks_)[std::min(ti_ + k, toks_->size() - 1)]; }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).kind == Tok::Kind::kOp && peek(k).text == op; }
  bool accept(const char* op) {
    if (!is_op(op)) return false;
    ++ti_;
    return true;
  }
  bool accept_name(const char* name) {
    if (peek().kind != Tok::Kind::kName || peek().text != name) return false;
    ++ti_;
    return true;
  }
  Status err_here(const std::string& msg) const { return error_at(peek().line, peek().col, msg); }
  Status expect_end() const {
    if (peek().kind != Tok::Kind::kEnd) return err_here("unexpected '" + peek().text + "'");
    return Status();
  }
  Result<std::string> expect_name() {
    if (peek().kind != Tok::Kind::kName) return err_here("expected a name");
    return (*toks_)[ti_++].text;
  }
  ExprPtr mk(Expr::Kind k, const Tok& at, std::vector<ExprPtr> a = {}, std::string name = "") {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = at.line;
    e->col = at.col;
    e->a = std::move(a);
    e->name = std::move(name);
    return e;
  }

  Result<ExprPtr> parse_expr() {
    Tok at = peek();
    DS_ASSIGN_OR_RETURN(ExprPtr e, parse_or(true));
    if (accept_name("if")) {
      DS_ASSIGN_OR_RETURN(ExprPtr c, parse_or(true));
      ExprPtr other;
      if (accept_name("else")) {
        DS_ASSIGN_OR_RETURN(other, parse_expr());
      }
      return mk(Expr::Kind::kCond, at, {e, c, other});
    }
    return e;
  }
  // `allow_cond` is unused at this level but keeps for-loop iterables from eating `if`.
  Result<ExprPtr> parse_or(bool allow_cond) {
    DS_ASSIGN_OR_RETURN(ExprPtr l, parse_and());
    while (peek().kind == Tok::Kind::kName && peek().text == "or") {
      Tok at = (*toks_)[ti_++];
      DS_ASSIGN_OR_RETURN(ExprPtr r, parse_and());
      l = mk(Expr::Kind::kBinary, at, {l, r}, "or");
    }
    return l;
  }
  Result<ExprPtr> parse_and() {
    DS_ASSIGN_OR_RETURN(ExprPtr l, parse_not());
    while (peek().kind == Tok::Kind::kName && peek().text == "and") {
      Tok at = (*toks_)[ti_++];
      DS_ASSIGN_OR_RETURN(ExprPtr r, parse_not());
      l = mk(Expr::Kind::kBinary, at, {l, r}, "and");
    }
    return l;
  }
  Result<ExprPtr> parse_not() {
    if (peek().kind == Tok::Kind::kName && peek().text == "not") {
      Tok at = (*toks_)[ti_++];
      DS_ASSIGN_OR_RETURN(ExprPtr e, parse_not());
      return mk(Expr::Kind::kUnary, at, {e}, "not");
    }
    return parse_compare();
  }
  Result<ExprPtr> parse_compare() {
    DS_ASSIGN_OR_RETURN(ExprPtr l, parse_math1());
    while (true) {
      Tok at = peek();
      std::string op;
      if (at.kind == Tok::Kind::kOp && (at.text == "==" || at.text == "!=" || at.text == "<" || at.text == ">" ||
                                        at.text == "<=" || at.text == ">=")) {
        op = at.text;
        ++ti_;
      } else if (accept_name("in")) {
        op = "in";
      } else if (at.kind == Tok::Kind::kName && at.text == "not" && peek(1).kind == Tok::Kind::kName && peek(1).text == "in") {
        ti_ += 2;
        op = "not in";
      } else if (accept_name("is")) {
        bool neg = accept_name("not");
        DS_ASSIGN_OR_RETURN(std::string test, expect_name());
        auto e = mk(Expr::Kind::kTest, at, {l}, test);
        e->negated = neg;
        if (is_op("(")) {
          DS_RETURN_IF_ERROR(parse_args(*e));
        } else if (peek().kind == Tok::Kind::kInt || peek().kind == Tok::Kind::kString) {
          DS_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
          e->a.push_back(arg);
        }
        l = e;
        continue;
      } else {
        break;
      }
      DS_ASSIGN_OR_RETURN(ExprPtr r, parse_math1());
      l = mk(Expr::Kind::kBinary, at, {l, r}, op);
    }
    return l;
  }
  Result<ExprPtr> parse_math1() {
    DS_ASSIGN_OR_RETURN(ExprPtr l, parse_concat());
    while (is_op("+") || is_op("-")) {
      Tok at = (*toks_)[ti_++];
      DS_ASSIGN_OR_RETURN(ExprPtr r, parse_concat());
      l = mk(Expr::Kind::kBinary, at, {l, r}, at.text);
    }
    return l;
  }
  Result<ExprPtr> parse_concat() {
    DS_ASSIGN_OR_RETURN(ExprPtr l, parse_math2());
    while (is_op("~")) {
      Tok at = (*toks_)[ti_++];
      DS_ASSIGN_OR_RETURN(ExprPtr r, parse_math2());
      l = mk(Expr::Kind::kBinary, at, {l, r}, "~");
    }
    return l;
  }
  Result<ExprPtr> parse_math2() {
    DS_ASSIGN_OR_RETURN(ExprPtr l, parse_pow());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      Tok at = (*toks_)[ti_++];
      DS_ASSIGN_OR_RETURN(ExprPtr r, parse_pow());
      l = mk(Expr::Kind::kBinary, at, {l, r}, at.text);
    }
    return l;
  }
  Result<ExprPtr> parse_pow() {
    DS_ASSIGN_OR_RETURN(ExprPtr l, parse_unary());
    while (is_op("**")) {
      Tok at = (*toks_)[ti_++];
      DS_ASSIGN_OR_RETURN(ExprPtr r, parse_unary());
      l = mk(Expr::Kind::kBinary, at, {l, r}, "**");
    }
    return l;
  }
  Result<ExprPtr> parse_unary() {
    if (is_op("-") || is_op("+")) {
      Tok at = (*toks_)[ti_++];
      DS_ASSIGN_OR_RETURN(ExprPtr e, parse_unary());
      return mk(Expr::Kind::kUnary, at, {e}, at.text);
    }
    DS_ASSIGN_OR_RETURN(ExprPtr e, parse_primary());
    return parse_postfix(e);
  }
  Status parse_args(Expr& call) {  // at "("
    ++ti_;
    if (accept(")")) return Status();
    do {
      if (peek().kind == Tok::Kind::kName && is_op("=", 1)) {
        call.kw_names.push_back((*toks_)[ti_].text);
        ti_ += 2;
      } else if (!call.kw_names.empty()) {
        return err_here("positional argument after a keyword argument");
      }
      DS_ASSIGN_OR_RETURN(ExprPtr arg, parse_expr());
      call.a.push_back(arg);
    } while (accept(","));
    if (!accept(")")) return err_here("expected ')'");
    return Status();
  }
  Result<ExprPtr> parse_postfix(ExprPtr e) {
    while (true) {
      Tok at = peek();
      if (accept(".")) {
        DS_ASSIGN_OR_RETURN(std::string name, expect_name());
        e = mk(Expr::Kind::kAttr, at, {e}, name);
      } else if (is_op("[")) {
        ++ti_;
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) {
            DS_ASSIGN_OR_RETURN(parts[k], parse_expr());
          }
          if (k < 2 && accept(":")) { slice = true; continue; }
          break;
        }
        if (!accept("]")) return err_here("expected ']'");
        e = slice ? mk(Expr::Kind::kSlice, at, {e, parts[0], parts[1], parts[2]})
                  : mk(Expr::Kind::kIndex, at, {e, parts[0]});
        if (!slice && !parts[0]) return error_at(at.line, at.col, "empty subscript");
      } else if (is_op("(")) {
        auto c = mk(Expr::Kind::kCall, at, {e});
        DS_RETURN_IF_ERROR(parse_args(*c));
        e = c;
      } else if (is_op("|")) {
        ++ti_;
        Tok ft = peek();
        DS_ASSIGN_OR_RETURN(std::string name, expect_name());
        auto f = mk(Expr::Kind::kFilter, ft, {e}, name);
        if (is_op("(")) DS_RETURN_IF_ERROR(parse_args(*f));
        e = f;
      } else {
        return e;
      }
    }
  }
  Result<ExprPtr> parse_primary() {
    Tok t = peek();
    ++ti_;
    switch (t.kind) {
      case Tok::Kind::kInt: {
        auto e = mk(Expr::Kind::kLiteral, t);
        e->value = Value::integer(std::stoll(t.text));
        return e;
      }
      case Tok::Kind::kFloat: {
        auto e = mk(Expr::Kind::kLiteral, t);
        e->value = Value::floating(std::stod(t.text));
        return e;
      }
      case Tok::Kind::kString: {
        std::string s = t.text;
        while (peek().kind == Tok::Kind::kString) s += (*toks_)[ti_++].text;  // adjacent literals join
        auto e = mk(Expr::Kind::kLiteral, t);
        e->value = Value::string(s);
        return e;
      }
      case Tok::Kind::kName: {
        auto e = mk(Expr::Kind::kLiteral, t);
        if (t.text == "true" || t.text == "True") e->value = Value::boolean(true);
        else if (t.text == "false" || t.text == "False") e->value = Value::boolean(false);
        else if (t.text == "none" || t.text == "None") e->value = Value::none();
        else return mk(Expr::Kind::kName, t, {}, t.text);
        return e;
      }
      case Tok::Kind::kOp:
        if (t.text == "(") {
          DS_ASSIGN_OR_RETURN(ExprPtr e, parse_expr());
          if (is_op(",")) {  // a tuple: treated as a list
            auto l = mk(Expr::Kind::kList, t, {e});
            while (accept(",")) {
              if (is_op(")")) break;
              DS_ASSIGN_OR_RETURN(ExprPtr x, parse_expr());
              l->a.push_back(x);
            }
            e = l;
          }
          if (!accept(")")) return err_here("expected ')'");
          return e;
        }
        if (t.text == "[") {
          auto l = mk(Expr::Kind::kList, t);
          if (!accept("]")) {
            do {
              if (is_op("]")) break;
              DS_ASSIGN_OR_RETURN(ExprPtr x, parse_expr());
              l->a.push_back(x);
            } while (accept(","));
            if (!accept("]")) return err_here("expected ']'");
          }
          return l;
        }
        if (t.text == "{") {
          auto d = mk(Expr::Kind::kDict, t);
          if (!accept("}")) {
            do {
              if (is_op("}")) break;
              DS_ASSIGN_OR_RETURN(ExprPtr k, parse_expr());
              if (!accept(":")) return err_here("expected ':' in dict literal");
              DS_ASSIGN_OR_RETURN(ExprPtr v, parse_expr());
              d->a.push_back(k);
              d->a.push_back(v);
            } while (accept(","));
            if (!accept("}")) return err_here("expected '}'");
          }
          return d;
        }
        break;
      case Tok::Kind::kEnd:
        return error_at(t.line, t.col, "expression expected");
    }
    return error_at(t.line, t.col, "unexpected '" + t.text + "'");
  }

  std::vector<Segment> segs_;
  size_t seg_ = 0;
  const std::vector<Tok>* toks_ = nullptr;
  size_t ti_ = 0;
  std::vector<Tok> openers_;  // the tags whose bodies are being parsed, for "never closed" errors
};

}  // namespace

Result<Body> parse_template(const std::string& source) {
  Scanner sc(source);
  DS_ASSIGN_OR_RETURN(std::vector<Segment> segs, sc.run());
  apply_whitespace(segs);
  Parser p(std::move(segs));
  return p.parse_all();
}

}  // namespace ds::tok
