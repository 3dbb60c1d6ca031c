// PCRE2-backed regex splitting for the pre-tokenizer. Match data is kept per thread so encode
// can run concurrently from several HTTP threads.
#include "tokenizer/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace ds::tok {
namespace {

struct MatchData {
  pcre2_match_data* md = nullptr;
  ~MatchData() {
    if (md) pcre2_match_data_free(md);
  }
};

}  // namespace

Result<std::shared_ptr<RegexSplit>> RegexSplit::compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  // UCP makes \s, \w, \d and case folding Unicode-aware, as in Rust's regex crate (used by HF).
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return invalid_argument("pre_tokenizer Split regex does not compile at offset " + std::to_string(offset) +
                            ": " + reinterpret_cast<const char*>(msg) + " (pattern: " + pattern + ")");
  }
  std::shared_ptr<RegexSplit> r(new RegexSplit());
  r->code_ = code;
  r->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

RegexSplit::~RegexSplit() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void RegexSplit::split(std::string_view text, std::vector<std::string_view>& out) const {
  thread_local MatchData tl;
  if (!tl.md) tl.md = pcre2_match_data_create(4, nullptr);
  auto* code = static_cast<pcre2_code*>(code_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, gap_start = 0;
  while (pos < text.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, tl.md, nullptr)
                  : pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, tl.md, nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tl.md);
    size_t b = ov[0], e = ov[1];
    if (e == b) {  // empty match: step one code point, as Rust's find_iter does
      size_t step = 1;
      while (b + step < text.size() && (static_cast<unsigned char>(text[b + step]) & 0xC0) == 0x80) ++step;
      pos = b + step;
      continue;
    }
    if (b > gap_start) out.push_back(text.substr(gap_start, b - gap_start));
    out.push_back(text.substr(b, e - b));
    pos = gap_start = e;
  }
  if (gap_start < text.size()) out.push_back(text.substr(gap_start));
}

}  // namespace ds::tok
