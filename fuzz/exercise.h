// What the fuzz targets (libFuzzer, clang) and the bounded fuzz test (GoogleTest, any
// compiler) do with one input: push it as far through kiln as it goes. Whatever kiln throws
// is left to the caller, which checks that it is a kiln::Error.
#pragma once

#include <random>
#include <string>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cpu/engine.h"
#include "engine/engine_file.h"
#include "kiln/kiln.h"
#include "io/npy.h"
#include "ir/op_schema.h"
#include "onnx/importer.h"
#include "compiler/pipeline.h"
#include "passes/passes.h"

namespace kiln::fuzz {

// Limits that keep one input cheap: a mutated model may declare a 10^12-element tensor, and
// allocating it is not a bug. Models with larger shapes are imported and built, not run.
constexpr int64_t kMaxRunElements = 1 << 16;
// What a run may allocate. It bounds the models whose shapes depend on the input values (a
// Reshape, Expand or ConstantOfShape of a computed shape): those run, and one that asks for
// more is refused by the engine with a kiln::Error, which is the correct outcome.
constexpr size_t kMaxRunBytes = size_t{16} << 20;

// Fills a tensor with small deterministic values of its dtype.
inline Tensor fuzz_input(DType dtype, const std::vector<int64_t>& shape, std::mt19937& rng) {
  Tensor t(dtype, shape);
  std::uniform_int_distribution<int> small(-3, 3);
  for (int64_t i = 0; i < t.numel(); ++i) {
    int v = small(rng);
    switch (dtype) {
      case DType::kFloat32: t.data<float>()[i] = static_cast<float>(v) * 0.5f; break;
      case DType::kFloat64: t.data<double>()[i] = v * 0.5; break;
      case DType::kInt64: t.data<int64_t>()[i] = v; break;
      case DType::kInt32: t.data<int32_t>()[i] = v; break;
      case DType::kInt8: t.data<int8_t>()[i] = static_cast<int8_t>(v); break;
      case DType::kUInt8: t.data<uint8_t>()[i] = static_cast<uint8_t>(v + 3); break;
      case DType::kBool: t.data<bool>()[i] = v > 0; break;
      default: break;  // zeros
    }
  }
  return t;
}

// Import, optimize, build the CPU engine and, when every input and every shape known before
// the run is small, run it once with dynamic dimensions set to 2 (within kMaxRunBytes).
// Returns true if it ran.
inline bool exercise_model(const std::string& bytes) {
  ir::Graph g = onnx_import::import_bytes(bytes, "fuzz.onnx", "");
  compiler::optimize(g);
  cpu::CpuEngine engine(g, kMaxRunBytes);
  // Bind dynamic input dims and check that every value is small before running.
  ir::Graph bound = g;
  std::map<std::string, Tensor> inputs;
  std::mt19937 rng(7);
  for (const std::string& in : bound.inputs) {
    ir::Value& v = bound.value(in);
    std::vector<int64_t> shape;
    for (const ir::Dim& d : *v.type.shape) shape.push_back(d.known() ? d.value : 2);
    v.type.shape = ir::dims_of(shape);
    if (element_size(v.type.dtype) == 0) return false;
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d > kMaxRunElements) return false;
      n *= d;
      if (n > kMaxRunElements) return false;
    }
    inputs[in] = fuzz_input(v.type.dtype, shape, rng);
  }
  ir::infer_shapes(bound);
  for (const auto& [name, v] : bound.values()) {
    if (!v.type.shape || !ir::all_known(*v.type.shape)) continue;  // known as it runs
    int64_t n = 1;
    for (const ir::Dim& d : *v.type.shape) {
      if (d.value > kMaxRunElements) return false;
      n *= d.value;
      if (n > kMaxRunElements) return false;
    }
  }
  engine.run(inputs);
  return true;
}

inline void exercise_npy(const std::string& bytes) {
  Tensor t = io::parse_npy(bytes, "fuzz.npy");
  // What was read must write back to a file that reads the same.
  Tensor again = io::parse_npy(io::to_npy(t), "again.npy");
  if (again.shape() != t.shape() || again.dtype() != t.dtype() || again.nbytes() != t.nbytes())
    throw Error(ErrorKind::kInternal, "npy round trip changed the tensor");
}

// An engine file, loaded through the public API (Engine::load reads a path: the bytes go to a
// temporary file). fix_checksum: first rewrite the checksum to match the mutated bytes, so the
// header, the options and the embedded model get fuzzed rather than only the checksum test.
inline bool exercise_engine_file(std::string bytes, bool fix_checksum) {
  if (fix_checksum && bytes.size() >= 8) {
    const uint64_t h = engine_file::checksum(bytes.data(), bytes.size() - 8);
    for (size_t i = 0; i < 8; ++i) bytes[bytes.size() - 8 + i] = static_cast<char>((h >> (8 * i)) & 0xFF);
  }
  engine_file::parse(bytes, "fuzz.engine");
  struct TempFile {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("kiln_fuzz_" + std::to_string(::getpid()) + ".engine");
    ~TempFile() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  } file;
  std::ofstream(file.path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  Engine engine = Engine::load(file.path.string());
  return engine.layer_count() > 0 || !engine.outputs().empty();
}

}  // namespace kiln::fuzz
