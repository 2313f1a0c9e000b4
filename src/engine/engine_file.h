// The engine file (provisional format; the dynamic-shapes issue makes it final).
//
//   bytes 0..7    magic "KILNENG1"
//   u32           format version (kEngineFormatVersion)
//   u64 + bytes   header: JSON (kiln version, backend, GPU name and compute capability, CUDA,
//                 cuDNN and cuBLASLt versions, build options, the timing-cache entries the
//                 build chose)
//   u64 + bytes   the ONNX model as given to the build
//   u64           FNV-1a 64 checksum of every byte before it
// Integers are little-endian. Loading rebuilds the engine from the model with the recorded
// tactics, so nothing is timed again.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace kiln::engine_file {

constexpr uint32_t kEngineFormatVersion = 1;

struct Contents {
  nlohmann::json header;
  std::string model;  // serialized ONNX ModelProto
};

// Throws kIo when the file cannot be written.
void write(const std::string& path, const Contents& contents);
// Throws kIo (missing/unreadable) or kInvalidModel (not an engine file, a newer or older
// format, truncated, corrupted: checksum mismatch), naming the file.
Contents read(const std::string& path);
// Parses a file already in memory (used by read() and by the fuzzer).
Contents parse(const std::string& bytes, const std::string& name);
// The checksum of a file's first n bytes, as its last 8 bytes hold it (the fuzzer fixes it up
// after mutating a file, to reach what lies behind the check).
uint64_t checksum(const char* data, size_t n);

}  // namespace kiln::engine_file
