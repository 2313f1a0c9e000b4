// The engine file's container: round trip, and every kind of damage is a clear kiln::Error.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>

#include "engine/engine_file.h"
#include "kiln/error.h"

namespace kiln {
namespace {

std::string bytes_of(const engine_file::Contents& c) {
  // One file per test: CTest runs these tests in parallel processes, which shared one path and
  // raced (a test read the file while another rewrote it).
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::string path = ::testing::TempDir() + "/kiln_engine_file_test_" + test + ".engine";
  engine_file::write(path, c);
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

engine_file::Contents sample() {
  engine_file::Contents c;
  c.header = {{"kiln_version", "0.1.0"}, {"backend", "cuda"}, {"tactics", {{"k", "v"}}}};
  c.graph = std::string("\x08\x07\x12\x04test", 8);
  c.weights = std::string("\x00\x01\x02\x03weights", 11);
  return c;
}

TEST(EngineFile, RoundTrip) {
  engine_file::Contents back = engine_file::parse(bytes_of(sample()), "x.engine");
  EXPECT_EQ(back.header, sample().header);
  EXPECT_EQ(back.graph, sample().graph);
  EXPECT_EQ(back.weights, sample().weights);
}

TEST(EngineFile, EveryTruncationIsAnError) {
  std::string bytes = bytes_of(sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    try {
      engine_file::parse(bytes.substr(0, n), "x.engine");
      FAIL() << "a file truncated to " << n << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
      EXPECT_EQ(e.file_path(), "x.engine");
    }
  }
}

TEST(EngineFile, CorruptionIsCaughtByTheChecksum) {
  std::string bytes = bytes_of(sample());
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bad = bytes;
    size_t at = 8 + rng() % (bad.size() - 8);  // past the magic
    bad[at] = static_cast<char>(bad[at] ^ (1 + rng() % 255));
    EXPECT_THROW(engine_file::parse(bad, "x.engine"), Error) << "byte " << at;
  }
}

TEST(EngineFile, ForeignFilesAndOtherVersionsAreRefused) {
  try {
    engine_file::parse("\x08\x01 an onnx model", "model.onnx");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a kiln engine file"), std::string::npos) << e.what();
  }
  std::string bytes = bytes_of(sample());
  bytes[8] = 99;  // format version
  try {
    engine_file::parse(bytes, "x.engine");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("format 99"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine_file::read("/nonexistent/x.engine"), Error);
}

std::string temp_file(const std::string& bytes) {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string path = ::testing::TempDir() + "/kiln_engine_file_test_" + test + ".bytes";
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

TEST(EngineFile, ReadFromDiskEqualsParseAndRefusesWhatParseRefuses) {
  const std::string bytes = bytes_of(sample());
  engine_file::Contents back = engine_file::read(temp_file(bytes));
  EXPECT_EQ(back.header, sample().header);
  EXPECT_EQ(back.graph, sample().graph);
  EXPECT_EQ(back.weights, sample().weights);
  // Every truncation and a byte past the checksum, read from disk: the file's size is what the
  // section sizes are checked against.
  for (size_t n : {size_t{0}, size_t{5}, size_t{12}, bytes.size() / 2, bytes.size() - 1}) {
    try {
      engine_file::read(temp_file(bytes.substr(0, n)));
      FAIL() << "a file truncated to " << n << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel) << n << ": " << e.what();
    }
  }
  try {
    engine_file::read(temp_file(bytes + "x"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 unexpected bytes after its checksum"), std::string::npos) << e.what();
  }
  // A section size far beyond the file is refused before anything is allocated for it.
  std::string huge = bytes;
  huge[8 + 4 + 7] = '\x7f';  // the header size's top byte
  try {
    engine_file::read(temp_file(huge));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated (in its header)"), std::string::npos) << e.what();
  }
  try {
    engine_file::read(::testing::TempDir());
    FAIL() << "a folder was read as an engine file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
  }
}

TEST(EngineFile, ReadHeaderReadsOnlyTheHeader) {
  const std::string bytes = bytes_of(sample());
  EXPECT_EQ(engine_file::read_header(temp_file(bytes)), sample().header);
  // The sections after the header are not read: a file cut right after it still has a header.
  const size_t header_end = 8 + 4 + 8 + sample().header.dump().size();
  EXPECT_EQ(engine_file::read_header(temp_file(bytes.substr(0, header_end))), sample().header);
  EXPECT_THROW(engine_file::read_header(temp_file(bytes.substr(0, header_end - 1))), Error);
  try {
    engine_file::read_header(temp_file("\x08\x01 an onnx model"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a kiln engine file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine_file::read_header("/nonexistent/x.engine"), Error);
}

}  // namespace
}  // namespace kiln
