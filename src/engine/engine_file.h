// The engine file (docs/engine-format.md has the whole layout and the header's fields).
//
//   bytes 0..7    magic "KILNENG1"
//   u32           format version (kEngineFormatVersion)
//   u64 + bytes   header: JSON (kiln version, backend, GPU name and compute capability, CUDA,
//                 cuDNN and cuBLASLt versions, build options, inputs and outputs, optimization
//                 profiles, INT8 scales, the tactics the build chose)
//   u64 + bytes   graph: an ONNX ModelProto of the optimized graph (kiln's fused and INT8 ops
//                 in domain "kiln"), whose initializers are external data in the weights section
//                 (location "kiln:weights", offset and length into it)
//   u64 + bytes   weights: the initializers' bytes, each at a 64-byte aligned offset (INT8
//                 weights as int8; a CPU engine's packed weights as its kernels' panels, their
//                 layout named by the external data's "kiln_layout": cpu/packed_weights.h)
//   u64           FNV-1a 64 checksum of every byte before it
// Integers are little-endian. Loading imports the graph as it is (no passes) and builds with
// the recorded tactics, so nothing is timed again.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace kiln::engine_file {

constexpr uint32_t kEngineFormatVersion = 3;

struct Contents {
  nlohmann::json header;
  std::string graph;    // serialized ONNX ModelProto, initializers in `weights`
  std::string weights;
};

// Throws kIo when the file cannot be written.
void write(const std::string& path, const Contents& contents);
// Throws kIo (missing/unreadable) or kInvalidModel (not an engine file, a newer or older
// format, truncated, corrupted: checksum mismatch), naming the file.
Contents read(const std::string& path);
// Reads only the header (the format checked, not the checksum, which needs the whole file): for
// a look at what an engine is without reading its weights. Throws as read() does.
nlohmann::json read_header(const std::string& path);
// Parses a file already in memory (the fuzzer's), as read() reads one from disk.
Contents parse(const std::string& bytes, const std::string& name);
// The checksum of a file's first n bytes, as its last 8 bytes hold it (the fuzzer fixes it up
// after mutating a file, to reach what lies behind the check).
uint64_t checksum(const char* data, size_t n);

}  // namespace kiln::engine_file
