// IDX files (io/idx.h): a well-formed gzipped file round-trips; foreign, truncated and missing
// files are errors that name the file and the reason.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
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

void write_plain(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> gzipped(const std::vector<uint8_t>& bytes) {
  const std::string path = temp_path("gzipped.gz");
  write_gz(path, bytes);
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  return out;
}

TEST(Idx, ReadsAPlainFile) {
  const std::string path = temp_path("plain");
  write_plain(path, {0, 0, 0x08, 1, 0, 0, 0, 3, 7, 8, 9});
  Tensor t = io::read_idx(path);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{3}));
  EXPECT_EQ(t.data<uint8_t>()[2], 9);
  std::filesystem::remove(path);
}

TEST(Idx, CorruptAndCutGzipStreamsAreErrors) {
  std::vector<uint8_t> gz = gzipped(idx_images(4, 8, 8));
  ASSERT_GT(gz.size(), 30u);
  // The deflate data overwritten (the 10-byte gzip header kept), and the stream cut in half.
  std::vector<uint8_t> corrupt = gz;
  for (size_t i = 10; i < corrupt.size(); ++i) corrupt[i] = 0xff;
  const std::vector<uint8_t> cut(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2));
  const std::string corrupt_path = temp_path("corrupt.gz"), cut_path = temp_path("cut.gz");
  write_plain(corrupt_path, corrupt);
  write_plain(cut_path, cut);
  const std::string corrupt_error = error_of(corrupt_path), cut_error = error_of(cut_path);
  EXPECT_NE(corrupt_error.find(corrupt_path), std::string::npos) << corrupt_error;
  EXPECT_NE(corrupt_error.find("corrupt"), std::string::npos) << corrupt_error;
  EXPECT_NE(cut_error.find(cut_path), std::string::npos) << cut_error;
  EXPECT_TRUE(cut_error.find("corrupt") != std::string::npos || cut_error.find("truncated") != std::string::npos) << cut_error;
  for (const std::string& p : {corrupt_path, cut_path}) std::filesystem::remove(p);
}

TEST(Idx, OtherTypesAndRanksAreErrors) {
  const std::string floats = temp_path("floats"), rank0 = temp_path("rank0");
  write_plain(floats, {0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0});
  write_plain(rank0, {0, 0, 0x08, 0});
  EXPECT_NE(error_of(floats).find("IDX type 0x0d"), std::string::npos) << error_of(floats);
  EXPECT_NE(error_of(rank0).find("declares 0 dimensions"), std::string::npos) << error_of(rank0);
  for (const std::string& p : {floats, rank0}) std::filesystem::remove(p);
}

// A Fashion-MNIST folder of 3 images (2 x 2) in Debian's file names.
struct TinyDataset {
  std::string dir = temp_path("fashion");
  explicit TinyDataset(int labels) {
    std::filesystem::create_directories(dir);
    write_gz(dir + "/t10k-images-idx3-ubyte.gz", idx_images(3, 2, 2));
    std::vector<uint8_t> l = {0, 0, 0x08, 1, 0, 0, 0, static_cast<uint8_t>(labels)};
    for (int i = 0; i < labels; ++i) l.push_back(static_cast<uint8_t>(i));
    write_gz(dir + "/t10k-labels-idx1-ubyte.gz", l);
  }
  ~TinyDataset() { std::filesystem::remove_all(dir); }
};

TEST(Idx, LoadsADatasetFolderAndNormalizes) {
  TinyDataset data(3);
  io::LabeledImages test = io::load_fashion_mnist("test", data.dir);
  EXPECT_EQ(test.images.shape(), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(test.labels.shape(), (std::vector<int64_t>{3}));
  Tensor x = io::fashion_mnist_input(test, 1, 3);
  EXPECT_EQ(x.shape(), (std::vector<int64_t>{2, 1, 2, 2}));
  // Image 1 starts at byte 4: 4 * 7 = 28.
  EXPECT_FLOAT_EQ(x.data<float>()[0], (28.f / 255.f - io::kFashionMnistMean) / io::kFashionMnistStd);
}

TEST(Idx, DatasetErrorsNameTheCause) {
  TinyDataset mismatched(2);
  try {
    io::load_fashion_mnist("test", mismatched.dir);
    ADD_FAILURE() << "3 images and 2 labels were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 images but 2 labels"), std::string::npos) << e.what();
  }
  try {
    io::load_fashion_mnist("train", mismatched.dir);  // only the test split is there
    ADD_FAILURE() << "a missing split was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train-images-idx3-ubyte.gz is missing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
