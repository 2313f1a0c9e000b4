// The .npy reader and writer: round trips, a file written by NumPy, and bad files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "io/npy.h"

namespace kiln {
namespace {

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// np.save(f, np.arange(6, dtype='<f4').reshape(2, 3)) with NumPy 2.x.
const char kNumpyF32[] =
    "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73652c202773686170"
    "65273a2028322c2033292c207d20202020202020202020202020202020202020202020202020202020202020202020202020202020202020"
    "2020202020202020202020202020200a000000000000803f0000004000004040000080400000a040";

TEST(Npy, ReadsAFileWrittenByNumpy) {
  Tensor t = io::parse_npy(from_hex(kNumpyF32), "numpy.npy");
  ASSERT_EQ(t.dtype(), DType::kFloat32);
  ASSERT_EQ(t.shape(), (std::vector<int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data<float>()[i], static_cast<float>(i));
}

template <class T>
void expect_round_trip(std::vector<int64_t> shape, std::vector<T> values) {
  Tensor t = Tensor::from_vector<T>(shape, values);
  std::string bytes = io::to_npy(t);
  // NumPy needs the data to start at a multiple of 64 bytes (format 1.0 header alignment).
  size_t header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_EQ(bytes[10 + header_len - 1], '\n');
  Tensor back = io::parse_npy(bytes, "x.npy");
  ASSERT_EQ(back.dtype(), t.dtype());
  ASSERT_EQ(back.shape(), t.shape());
  ASSERT_EQ(back.nbytes(), t.nbytes());
  if (t.nbytes()) EXPECT_EQ(std::memcmp(back.raw(), t.raw(), t.nbytes()), 0);
}

TEST(Npy, RoundTripsEveryDtype) {
  expect_round_trip<float>({2, 2}, {1.5f, -2.0f, 3.25f, 1e-30f});
  expect_round_trip<double>({3}, {1.0, -2.5, 1e300});
  expect_round_trip<int64_t>({1, 1, 2}, {INT64_MIN, INT64_MAX});
  expect_round_trip<int32_t>({}, {-7});
  expect_round_trip<int16_t>({2}, {-300, 300});
  expect_round_trip<int8_t>({2}, {-128, 127});
  expect_round_trip<uint8_t>({0, 5}, {});
  expect_round_trip<uint16_t>({1}, {65535});
  expect_round_trip<uint32_t>({1}, {4000000000u});
  expect_round_trip<uint64_t>({1}, {UINT64_MAX});
  expect_round_trip<bool>({3}, {true, false, true});
  Tensor h(DType::kFloat16, {2});
  static_cast<uint16_t*>(h.raw())[0] = float_to_half(0.5f);
  static_cast<uint16_t*>(h.raw())[1] = float_to_half(-1.0f);
  Tensor back = io::parse_npy(io::to_npy(h), "h.npy");
  ASSERT_EQ(back.dtype(), DType::kFloat16);
  EXPECT_EQ(back.value_as_double(0), 0.5);
  EXPECT_EQ(back.value_as_double(1), -1.0);
}

TEST(Npy, HeaderTextMatchesNumpy) {
  std::string bytes = io::to_npy(Tensor::from_vector<int64_t>({3}, {1, 2, 3}));
  EXPECT_NE(bytes.find("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }"), std::string::npos);
  bytes = io::to_npy(Tensor::scalar<bool>(true));
  EXPECT_NE(bytes.find("{'descr': '|b1', 'fortran_order': False, 'shape': (), }"), std::string::npos);
}

TEST(Npy, FilesRoundTripThroughDisk) {
  std::string path = (std::filesystem::temp_directory_path() / "kiln_npy_test.npy").string();
  Tensor t = Tensor::from_vector<float>({2, 1}, {4.0f, -4.0f});
  io::write_npy(path, t);
  Tensor back = io::read_npy(path);
  EXPECT_EQ(back.shape(), t.shape());
  EXPECT_EQ(back.data<float>()[1], -4.0f);
  std::filesystem::remove(path);
}

// The error for `bytes` must be a kiln::Error of `kind` whose message contains `words`.
void expect_error(const std::string& bytes, ErrorKind kind, const std::string& words) {
  try {
    io::parse_npy(bytes, "bad.npy");
    ADD_FAILURE() << "no error for a file that should fail with: " << words;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.npy"), std::string::npos) << "the message names the file: " << e.what();
  }
}

std::string with_header(const std::string& header, const std::string& data) {
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + data;
}

TEST(Npy, RejectsBadFilesWithClearErrors) {
  std::string good = from_hex(kNumpyF32);
  expect_error("", ErrorKind::kInvalidArgument, "magic");
  expect_error("PK\x03\x04 this is a zip", ErrorKind::kInvalidArgument, "magic");
  expect_error(good.substr(0, 9), ErrorKind::kInvalidArgument, "truncated header");
  expect_error(good.substr(0, 40), ErrorKind::kInvalidArgument, "truncated header");
  expect_error(good.substr(0, good.size() - 3), ErrorKind::kInvalidArgument, "truncated");
  expect_error(good + "xx", ErrorKind::kInvalidArgument, "holds 26 bytes");
  std::string v9 = good;
  v9[6] = 9;
  expect_error(v9, ErrorKind::kUnsupported, "version 9");
  expect_error(with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }\n", "abcd"), ErrorKind::kUnsupported, "big-endian");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }\n", "abcd"), ErrorKind::kUnsupported, "Fortran");
  expect_error(with_header("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }\n", "abcdefgh"), ErrorKind::kUnsupported, "'|O'");
  expect_error(with_header("{'descr': '<U3', 'fortran_order': False, 'shape': (1,), }\n", "abcdefghijkl"), ErrorKind::kUnsupported, "'<U3'");
  expect_error(with_header("{'descr': '<f4', 'shape': (1,), }\n", "abcd"), ErrorKind::kInvalidArgument, "lacks");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }\n", "abcd"), ErrorKind::kInvalidArgument, "shape entry");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, }\n", "abcd"), ErrorKind::kInvalidArgument, "malformed");
  expect_error(with_header("{'descr': '<f4 ", ""), ErrorKind::kInvalidArgument, "unterminated");
  // A header claiming far more data than the file holds must fail before allocating it.
  expect_error(with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (100000000000, 100000000000), }\n", "abcdefgh"),
               ErrorKind::kInvalidArgument, "truncated");
  expect_error(with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", ""),
               ErrorKind::kInvalidArgument, "too large");
}

TEST(Npy, MissingFileIsAnIoError) {
  try {
    io::read_npy("/nonexistent/dir/x.npy");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.npy"), std::string::npos);
  }
}

TEST(Npy, WritingBfloat16IsRefused) {
  Tensor t(DType::kBFloat16, {1});
  EXPECT_THROW(io::to_npy(t), Error);
}

}  // namespace
}  // namespace kiln
