// Helpers shared by the subcommands: failing with a message, parsing --ids lists.
#include <climits>
#include <cstdio>

#include "cli/commands.h"

namespace ds {

void cli_fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  throw CLI::RuntimeError(1);
}

std::vector<int32_t> cli_parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  for (size_t pos = 0;;) {
    const size_t end = text.find(',', pos);
    const std::string tok = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(tok, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != tok.size() || v < 0 || v > INT32_MAX)
      cli_fail("--ids: '" + tok + "' is not a non-negative integer (expected e.g. --ids 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return ids;
}

}  // namespace ds
