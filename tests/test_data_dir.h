// Test helper: where the committed test data is: tests/data (DS_TEST_DATA_DIR, set by the build),
// or env DS_TEST_DATA_DIR for tests run from another checkout's build.
#pragma once

#include <cstdlib>
#include <string>

namespace ds::test {

inline std::string test_data_dir() {
  const char* env = std::getenv("DS_TEST_DATA_DIR");
  return env ? env : DS_TEST_DATA_DIR;
}

}  // namespace ds::test
