// IDX files (io/idx.h): a well-formed gzipped file round-trips; foreign, truncated and missing
// files are errors that name the file and the reason.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/idx.h"

namespace kiln {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("kiln_idx_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

std::vector<uint8_t> idx_images(int n, int rows, int cols, int drop = 0) {
  std::vector<uint8_t> b = {0, 0, 0x08, 3};
  for (int v : {n, rows, cols}) b.insert(b.end(), {0, 0, static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)});
  for (int i = 0; i < n * rows * cols - drop; ++i) b.push_back(static_cast<uint8_t>(i * 7));
  return b;
}

std::string error_of(const std::string& path) {
  try {
    io::read_idx(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Idx, ReadsAGzippedImageFile) {
  const std::string path = temp_path("ok.gz");
  write_gz(path, idx_images(2, 3, 4));
  Tensor t = io::read_idx(path);
  EXPECT_EQ(t.dtype(), DType::kUInt8);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(t.data<uint8_t>()[5], static_cast<uint8_t>(35));
  std::filesystem::remove(path);
}

TEST(Idx, BadInputsAreErrorsNamingTheFile) {
  const std::string truncated = temp_path("short.gz"), foreign = temp_path("foreign.gz"), header = temp_path("header.gz");
  write_gz(truncated, idx_images(2, 3, 4, /*drop=*/5));
  write_gz(foreign, {'P', 'K', 3, 4, 0, 0, 0, 1});
  write_gz(header, {0, 0, 0x08, 3, 0, 0});
  EXPECT_NE(error_of(truncated).find("truncated"), std::string::npos) << error_of(truncated);
  EXPECT_NE(error_of(truncated).find(truncated), std::string::npos);
  EXPECT_NE(error_of(foreign).find("not an IDX file"), std::string::npos) << error_of(foreign);
  EXPECT_NE(error_of(header).find("truncated"), std::string::npos) << error_of(header);
  EXPECT_NE(error_of(temp_path("missing.gz")).find("no such file"), std::string::npos);
  EXPECT_THROW(io::load_fashion_mnist("validation"), Error);
  for (const std::string& p : {truncated, foreign, header}) std::filesystem::remove(p);
}

}  // namespace
}  // namespace kiln
