// The ONNX exporter: ir::Graph -> a serialized ONNX ModelProto. Used by `kiln export
// --simplify` (and the Python package's kiln.simplify) to write a model after kiln's folding
// passes, so other tools see what kiln's optimizer made of it, and by engine files to hold the
// optimized graph.
#pragma once

#include <string>

#include "ir/graph.h"

namespace kiln::onnx_export {

// The default-domain opset written: the IR holds ops in the form of the newest opsets kiln
// reads (attributes moved to inputs, as opset 18 takes them), so an older model is written at
// this opset; a newer one keeps its own.
constexpr int kMinWrittenOpset = 18;

// Serializes `graph`: nodes, initializers (every constant value a node or output reads), inputs
// and outputs with their dtypes and shapes (symbolic dims as dim_param), and value_info for the
// other typed values. Throws kUnsupported naming the node for kiln's own ops (domain "kiln"):
// they have no ONNX form.
std::string export_model(const ir::Graph& graph, const std::string& producer = "kiln");

// The graph section of an engine file: the same, with kiln's own ops written in domain "kiln"
// and every initializer's bytes appended to `weights` (onnx_import::import_engine_graph reads
// it back).
std::string export_engine_graph(const ir::Graph& graph, std::string& weights);

}  // namespace kiln::onnx_export
