// Importer of If. Each branch becomes a self-contained ONNX model (its bytes in the attributes
// then_model and else_model): the values a branch reads from the enclosing graphs become its
// inputs, and the If node's inputs after the condition, in the same order. Passes and backends
// then see an ordinary node whose every dependency is an input, and engine files carry the
// branches as they are. The branches' declared output types give the outputs' dtypes
// (output_dtypes) and ranks (output_ranks, -1 where the branches differ or do not say); their
// shapes are known only when the chosen branch has run. A backend builds each branch into an
// engine of its own (the CPU engine: src/cpu/control_flow.cc).
#include <onnx.pb.h>

#include <set>

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

const onnx::GraphProto* branch(const ImportContext& ctx, const std::string& name) {
  for (const auto& a : ctx.proto.attribute())
    if (a.name() == name && a.has_g()) return &a.g();
  return nullptr;
}

std::string branch_model(const ImportContext& ctx, const onnx::GraphProto& graph, const std::vector<std::string>& reads,
                         const std::string& which) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(ctx.opset);
  onnx::GraphProto* g = model.mutable_graph();
  *g = graph;
  g->set_name(ctx.node.name + "/" + which);
  g->clear_input();
  for (const std::string& name : reads) g->add_input()->set_name(name);  // typed when a backend builds it
  return model.SerializeAsString();
}

}  // namespace

KILN_REGISTER_IMPORTERS(control_flow) {
  registry.add({"If", kMinOpset, [](ImportContext& ctx) {
                  // An If of an engine file: already in kiln's form.
                  if (ctx.node.attrs.has("then_model")) return ctx.emit_as_is();
                  const onnx::GraphProto* then_branch = branch(ctx, "then_branch");
                  const onnx::GraphProto* else_branch = branch(ctx, "else_branch");
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
                    const auto& a = then_branch->output(static_cast<int>(i)).type();
                    const auto& b = else_branch->output(static_cast<int>(i)).type();
                    // The type either branch declares (ONNX leaves a branch's output types optional).
                    const int32_t code_a = a.has_tensor_type() ? a.tensor_type().elem_type() : 0;
                    const int32_t code_b = b.has_tensor_type() ? b.tensor_type().elem_type() : 0;
                    if ((a.value_case() != onnx::TypeProto::VALUE_NOT_SET && !a.has_tensor_type()) ||
                        (b.value_case() != onnx::TypeProto::VALUE_NOT_SET && !b.has_tensor_type()))
                      ctx.unsupported("output " + std::to_string(i) + " of a branch is not a tensor (sequences and optionals are not supported)");
                    if (code_a == 0 && code_b == 0)
                      ctx.unsupported("neither branch declares the type of output " + std::to_string(i));
                    if (code_a != 0 && code_b != 0 && code_a != code_b)
                      ctx.fail("its branches' output " + std::to_string(i) + " have different types");
                    const int32_t code = code_a != 0 ? code_a : code_b;
                    if (!is_known_dtype(code)) ctx.unsupported("output " + std::to_string(i) + " has a type kiln does not support");
                    dtypes.push_back(code);
                    const bool same_rank = a.tensor_type().has_shape() && b.tensor_type().has_shape() &&
                                           a.tensor_type().shape().dim_size() == b.tensor_type().shape().dim_size();
                    ranks.push_back(same_rank ? a.tensor_type().shape().dim_size() : -1);
                  }
                  ir::Node node = ctx.node;
                  node.inputs.resize(1);
                  node.inputs.insert(node.inputs.end(), reads.begin(), reads.end());
                  node.attrs.set("then_model", branch_model(ctx, *then_branch, reads, "then_branch"));
                  node.attrs.set("else_model", branch_model(ctx, *else_branch, reads, "else_branch"));
                  node.attrs.set("output_dtypes", dtypes);
                  node.attrs.set("output_ranks", ranks);
                  ctx.emit(std::move(node));
                }});
}

}  // namespace kiln::onnx_import
