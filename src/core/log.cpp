// Logging and fatal-error reporting; both write to stderr only.
#include "core/log.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/check.h"

namespace ds {
namespace {
LogLevel threshold() {
  static const LogLevel level = [] {
    const char* env = std::getenv("DS_LOG_LEVEL");  // env: DS_LOG_LEVEL
    if (!env) return LogLevel::kInfo;
    if (!std::strcmp(env, "debug")) return LogLevel::kDebug;
    if (!std::strcmp(env, "warn")) return LogLevel::kWarn;
    if (!std::strcmp(env, "error")) return LogLevel::kError;
    return LogLevel::kInfo;
  }();
  return level;
}
std::mutex g_log_mutex;
}  // namespace

bool log_enabled(LogLevel level) { return level >= threshold(); }

void log_message(LogLevel level, const char* component, const char* fmt, ...) {
  if (!log_enabled(level)) return;
  static const char* kNames[] = {"DBG", "INF", "WRN", "ERR"};
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::fprintf(stderr, "%s %s: ", kNames[static_cast<int>(level)], component);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
}

namespace {
[[noreturn]] void vfatal(const char* fmt, va_list ap) {
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}
}  // namespace

void fatal_at(const char* file, int line, const char* func, const char* fmt, ...) {
  std::fprintf(stderr, "FATAL %s %s:%d: ", func, file, line);
  va_list ap;
  va_start(ap, fmt);
  vfatal(fmt, ap);
}

void fatal_assert(const char* file, int line, const char* func, const char* cond, const char* fmt, ...) {
  std::fprintf(stderr, "FATAL %s %s:%d: assertion `%s` failed: ", func, file, line, cond);
  va_list ap;
  va_start(ap, fmt);
  vfatal(fmt, ap);
}

}  // namespace ds
