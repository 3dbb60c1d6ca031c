// safetensors parsing: valid files, every class of malformed header, and the fuzz corpus as a
// regression set (this test is built with AddressSanitizer: an out-of-bounds read fails it).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "io/safetensors.h"
#include "unit/st_writer.h"

namespace ds {
namespace {

using test::make_safetensors;
using test::StEntry;

Result<std::unique_ptr<SafetensorsFile>> parse(const std::string& bytes) {
  return SafetensorsFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem.safetensors");
}

std::string error_of(const std::string& bytes) {
  auto r = parse(bytes);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.status().message();
}

TEST(Safetensors, ParsesValidFile) {
  std::vector<uint8_t> a(2 * 3 * 2), b(4);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i);
  std::memcpy(b.data(), "\x00\x00\x80\x3f", 4);  // 1.0f
  const std::string bytes =
      make_safetensors({{"a", "BF16", {2, 3}, a}, {"b", "F32", {1}, b}, {"empty", "F32", {0, 4}, {}}});
  auto r = parse(bytes);  // the file views `bytes`, which must outlive it
  ASSERT_TRUE(r.ok()) << r.status().message();
  const SafetensorsFile& f = *r.value();
  ASSERT_NE(f.find("a"), nullptr);
  EXPECT_EQ(f.find("a")->dtype, DType::kBF16);
  EXPECT_EQ(f.find("a")->shape, (std::vector<int64_t>{2, 3}));
  float one;
  std::memcpy(&one, f.data(*f.find("b")), 4);
  EXPECT_EQ(one, 1.0f);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, RejectsMalformedFiles) {
  const std::vector<uint8_t> four(4, 0);
  EXPECT_NE(error_of("abc").find("shorter than the 8-byte header length"), std::string::npos);
  std::string good = make_safetensors({{"x", "F32", {1}, four}});
  EXPECT_NE(error_of(good.substr(0, good.size() - 2)).find("truncated"), std::string::npos);
  EXPECT_NE(error_of(good.substr(0, 12)).find("runs past the end"), std::string::npos);
  std::string huge = good;
  huge[7] = 0x7f;
  EXPECT_NE(error_of(huge).find("exceeds 100 MB"), std::string::npos);
  EXPECT_NE(error_of(make_safetensors({}, "{not json")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(make_safetensors({}, "[1,2]")).find("not a JSON object"), std::string::npos);
  auto with = [&](const std::string& entry) { return make_safetensors({}, "{\"x\":" + entry + "}") + "AAAAAAAA"; };
  EXPECT_NE(error_of(with("{\"dtype\":\"Q9\",\"shape\":[1],\"data_offsets\":[0,4]}")).find("unknown dtype 'Q9'"),
            std::string::npos);
  EXPECT_NE(error_of(with("{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}")).find("non-negative"),
            std::string::npos);
  EXPECT_NE(error_of(with("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}")).find("needs 8"),
            std::string::npos);
  EXPECT_NE(error_of(with("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}")).find("begin > end"),
            std::string::npos);
  EXPECT_NE(error_of(with("{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}")).find("truncated"),
            std::string::npos);
  EXPECT_NE(error_of(with("{\"dtype\":\"F32\",\"shape\":[1]}")).find("data_offsets"), std::string::npos);
  EXPECT_NE(error_of(with("{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}"))
                .find("absurd shape"),
            std::string::npos);
  std::string overlap = make_safetensors(
      {}, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}");
  EXPECT_NE(error_of(overlap + "AAAAAAAA").find("overlap"), std::string::npos);
  EXPECT_NE(error_of(make_safetensors({}, "{\"__metadata__\":{\"k\":1}}")).find("not a string"), std::string::npos);
}

TEST(Safetensors, OpenNamesTheFile) {
  auto r = SafetensorsFile::open("/nonexistent/dir/model.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/dir/model.safetensors"), std::string::npos);
}

TEST(Safetensors, FuzzCorpusNeverCrashes) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(DS_TEST_DATA_DIR) / "fuzz" / "safetensors";
  int n = 0, accepted = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string bytes = test::read_file(e.path());
    // A heap copy of exactly the file's size, so a read past the end trips AddressSanitizer.
    std::unique_ptr<uint8_t[]> exact(new uint8_t[bytes.size() + (bytes.empty() ? 1 : 0)]);
    std::memcpy(exact.get(), bytes.data(), bytes.size());
    auto r = SafetensorsFile::parse(exact.get(), bytes.size(), e.path().filename().string());
    if (r.ok()) {
      ++accepted;
      for (const auto& [name, info] : r.value()->tensors()) {  // every accepted range is readable
        const uint8_t* p = static_cast<const uint8_t*>(r.value()->data(info));
        volatile uint8_t sink = 0;
        for (uint64_t i = 0; i < info.end - info.begin; ++i) sink = sink ^ p[i];
      }
    }
    ++n;
  }
  EXPECT_GE(n, 20) << "fuzz corpus missing from " << dir;
  RecordProperty("corpus_files", n);
  RecordProperty("accepted", accepted);
}

}  // namespace
}  // namespace ds
