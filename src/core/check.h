// Programmer-error checks (tier 1 of DESIGN.md §5): always on, print func file:line and abort.
// Expected failures (bad files, bad requests) use Status/Result instead (status.h).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace ds {
[[noreturn]] void fatal_at(const char* file, int line, const char* func, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
// The condition text is printed as it is (it may contain '%'); fmt may be empty.
[[noreturn]] void fatal_assert(const char* file, int line, const char* func, const char* cond, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
}  // namespace ds

#define DS_FATAL(...) ::ds::fatal_at(__FILE__, __LINE__, __func__, __VA_ARGS__)
#define DS_ASSERT(cond, ...)                                               \
  do {                                                                     \
    if (!(cond)) ::ds::fatal_assert(__FILE__, __LINE__, __func__, #cond, "" __VA_ARGS__); \
  } while (0)
