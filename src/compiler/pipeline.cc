#include "compiler/pipeline.h"

#include <set>

#include "compiler/backends.h"
#include "compiler/input_values.h"
#include "compiler/profiles.h"
#include "compiler/quantize_graph.h"
#include "compiler/where_faster.h"
#include "cpu/evaluate.h"
#include "ir/op_schema.h"
#include "onnx/importer.h"
#include "passes/passes.h"

namespace kiln::compiler {

void optimize(ir::Graph& graph, const PassOptions& options) {
  passes::NodeEvaluator evaluate = [](const ir::Node& node, const std::vector<const Tensor*>& inputs) {
    return cpu::evaluate_node(node, inputs);
  };
  // Cleanup and folding feed each other (a folded Shape makes a Reshape's shape constant,
  // whose chain then dies), so they run to a fixed point; BatchNorm folding needs constant
  // weights, so it runs in the same loop; epilogue fusion runs last, on the settled graph.
  for (int round = 0; round < 16; ++round) {
    int changes = 0;
    changes += passes::remove_identity_and_dropout(graph);
    if (options.fold_constants) changes += passes::fold_constants(graph, evaluate);
    if (options.fold_constants) changes += passes::inline_constant_if(graph);
    if (options.fold_constants) changes += passes::unroll_loops(graph);
    // Once folding has done what it can, learn what symbolic arithmetic missed.
    if (options.fold_constants && round == 0) changes += passes::probe_symbolic_values(graph, evaluate);
    changes += passes::simplify_shape_chains(graph);
    changes += passes::eliminate_dead_code(graph);
    ir::infer_shapes(graph);
    if (options.fuse) {
      int bn = passes::fold_batchnorm(graph);
      bn += passes::fold_channel_scale(graph);
      if (bn) ir::infer_shapes(graph);
      changes += bn;
    }
    if (changes == 0) break;
  }
  // Attention before epilogue fusion, which would take its products' MatMuls.
  if (options.gpu_layer_forms && passes::split_attention_cache(graph) + passes::expand_gemm_c(graph) > 0) ir::infer_shapes(graph);
  if (options.fuse && options.fuse_attention) {
    std::vector<std::string> notes;
    if (passes::fuse_attention(graph, notes)) ir::infer_shapes(graph);
    if (passes::pack_attention_projections(graph)) ir::infer_shapes(graph);
    if (passes::fold_attention_views(graph)) ir::infer_shapes(graph);
    if (options.log)
      for (const std::string& note : notes) options.log(note);
  }
  if (options.fuse && passes::transpose_before_merge(graph)) ir::infer_shapes(graph);
  if (options.fuse && passes::fuse_group_norm(graph)) {
    passes::eliminate_dead_code(graph);
    ir::infer_shapes(graph);
  }
  if (options.fuse && options.fuse_epilogue) {
    for (int round = 0; round < 4; ++round) {
      int fused = passes::fuse_epilogue(graph);
      if (fused == 0) break;
      passes::eliminate_dead_code(graph);
      ir::infer_shapes(graph);
    }
  }
  if (options.fuse && options.fuse_elementwise && passes::fuse_elementwise(graph)) {
    passes::eliminate_dead_code(graph);
    ir::infer_shapes(graph);
  }
  ir::infer_shapes(graph);
}

TensorDesc describe(const ir::Graph& g, const std::string& name) {
  TensorDesc d;
  d.name = name;
  const ir::Value& v = g.value(name);
  d.dtype = v.type.dtype;
  if (v.type.shape) {
    for (const ir::Dim& dim : *v.type.shape) {
      d.shape.push_back(dim.known() ? dim.value : -1);
      d.dim_names.push_back(dim.known() ? "" : dim.symbol);
    }
  }
  return d;
}

namespace {

// A quantized GPU build of one static shape (`kiln build --batch N`, `kiln bench`, `kiln run`)
// quantizes the graph at that shape, so that the passes which need known shapes (Q, K and V
// packed into one product, attention's head views folded) have run first, as the GPU
// specializer runs them for an fp16 engine. Without this the quantized graph keeps three
// products and the copies around attention. Dynamic profiles quantize the symbolic graph.
void bind_static_profile(ir::Graph& graph, const BuildOptions& options) {
  std::vector<TensorDesc> declared;
  for (const std::string& in : graph.inputs) declared.push_back(describe(graph, in));
  const std::vector<OptimizationProfile> profiles = resolve_profiles(declared, options);
  if (profiles.size() != 1) return;
  Shapes shapes;
  for (const auto& [input, range] : profiles[0]) {
    if (range.min != range.max) return;
    shapes[input] = range.min;
  }
  passes::bind_input_shapes(graph, shapes);
}

}  // namespace

ir::Graph float_graph(const std::string& model_bytes, const std::string& name, const std::string& base_dir,
                      const BuildOptions& options, QdqScales& qdq) {
  ir::Graph graph = onnx_import::import_bytes(model_bytes, name, base_dir);
  // Named values are marked before the passes (so they survive them); "all" marks the
  // floating-point outputs of the optimized graph's nodes, so both engines compare the same
  // fused layers.
  auto mark = [&](const std::string& v) {
    if (!v.empty() && !graph.is_graph_output(v) && !graph.constant(v)) graph.outputs.push_back(v);
  };
  bool mark_all = false;
  for (const std::string& m : options.mark_outputs) {
    if (m == "all") {
      mark_all = true;
    } else if (graph.has_value(m) && !graph.constant(m)) {
      mark(m);
    } else {
      throw Error(ErrorKind::kInvalidArgument, "--mark-outputs: the model has no computed value named '" + m + "'").file(name);
    }
  }
  // Explicit quantization: the model's Q/DQ pairs become scales for the INT8 pass.
  if (options.precision == Precision::kInt8) qdq = absorb_qdq(graph);
  try {
    const bool quantized = options.precision == Precision::kInt8 || options.precision == Precision::kFp8;
    if (quantized && options.device == Device::kCuda && options.optimize) bind_static_profile(graph, options);
    PassOptions pass_options;
    pass_options.log = options.log;
    if (options.optimize) optimize(graph, pass_options);
  } catch (Error& e) {
    if (e.file_path().empty()) e.file(name);
    throw;
  }
  // Floating-point values only: integer ones are shape arithmetic and indices, which a GPU
  // build folds away at its shapes (marked, they would have to be computed from data).
  if (mark_all)
    for (const ir::Node& n : graph.nodes)
      for (const std::string& out : n.outputs)
        if (const ir::Value* v = out.empty() ? nullptr : graph.find_value(out); v && is_float(v->type.dtype)) mark(out);
  return graph;
}

void quantize_for_precision(ir::Graph& graph, const std::string& name, const BuildOptions& options,
                            const QdqScales& qdq, std::vector<std::string>& kept_float) {
  if (options.precision != Precision::kInt8 && options.precision != Precision::kFp8) return;
  const bool fp8 = options.precision == Precision::kFp8;
  // The model's own scales first (a QDQ model), calibrated ones for the other values.
  std::map<std::string, float> scales = qdq.activations;
  scales.insert(options.int8_scales.begin(), options.int8_scales.end());
  if (scales.empty())
    throw Error(ErrorKind::kInvalidArgument, "an INT8 build needs calibrated activation scales").file(name)
        .hint("give calibration data (kiln build --int8 --calib DATA) or a calibration cache (--calib-cache FILE), "
              "or a model with QuantizeLinear/DequantizeLinear pairs");
  std::set<std::string> pinned(options.float_layers.begin(), options.float_layers.end());
  QuantizeTarget target;
  if (fp8) {
    // cuDNN's FP8 engines: group-1 convolutions of 16-channel multiples; both engines build
    // the same graph.
    target.format = QuantizeFormat::kFloat8E4M3;
    target.few_input_channels = false;
  } else {
    target.grouped_convolutions = options.device == Device::kCpu;
    target.depthwise_convolutions = true;    // the GPU's INT8 depthwise kernel
    target.gpu_grouped_convolutions = true;  // and its grouped one
  }
  QuantizeGraphReport r = quantize_graph(graph, scales, pinned, &qdq.weights, target);
  kept_float = r.kept_float;
  const int fused_norms = passes::fuse_layer_norm_quantize(graph);
  const int fused_attentions = fp8 ? 0 : passes::fuse_attention_quantize(graph);
  if (fused_norms || fused_attentions) ir::infer_shapes(graph);
  if (options.log) {
    const std::string tag = fp8 ? "fp8" : "int8", format = fp8 ? "FP8" : "INT8";
    options.log(tag + ": " + std::to_string(r.quantized) + " convolutions in " + format + " (" + std::to_string(r.matrix_products) +
                " of them matrix products as 1x1 convolutions, " + std::to_string(r.model_weights) +
                " with the model's int8 weights), " + std::to_string(r.int8_values) + " " + tag + " tensors between them (" +
                std::to_string(r.int8_pools) + " through MaxPools), " +
                std::to_string(r.quantize_nodes - fused_norms - fused_attentions) + " quantize layers, " +
                std::to_string(fused_norms) + " quantized copies written by LayerNormalizations, " +
                std::to_string(fused_attentions) + " attentions writing int8");
    for (const std::string& k : r.kept_float) options.log(tag + ": kept in float: " + k);
  }
}

std::function<ir::Graph(const Shapes&, const std::map<std::string, Tensor>&)> specializer(
    std::shared_ptr<const ir::Graph> graph, bool optimize_graph, std::string name) {
  return [graph = std::move(graph), optimize_graph, name = std::move(name)](const Shapes& shapes,
                                                                            const std::map<std::string, Tensor>& values) {
    ir::Graph g = *graph;
    try {
      passes::bind_input_shapes(g, shapes);
      passes::bind_input_values(g, values);
      PassOptions options;
      options.fuse_elementwise = true;  // every shape is known now
      options.gpu_layer_forms = true;
      if (optimize_graph) optimize(g, options);
    } catch (Error& e) {
      if (e.file_path().empty()) e.file(name);
      throw;
    }
    return g;
  };
}

CompiledEngine assemble(ir::Graph graph, const std::string& name, const BuildOptions& options,
                        std::vector<OptimizationProfile> profiles, const std::map<std::string, std::string>& tactics,
                        std::vector<std::string> kept_float) {
  CompiledEngine c;
  c.name = name;
  c.options = options;
  c.options.log = nullptr;
  c.kept_float = std::move(kept_float);
  for (const std::string& in : graph.inputs) c.inputs.push_back(describe(graph, in));
  for (const std::string& out : graph.outputs) c.outputs.push_back(describe(graph, out));
  try {
    BuildOptions resolved = options;
    if (options.device == Device::kCpu) {
      if (!options.profiles.empty())
        throw Error(ErrorKind::kInvalidArgument, "optimization profiles are for GPU engines: the CPU engine runs any input shape")
            .hint("leave out --min-shapes/--opt-shapes/--max-shapes, or build for --device cuda");
      if (!options.input_values.empty())
        throw Error(ErrorKind::kInvalidArgument, "input values are for GPU engines: the CPU engine reads every input at run time")
            .hint("leave out --input-values, or build for --device cuda");
    } else {
      if (profiles.empty()) profiles = resolve_profiles(c.inputs, options);
      resolved.input_values = resolve_input_values(c.inputs, profiles, options.input_values);
      c.options.input_values = resolved.input_values;
      c.inputs = profile_inputs(c.inputs, profiles);
      c.profiles = profiles;
    }
    c.engine = build_backend_engine(std::move(graph), name, resolved, profiles, tactics);
    c.outputs = c.engine->outputs(std::move(c.outputs));
  } catch (Error& e) {
    if (e.file_path().empty()) e.file(name);
    throw;
  }
  return c;
}

CompiledEngine compile(const std::string& model_bytes, const std::string& name, const std::string& base_dir,
                       const BuildOptions& options) {
  if (options.precision == Precision::kBf16 && options.device == Device::kCuda)
    throw Error(ErrorKind::kUnsupported, "bf16 (bfloat16 products) is a CPU engine precision; GPU engines take fp16, best "
                                         "or tf32")
        .file(name)
        .hint("build with --device cpu, or use --fp16 on the GPU");
  const bool quantized = options.precision == Precision::kInt8 || options.precision == Precision::kFp8;
  if (quantized && options.device == Device::kCuda && options.quantized_where_faster)
    return build_quantized_where_faster(model_bytes, name, base_dir, options);
  QdqScales qdq;
  ir::Graph graph = float_graph(model_bytes, name, base_dir, options, qdq);
  std::vector<std::string> kept_float;
  quantize_for_precision(graph, name, options, qdq, kept_float);
  return assemble(std::move(graph), name, options, {}, {}, std::move(kept_float));
}

}  // namespace kiln::compiler
