// The ONNX importer: model file -> ir::Graph with types and shapes inferred.
//
// One small importer per op family (src/onnx/<family>.cc) registers with
// KILN_REGISTER_IMPORTERS; it turns one ONNX node (at the model's opset) into IR nodes in the
// canonical form: the newest opset's semantics, with inputs where newer opsets moved
// attributes to inputs (Squeeze axes, Clip min/max, Reduce* axes, ...).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/registry.h"

namespace onnx {
class NodeProto;
class TensorProto;
}  // namespace onnx

namespace kiln::onnx_import {

// The opsets of the default ONNX domain that kiln imports.
// Models of opsets kOldestOpset to kMaxOpset import; each op family's importer says from which
// opset it reads the op (most from kMinOpset, those whose meaning has not changed since from
// earlier), and an older node is refused naming the op.
constexpr int kOldestOpset = 7;  // numpy-style broadcasting, which kiln's ops assume, since opset 7
constexpr int kMinOpset = 11;
constexpr int kMaxOpset = 28;

struct ImportContext {
  const onnx::NodeProto& proto;
  ir::Graph& graph;
  int opset;  // of the node's domain
  // The node as read: name, op, inputs, outputs and every attribute converted.
  ir::Node node;

  // Appends a node to the graph.
  void emit(ir::Node n) { graph.nodes.push_back(std::move(n)); }
  // Appends `node` unchanged (the common case).
  void emit_as_is() { graph.nodes.push_back(node); }
  // Turns attribute `attr` (ints) into a new int64 constant input at position `index` of
  // `node`, as newer opsets take it; pads missing optional inputs with "". No-op if absent.
  void move_ints_attribute_to_input(const std::string& attr, size_t index);
  [[noreturn]] void fail(const std::string& message) const;
  [[noreturn]] void unsupported(const std::string& message) const;
};

struct OpImporter {
  std::string op;
  int since_opset = kMinOpset;  // the first opset (of those kiln reads) the importer handles
  std::function<void(ImportContext&)> convert;  // null: emit as is
  std::string imported_as = {};  // the op it becomes, where another (Upsample: Resize); for docs/operators.md
};

using ImporterRegistry = ir::Registry<OpImporter>;

// Registers a family of importers: KILN_REGISTER_IMPORTERS(squeeze) { registry.add({...}); }
#define KILN_REGISTER_IMPORTERS(family) \
  KILN_REGISTRY_FAMILY(::kiln::onnx_import::ImporterRegistry, kiln_register_importers_, family)

// Reads an ONNX model file (external data is looked up beside it).
ir::Graph import_file(const std::string& path);
// Reads a serialized ModelProto; `name` is used in error messages and `base_dir` for
// external data ("" refuses external data).
ir::Graph import_bytes(const std::string& bytes, const std::string& name, const std::string& base_dir);
// Reads the graph section of an engine file (onnx_export::export_engine_graph writes it): kiln's
// own ops (domain "kiln") are taken as they are, and initializers whose external data location
// is "kiln:weights" are read from `weights`. `name` is used in error messages.
ir::Graph import_engine_graph(const std::string& graph, const std::string& weights, const std::string& name);

// Reads a control-flow node's subgraph (the model in an If's then_model or else_model, a Loop's
// body_model: src/onnx/control_flow.cc) with `input_types` as its inputs' types; dims not known
// get names of their own, so the graph takes any size there. `name` is used in error messages.
ir::Graph import_subgraph(const std::string& model_bytes, const std::vector<ir::TensorType>& input_types,
                          const std::string& name);

// Converts one TensorProto (for tests and the conformance runner's .pb files).
Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::string& base_dir);
// Reads a serialized TensorProto file (the backend test data format).
Tensor read_tensor_file(const std::string& path);

}  // namespace kiln::onnx_import
