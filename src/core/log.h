// Logging to stderr (stdout carries only command results). Level from env DS_LOG_LEVEL
// (debug, info, warn, error; default info).
#pragma once

namespace ds {
enum class LogLevel { kDebug = 0, kInfo, kWarn, kError };
void log_message(LogLevel level, const char* component, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
bool log_enabled(LogLevel level);
}  // namespace ds

#define DS_LOG_DEBUG(comp, ...) ::ds::log_message(::ds::LogLevel::kDebug, comp, __VA_ARGS__)
#define DS_LOG_INFO(comp, ...) ::ds::log_message(::ds::LogLevel::kInfo, comp, __VA_ARGS__)
#define DS_LOG_WARN(comp, ...) ::ds::log_message(::ds::LogLevel::kWarn, comp, __VA_ARGS__)
#define DS_LOG_ERROR(comp, ...) ::ds::log_message(::ds::LogLevel::kError, comp, __VA_ARGS__)
