#include "tools/engine_options.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "onnx/importer.h"
#include "tools/shapes.h"

namespace kiln::tools {

void EngineOptions::add_to(CLI::App* cmd, const std::string& device_default, bool shape_options) {
  device = device_default;
  cmd->add_option("--device", device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--fp16", fp16, "GPU: float16 storage (float32 accumulation); layers that must stay float32 do");
  cmd->add_flag("--tf32", tf32, "GPU: float32 storage, TF32 tensor-core products");
  cmd->add_flag("--fp32", fp32, "GPU: strict float32 (the default)");
  cmd->add_flag("--best", best, "GPU: float16 where supported, TF32 elsewhere");
  if (shape_options) {
    cmd->add_option("--shapes", shapes, "Input shapes, e.g. --shapes input:8x3x224x224 (GPU engines have fixed shapes)");
    cmd->add_option("--dim", dims, "Bind a dynamic dimension by name, e.g. --dim seq=128 (repeatable)");
    cmd->add_option("--batch", batch, "The first dimension of inputs whose first dimension is dynamic")->check(CLI::PositiveNumber);
  }
  cmd->add_option("--timing-cache", timing_cache, "Timing cache file: read if present, updated after the build");
  cmd->add_flag("--allow-cpu-fallback", allow_cpu_fallback, "Run nodes without a GPU layer on the CPU instead of failing");
  cmd->add_flag("--no-optimize", no_optimize, "Skip kiln's graph passes");
  cmd->add_flag("-v,--verbose", verbose, "Print every layer as it is built, with its tactic");
  cmd->add_option("--mark-outputs", mark_outputs, "Also output these values (names, or 'all'), to compare layer by layer")
      ->delimiter(',');
}

Precision EngineOptions::precision() const {
  int n = fp16 + tf32 + fp32 + best;
  if (n > 1) throw Error(ErrorKind::kInvalidArgument, "give one of --fp16, --tf32, --fp32, --best");
  if (fp16) return Precision::kFp16;
  if (tf32) return Precision::kTf32;
  if (best) return Precision::kBest;
  return Precision::kFp32;
}

BuildOptions EngineOptions::build_options(const std::string& model, std::vector<std::string>& defaulted) const {
  BuildOptions b;
  b.optimize = !no_optimize;
  b.device = device == "cuda" ? Device::kCuda : Device::kCpu;
  b.precision = precision();
  b.timing_cache = timing_cache;
  b.allow_cpu_fallback = allow_cpu_fallback;
  b.mark_outputs = mark_outputs;
  if (b.device == Device::kCpu) {
    if (precision() != Precision::kFp32) throw Error(ErrorKind::kInvalidArgument, "the CPU engine runs float32 only");
    return b;
  }
  ShapeBindings bindings;
  for (const std::string& d : dims) bindings.add_dim_option(d);
  for (const std::string& s : shapes) bindings.add_shapes_option(s);
  bindings.batch = batch;
  ir::Graph g = onnx_import::import_file(model);
  std::vector<std::string> symbols;
  for (const std::string& in : g.inputs) {
    const ir::Value& v = g.value(in);
    if (!v.type.shape) continue;
    for (const ir::Dim& d : *v.type.shape)
      if (d.symbolic()) symbols.push_back(d.symbol);
  }
  check_bindings_used(bindings, g.inputs, symbols);
  for (const std::string& in : g.inputs) {
    const ir::Value& v = g.value(in);
    if (!v.type.shape) continue;
    std::vector<int64_t> shape;
    std::vector<std::string> names;
    for (const ir::Dim& d : *v.type.shape) {
      shape.push_back(d.known() ? d.value : -1);
      names.push_back(d.known() ? "" : d.symbol);
    }
    b.input_shapes[in] = resolve_shape(in, shape, names, bindings, 1, defaulted);
  }
  // Progress: every layer with --verbose, else about every tenth of the layers.
  const bool all = verbose;
  b.log = [all](const std::string& line) {
    long i = 0, n = 0;
    if (!all && std::sscanf(line.c_str(), "[%ld/%ld]", &i, &n) == 2 && n > 0 && i != n && (i * 10 / n) == ((i - 1) * 10 / n))
      return;
    std::cerr << "kiln build: " << line << std::endl;
  };
  return b;
}

bool is_engine_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  f.read(magic, sizeof magic);
  return f && std::memcmp(magic, "KILNENG1", 8) == 0;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (bytes >= 1024 && u < 3) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

}  // namespace kiln::tools
