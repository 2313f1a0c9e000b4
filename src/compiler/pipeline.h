// The compiler: a model's bytes become an engine, in one readable sequence (pipeline.cc):
//
//   import (src/onnx)
//   -> Q/DQ pairs absorbed into scales (qdq_import.h), INT8 builds only
//   -> optimize(): the passes of src/passes in the order the backends want
//   -> values marked as outputs (--mark-outputs)
//   -> the INT8/FP8 rewrite (quantize_graph.h) for quantized precisions
//   -> the backend's engine (backends.h; GPU plans are specialized per input shape)
//
// with `kiln build --int8/--fp8` on the GPU taking the where-faster route (where_faster.h),
// which builds and times several engines and keeps the fastest.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "compiler/qdq_import.h"
#include "ir/graph.h"
#include "kiln/types.h"

namespace kiln::compiler {

struct PassOptions {
  bool fold_constants = true;
  bool fuse = true;  // BatchNorm folding and Conv/Gemm epilogue fusion
  // With fuse: also the epilogue fusion into kiln's own ops (FusedConv, ...). False keeps the
  // graph in ONNX ops (BatchNorm still folded), as `kiln export --simplify` writes it.
  bool fuse_epilogue = true;
  // With fuse: groups of elementwise ops (and a Concat only they read) into kiln::FusedElementwise,
  // once shapes are known. The CUDA engine's specialized graphs take it; the CPU engine runs
  // each op on its own kernels, which are vectorized and threaded per op.
  bool fuse_elementwise = false;
  // With fuse: scaled dot-product attention into ONNX's Attention (one layer on every backend).
  bool fuse_attention = true;
  // Nodes written out in forms the CUDA engine's layers take, where every shape is known: an
  // Attention's key/value cache as Concats and a mask (passes::split_attention_cache), a Gemm's
  // runtime C of a broadcast shape expanded (passes::expand_gemm_c). The CPU engine's kernels
  // take those nodes as they are, without the copies.
  bool gpu_layer_forms = false;
  // Where the passes say what they did not do and why (attention patterns not fused); may be null.
  std::function<void(const std::string&)> log;
};

// Runs the passes to a fixed point and re-infers shapes. Constant folding computes with the
// CPU engine's kernels (cpu/evaluate.h).
void optimize(ir::Graph& graph, const PassOptions& options = {});

// The model in float, as an engine runs it before quantization: imported, Q/DQ pairs absorbed
// (their scales in `qdq`; INT8 builds), optimized (dynamic dimensions kept symbolic), marked
// outputs added.
ir::Graph float_graph(const std::string& model_bytes, const std::string& name, const std::string& base_dir,
                      const BuildOptions& options, QdqScales& qdq);

// INT8 and FP8 builds: the float graph's convolutions quantized (other precisions: nothing to
// do); `kept_float` says which stayed float and why.
void quantize_for_precision(ir::Graph& graph, const std::string& name, const BuildOptions& options, const QdqScales& qdq,
                            std::vector<std::string>& kept_float);

// Input shapes by input name: one binding of a graph's inputs.
using Shapes = std::map<std::string, std::vector<int64_t>>;

// A GPU plan's graph: `graph` at concrete input shapes, with the inputs planned by value bound
// to their values (BuildOptions::input_values), shape arithmetic folded (and anything that
// folding opens up fused, when `optimize`).
std::function<ir::Graph(const Shapes&, const std::map<std::string, Tensor>&)> specializer(
    std::shared_ptr<const ir::Graph> graph, bool optimize, std::string name);

// A graph input's or output's description: dtype, dims (-1 where symbolic) and their names.
TensorDesc describe(const ir::Graph& graph, const std::string& value);

// An engine as the compiler hands it to the public API.
struct CompiledEngine {
  std::unique_ptr<backend::Engine> engine;
  std::string name;                           // the model or engine file
  BuildOptions options;                       // as built (no log)
  std::vector<OptimizationProfile> profiles;  // GPU engines: each names every input
  std::vector<TensorDesc> inputs, outputs;
  std::vector<std::string> kept_float;  // INT8/FP8: quantizable layers left in float, "name: why"
};

// The engine of an optimized (and, for INT8/FP8, quantized) graph: the CPU engine, or the GPU
// engine over `profiles` (none: resolved from options, compiler/profiles.h), using `tactics`
// (timing-cache entries) before timing anything.
CompiledEngine assemble(ir::Graph graph, const std::string& name, const BuildOptions& options,
                        std::vector<OptimizationProfile> profiles, const std::map<std::string, std::string>& tactics,
                        std::vector<std::string> kept_float);

// Engine::from_onnx: the whole pipeline above.
CompiledEngine compile(const std::string& model_bytes, const std::string& name, const std::string& base_dir,
                       const BuildOptions& options);

}  // namespace kiln::compiler
