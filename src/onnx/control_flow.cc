// Importers of If, Loop and Scan. Each subgraph (If's branches, Loop's and Scan's body) becomes a self-contained
// ONNX model (its bytes in an attribute: then_model and else_model, body_model): the values it
// reads from the enclosing graphs become inputs of its own, after those the op gives it, and
// inputs of the node, after the op's own, in the same order. Passes and backends then see an
// ordinary node whose every dependency is an input, and engine files carry the subgraphs as
// they are. The subgraphs' declared output types give the outputs' dtypes (output_dtypes) and
// ranks (output_ranks, -1 where unknown); the shapes are known only when the node has run. A
// backend builds each subgraph into an engine of its own (the CPU engine:
// src/cpu/control_flow.cc).
#include <onnx.pb.h>

#include <set>

#include "ir/subgraph_types.h"
#include "onnx/importer.h"

namespace kiln::onnx_import {

namespace {

// Subgraphs nested deeper than this are refused (each level is an engine built inside a kernel).
constexpr int kMaxSubgraphDepth = 16;

// The names `graph` reads from its enclosing scopes, in the order first read: every node input
// (and, through nested subgraphs, theirs) that the graph does not define before reading it.
void enclosing_reads(const onnx::GraphProto& graph, int depth, std::vector<std::string>& names, std::set<std::string>& listed,
                     const ImportContext& ctx) {
  if (depth > kMaxSubgraphDepth)
    ctx.unsupported("subgraphs nested more than " + std::to_string(kMaxSubgraphDepth) + " deep");
  std::set<std::string> defined;
  for (const auto& v : graph.input()) defined.insert(v.name());
  for (const auto& t : graph.initializer()) defined.insert(t.name());
  for (const auto& node : graph.node()) {
    std::vector<std::string> reads(node.input().begin(), node.input().end());
    std::set<std::string> nested_listed;
    for (const auto& a : node.attribute()) {
      if (a.has_g()) enclosing_reads(a.g(), depth + 1, reads, nested_listed, ctx);
      for (const auto& g : a.graphs()) enclosing_reads(g, depth + 1, reads, nested_listed, ctx);
    }
    for (const std::string& name : reads)
      if (!name.empty() && !defined.count(name) && listed.insert(name).second) names.push_back(name);
    for (const auto& out : node.output()) defined.insert(out);
  }
}

const onnx::GraphProto* graph_attribute(const ImportContext& ctx, const std::string& name) {
  for (const auto& a : ctx.proto.attribute())
    if (a.name() == name && a.has_g()) return &a.g();
  return nullptr;
}

// The subgraph as a model: its own inputs (Loop's body: iteration, condition, carried values),
// then the values it reads from the enclosing graphs, typed when a backend builds it.
std::string subgraph_model(const ImportContext& ctx, const onnx::GraphProto& graph, const std::vector<std::string>& reads,
                           const std::string& which) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(ctx.opset);
  onnx::GraphProto* g = model.mutable_graph();
  *g = graph;
  g->set_name(ctx.node.name + "/" + which);
  for (const std::string& name : reads) g->add_input()->set_name(name);
  return model.SerializeAsString();
}

// The dtype and rank of output i of `graph` (either of two graphs that must agree, for If):
// what they declare; (-1, -1) where neither declares a type (the node's schema infers it from the
// subgraph then: src/ops/control_flow.cc).
std::pair<int64_t, int64_t> declared_output(const ImportContext& ctx, size_t i, const onnx::TypeProto& a,
                                            const onnx::TypeProto* b) {
  auto tensor = [&](const onnx::TypeProto& t) {
    if (t.value_case() != onnx::TypeProto::VALUE_NOT_SET && !t.has_tensor_type())
      ctx.unsupported("output " + std::to_string(i) + " of a subgraph is not a tensor (sequences and optionals are not supported)");
    return t.has_tensor_type() ? t.tensor_type().elem_type() : 0;
  };
  const int32_t code_a = tensor(a), code_b = b ? tensor(*b) : 0;
  if (code_a == 0 && code_b == 0) return {-1, -1};
  if (code_a != 0 && code_b != 0 && code_a != code_b)
    ctx.fail("its subgraphs disagree on the type of output " + std::to_string(i));
  const int32_t code = code_a != 0 ? code_a : code_b;
  if (!is_known_dtype(code)) ctx.unsupported("output " + std::to_string(i) + " has a type kiln does not support");
  const bool rank_a = a.has_tensor_type() && a.tensor_type().has_shape();
  const bool rank_b = b && b->has_tensor_type() && b->tensor_type().has_shape();
  int64_t rank = -1;
  if (rank_a && (!b || (rank_b && a.tensor_type().shape().dim_size() == b->tensor_type().shape().dim_size())))
    rank = a.tensor_type().shape().dim_size();
  return {code, rank};
}

}  // namespace

ir::Graph import_subgraph(const std::string& model_bytes, const std::vector<ir::TensorType>& input_types,
                          const std::string& name) {
  onnx::ModelProto model;
  if (model_bytes.empty() || !model.ParseFromString(model_bytes))
    throw Error(ErrorKind::kInvalidModel, name + " is not an ONNX model");
  onnx::GraphProto* graph = model.mutable_graph();
  if (static_cast<size_t>(graph->input_size()) != input_types.size())
    throw Error(ErrorKind::kInvalidModel, name + " takes " + std::to_string(graph->input_size()) + " inputs; it is given " +
                                              std::to_string(input_types.size()));
  for (int i = 0; i < graph->input_size(); ++i) {
    const ir::TensorType& type = input_types[static_cast<size_t>(i)];
    onnx::ValueInfoProto* input = graph->mutable_input(i);
    if (!type.shape) throw Error(ErrorKind::kUnsupported, "the rank of " + name + "'s input '" + input->name() + "' is not known");
    onnx::TypeProto::Tensor* tensor = input->mutable_type()->mutable_tensor_type();
    tensor->set_elem_type(static_cast<int32_t>(type.dtype));
    onnx::TensorShapeProto* shape = tensor->mutable_shape();
    shape->clear_dim();
    for (size_t k = 0; k < type.shape->size(); ++k) {
      const ir::Dim& d = (*type.shape)[k];
      if (d.known()) shape->add_dim()->set_dim_value(d.value);
      else shape->add_dim()->set_dim_param(input->name() + ":" + std::to_string(k));
    }
  }
  ir::Graph imported = import_bytes(model.SerializeAsString(), name, "");
  // import_bytes lists a graph input once however often it is named; the order is the model's.
  if (imported.inputs.size() != input_types.size()) throw Error(ErrorKind::kInvalidModel, name + " names an input twice");
  return imported;
}

namespace {

// The subgraph typer of the schemas (ir/subgraph_types.h): the subgraph imported with its inputs
// typed, its outputs' types as its inference gives them.
std::vector<ir::TensorType> subgraph_output_types(const std::string& model, const std::vector<ir::TensorType>& inputs,
                                                  const std::string& name) {
  ir::Graph graph = import_subgraph(model, inputs, name);
  std::vector<ir::TensorType> types;
  for (const std::string& output : graph.outputs) {
    const ir::Value* v = graph.find_value(output);
    types.push_back(v ? v->type : ir::TensorType{});
  }
  return types;
}

const bool kTyperSet = (ir::set_subgraph_typer(&subgraph_output_types), true);

}  // namespace

KILN_REGISTER_IMPORTERS(control_flow) {
  registry.add({"If", kMinOpset, [](ImportContext& ctx) {
                  // An If of an engine file: already in kiln's form.
                  if (ctx.node.attrs.has("then_model")) return ctx.emit_as_is();
                  const onnx::GraphProto* then_branch = graph_attribute(ctx, "then_branch");
                  const onnx::GraphProto* else_branch = graph_attribute(ctx, "else_branch");
                  if (!then_branch || !else_branch) ctx.fail("If needs the graph attributes then_branch and else_branch");
                  const size_t outputs = ctx.node.outputs.size();
                  if (static_cast<size_t>(then_branch->output_size()) != outputs ||
                      static_cast<size_t>(else_branch->output_size()) != outputs)
                    ctx.fail("its branches must each have " + std::to_string(outputs) + " output(s), as the node has");
                  std::vector<std::string> reads;
                  std::set<std::string> listed;
                  enclosing_reads(*then_branch, 1, reads, listed, ctx);
                  enclosing_reads(*else_branch, 1, reads, listed, ctx);
                  std::vector<int64_t> dtypes, ranks;
                  for (size_t i = 0; i < outputs; ++i) {
                    const auto [dtype, rank] = declared_output(ctx, i, then_branch->output(static_cast<int>(i)).type(),
                                                               &else_branch->output(static_cast<int>(i)).type());
                    dtypes.push_back(dtype);
                    ranks.push_back(rank);
                  }
                  ir::Node node = ctx.node;
                  node.inputs.resize(1);
                  node.inputs.insert(node.inputs.end(), reads.begin(), reads.end());
                  node.attrs.set("then_model", subgraph_model(ctx, *then_branch, reads, "then_branch"));
                  node.attrs.set("else_model", subgraph_model(ctx, *else_branch, reads, "else_branch"));
                  node.attrs.set("output_dtypes", dtypes);
                  node.attrs.set("output_ranks", ranks);
                  ctx.emit(std::move(node));
                }});
  // Loop: inputs M (trip count), cond, the N carried values; the body takes (iteration, cond,
  // carried...) and gives (cond, carried..., scan outputs...); the node gives the carried values'
  // last values and each scan output stacked over the iterations.
  registry.add({"Loop", kMinOpset, [](ImportContext& ctx) {
                  if (ctx.node.attrs.has("body_model")) return ctx.emit_as_is();  // an engine file's
                  const onnx::GraphProto* body = graph_attribute(ctx, "body");
                  if (!body) ctx.fail("Loop needs the graph attribute body");
                  if (ctx.node.inputs.size() < 2) ctx.fail("Loop takes M and cond (either may be \"\") before its carried values");
                  const size_t carried = ctx.node.inputs.size() - 2;
                  if (static_cast<size_t>(body->input_size()) != carried + 2)
                    ctx.fail("its body must take " + std::to_string(carried + 2) + " inputs (iteration, condition and " +
                             std::to_string(carried) + " carried), not " + std::to_string(body->input_size()));
                  if (static_cast<size_t>(body->output_size()) < carried + 1)
                    ctx.fail("its body must give the condition and " + std::to_string(carried) + " carried values");
                  const size_t scans = static_cast<size_t>(body->output_size()) - 1 - carried;
                  if (ctx.node.outputs.size() != carried + scans)
                    ctx.fail("it must have " + std::to_string(carried + scans) + " outputs (carried and scan outputs), as its body gives");
                  std::vector<std::string> reads;
                  std::set<std::string> listed;
                  enclosing_reads(*body, 1, reads, listed, ctx);
                  std::vector<int64_t> dtypes, ranks;
                  for (size_t i = 0; i < carried + scans; ++i) {
                    const onnx::TypeProto& out = body->output(static_cast<int>(i) + 1).type();
                    // A carried value's type is also its body input's.
                    const onnx::TypeProto* in = i < carried ? &body->input(static_cast<int>(i) + 2).type() : nullptr;
                    // A carried value's dtype, where the body does not say, is its initial value's (-1).
                    auto [dtype, rank] = declared_output(ctx, i, out, in);
                    // A carried value may change shape between iterations; its rank is the one
                    // its body declares for it going in and coming out, where they agree (the
                    // Loop kernel checks it), and unknown otherwise.
                    if (i >= carried && rank >= 0) ++rank;  // stacked over the iterations
                    dtypes.push_back(dtype);
                    ranks.push_back(rank);
                  }
                  ir::Node node = ctx.node;
                  node.inputs.insert(node.inputs.end(), reads.begin(), reads.end());
                  node.attrs.set("body_model", subgraph_model(ctx, *body, reads, "body"));
                  node.attrs.set("carried", static_cast<int64_t>(carried));
                  node.attrs.set("output_dtypes", dtypes);
                  node.attrs.set("output_ranks", ranks);
                  ctx.emit(std::move(node));
                }});
  // Scan: inputs the N state values, then the M scanned ones; the body takes (states..., one
  // slice of each scanned input...) and gives (states..., scan output elements...); the node gives
  // the states' last values and each scan output stacked along its axis. Opset 8's form scans
  // every entry of a batch on its own: its inputs (after sequence_lens, which must be absent:
  // every entry scans its whole sequence) are [batch, ...] states and [batch, sequence, ...]
  // scanned values, its outputs [batch, ...] and [batch, sequence, ...]; kiln's Scan marks it with
  // the attribute batched (its directions become scan_input_directions).
  registry.add({"Scan", 8, [](ImportContext& ctx) {
                  if (ctx.node.attrs.has("body_model")) return ctx.emit_as_is();  // an engine file's
                  const onnx::GraphProto* body = graph_attribute(ctx, "body");
                  if (!body) ctx.fail("Scan needs the graph attribute body");
                  ir::Node node = ctx.node;
                  const bool batched = ctx.opset < 9;
                  if (batched) {
                    if (node.inputs.empty()) ctx.fail("opset 8's Scan takes sequence_lens (or \"\") first");
                    if (!node.inputs[0].empty())
                      ctx.unsupported("opset 8's sequence_lens is not supported (without it every batch entry scans its "
                                      "whole sequence)");
                    node.inputs.erase(node.inputs.begin());
                    if (node.attrs.has("directions")) {
                      node.attrs.set("scan_input_directions", node.attrs.get_ints("directions"));
                      node.attrs.erase("directions");
                    }
                    node.attrs.set("batched", int64_t{1});
                  }
                  const int64_t scanned = node.attrs.get_int("num_scan_inputs", -1);
                  const int64_t inputs = static_cast<int64_t>(node.inputs.size());
                  if (scanned < 1 || scanned > inputs) ctx.fail("num_scan_inputs must be 1 to the number of inputs");
                  const size_t states = static_cast<size_t>(inputs - scanned);
                  if (static_cast<int64_t>(body->input_size()) != inputs)
                    ctx.fail("its body must take " + std::to_string(inputs) + " inputs (states and scan slices), not " +
                             std::to_string(body->input_size()));
                  if (static_cast<size_t>(body->output_size()) < states || node.outputs.size() != static_cast<size_t>(body->output_size()))
                    ctx.fail("its body must give the " + std::to_string(states) + " states and one element per scan output");
                  std::vector<std::string> reads;
                  std::set<std::string> listed;
                  enclosing_reads(*body, 1, reads, listed, ctx);
                  std::vector<int64_t> dtypes, ranks;
                  for (size_t i = 0; i < node.outputs.size(); ++i) {
                    const onnx::TypeProto* in = i < states ? &body->input(static_cast<int>(i)).type() : nullptr;
                    auto [dtype, rank] = declared_output(ctx, i, body->output(static_cast<int>(i)).type(), in);
                    if (i >= states && rank >= 0) ++rank;  // stacked over the iterations
                    if (batched && rank >= 0) ++rank;      // and over the batch
                    dtypes.push_back(dtype);
                    ranks.push_back(rank);
                  }
                  node.inputs.insert(node.inputs.end(), reads.begin(), reads.end());
                  node.attrs.set("body_model", subgraph_model(ctx, *body, reads, "body"));
                  node.attrs.set("states", static_cast<int64_t>(states));
                  node.attrs.set("output_dtypes", dtypes);
                  node.attrs.set("output_ranks", ranks);
                  ctx.emit(std::move(node));
                }});
}

}  // namespace kiln::onnx_import
