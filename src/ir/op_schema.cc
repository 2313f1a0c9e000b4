#include "ir/op_schema.h"

#include <algorithm>

namespace kiln::ir {

const TensorType& InferContext::type(size_t i) const {
  if (!has_input(i)) fail("input " + std::to_string(i) + " is required but missing");
  return *input_types[i];
}

const Dims& InferContext::shape(size_t i) const {
  const TensorType& t = type(i);
  if (!t.shape) unsupported("the rank of input " + std::to_string(i) + " is unknown");
  return *t.shape;
}

std::optional<Dims> InferContext::int_elements(size_t i) const {
  if (const Tensor* v = value(i)) {
    if (!is_integer(v->dtype()) && v->dtype() != DType::kBool) return std::nullopt;
    return dims_of(v->to_int_vector());
  }
  if (i < input_symbolic.size() && input_symbolic[i]) return *input_symbolic[i];
  return std::nullopt;
}

void InferContext::set_output(size_t i, DType dtype, std::optional<Dims> shape) {
  if (i >= output_types.size()) return;  // an optional output the model does not use
  if (shape) {
    try {
      check_shape_size(*shape, dtype, "output " + std::to_string(i) +
                                          (i < node.outputs.size() ? " ('" + node.outputs[i] + "')" : std::string()));
    } catch (const Error& e) {
      fail(e.message());
    }
  }
  output_types[i].dtype = dtype;
  output_types[i].shape = std::move(shape);
}

void InferContext::set_symbolic(size_t i, Dims value) {
  if (i < output_symbolic.size()) output_symbolic[i] = std::move(value);
}

void InferContext::fail(const std::string& message) const {
  throw node.error(ErrorKind::kInvalidModel, message);
}

void InferContext::unsupported(const std::string& message) const {
  throw node.error(ErrorKind::kUnsupported, message);
}

int64_t FlopsContext::numel(const TensorType* t) {
  if (!t || !t->shape) return 0;
  int64_t n = 1;
  for (const Dim& d : *t->shape) {
    if (!d.known()) return 0;
    n *= d.value;
  }
  return n;
}

std::optional<Dims> broadcast_dims(const Dims& a, const Dims& b) {
  size_t rank = std::max(a.size(), b.size());
  Dims out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const Dim* da = i < rank - a.size() ? nullptr : &a[i - (rank - a.size())];
    const Dim* db = i < rank - b.size() ? nullptr : &b[i - (rank - b.size())];
    if (!da) { out[i] = *db; continue; }
    if (!db) { out[i] = *da; continue; }
    if (da->known() && da->value == 1) { out[i] = *db; continue; }
    if (db->known() && db->value == 1) { out[i] = *da; continue; }
    if (da->known() && db->known()) {
      if (da->value != db->value) return std::nullopt;
      out[i] = *da;
      continue;
    }
    // At least one side is symbolic or unknown: prefer what is known.
    if (da->known()) out[i] = *da;
    else if (db->known()) out[i] = *db;
    else if (*da == *db) out[i] = *da;
    else if (da->symbolic()) out[i] = *da;
    else out[i] = *db;
  }
  return out;
}

Dims unknown_dims(const InferContext& ctx, int64_t rank) {
  if (rank < 0 || rank > kMaxRank)
    ctx.fail("an output of rank " + std::to_string(rank) + " (kiln supports ranks up to " + std::to_string(kMaxRank) + ")");
  return Dims(static_cast<size_t>(rank), Dim::unknown());
}

int64_t normalize_axis(const InferContext& ctx, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1))
    ctx.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

InferContext infer_node(const Node& node, const std::vector<const TensorType*>& types,
                        const std::vector<const Tensor*>& values,
                        const std::vector<const Dims*>& symbolic) {
  const OpSchema* schema = OpRegistry::instance().find(node.op, node.domain);
  if (!schema) throw node.error(ErrorKind::kUnsupported, "kiln has no op '" + node.op + "'");
  InferContext ctx{node, types, values, symbolic, {}, {}};
  int n_in = static_cast<int>(node.inputs.size());
  while (n_in > 0 && node.inputs[n_in - 1].empty()) --n_in;
  if (n_in < schema->min_inputs || n_in > schema->max_inputs)
    ctx.fail("takes " + std::to_string(schema->min_inputs) + " to " +
             std::to_string(schema->max_inputs) + " inputs, has " + std::to_string(n_in));
  int n_out = static_cast<int>(node.outputs.size());
  if (n_out < schema->min_outputs || n_out > schema->max_outputs)
    ctx.fail("has " + std::to_string(n_out) + " outputs, expected " +
             std::to_string(schema->min_outputs) + " to " + std::to_string(schema->max_outputs));
  for (int i = schema->min_inputs; i > 0; --i)
    if (!ctx.has_input(static_cast<size_t>(i - 1)))
      ctx.fail("required input " + std::to_string(i - 1) + " is missing");
  ctx.output_types.resize(node.outputs.size());
  ctx.output_symbolic.resize(node.outputs.size());
  try {
    schema->infer(ctx);
  } catch (Error& e) {
    // Errors of the helpers a schema calls (checked size arithmetic: ir/sizes.h) name the node here.
    if (e.node_name().empty()) e.node(node.name, node.op);
    throw;
  }
  return ctx;
}

namespace {
// Merges an inferred type with a declared one (value_info / graph output): declared dims fill
// what inference left unknown; known dims that disagree are a contradiction in the model.
void merge_declared(const Node& node, const std::string& value_name, TensorType& inferred,
                    const TensorType& declared) {
  if (declared.dtype != DType::kUndefined && inferred.dtype != DType::kUndefined &&
      declared.dtype != inferred.dtype)
    throw node.error(ErrorKind::kInvalidModel,
                     "output '" + value_name + "' is declared " + to_string(declared.dtype) +
                         " but computes " + to_string(inferred.dtype));
  if (!declared.shape) return;
  if (!inferred.shape) {
    inferred.shape = declared.shape;
    return;
  }
  if (inferred.shape->size() != declared.shape->size())
    throw node.error(ErrorKind::kInvalidModel,
                     "output '" + value_name + "' is declared with shape " +
                         dims_to_string(*declared.shape) + " but computes " +
                         dims_to_string(*inferred.shape));
  for (size_t i = 0; i < declared.shape->size(); ++i) {
    Dim& d = (*inferred.shape)[i];
    const Dim& decl = (*declared.shape)[i];
    if (d.known() && decl.known() && d.value != decl.value)
      throw node.error(ErrorKind::kInvalidModel,
                       "output '" + value_name + "' is declared with shape " +
                           dims_to_string(*declared.shape) + " but computes " +
                           dims_to_string(*inferred.shape));
    if (!d.known() && (decl.known() || (!d.symbolic() && decl.symbolic()))) d = decl;
  }
}
// A value's symbolic elements from inference, completed by what an earlier step learned
// about the same value (passes::probe_symbolic_values finds elements that go through
// arithmetic inference cannot follow, such as N*12 or torch's expand(-1) Where pattern).
std::optional<Dims> merge_symbolic(std::optional<Dims> inferred, const std::optional<Dims>& earlier) {
  if (!earlier) return inferred;
  if (!inferred) return earlier;
  if (inferred->size() != earlier->size()) return inferred;
  for (size_t i = 0; i < inferred->size(); ++i) {
    Dim& d = (*inferred)[i];
    const Dim& e = (*earlier)[i];
    if (!d.known() && (e.known() || (!d.symbolic() && e.symbolic()))) d = e;
  }
  return inferred;
}

}  // namespace

void reinfer_shapes(Graph& graph) {
  for (const auto& [name, value] : graph.values())
    if (!value.constant && std::find(graph.inputs.begin(), graph.inputs.end(), name) == graph.inputs.end()) {
      Value& v = graph.value(name);
      if (v.type.shape && !all_known(*v.type.shape)) v.type.shape.reset();
      v.symbolic_value.reset();
    }
  infer_shapes(graph);
}

void infer_shapes(Graph& graph) {
  for (const Node& node : graph.nodes) {
    std::vector<const TensorType*> types;
    std::vector<const Tensor*> values;
    std::vector<const Dims*> symbolic;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const std::string& in = node.inputs[i];
      if (in.empty()) {
        types.push_back(nullptr);
        values.push_back(nullptr);
        symbolic.push_back(nullptr);
        continue;
      }
      const Value* v = graph.find_value(in);
      if (!v || v->type.dtype == DType::kUndefined)
        throw node.error(ErrorKind::kInvalidModel, "input '" + in + "' has no known type")
            .input(static_cast<int>(i));
      types.push_back(&v->type);
      values.push_back(v->constant ? &*v->constant : nullptr);
      symbolic.push_back(v->symbolic_value ? &*v->symbolic_value : nullptr);
    }
    InferContext ctx = infer_node(node, types, values, symbolic);
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      if (node.outputs[o].empty()) continue;
      Value* existing = graph.find_value(node.outputs[o]);
      TensorType t = ctx.output_types[o];
      if (existing) merge_declared(node, node.outputs[o], t, existing->type);
      Value v;
      v.name = node.outputs[o];
      v.type = std::move(t);
      v.symbolic_value = merge_symbolic(ctx.output_symbolic[o], existing ? existing->symbolic_value : std::nullopt);
      if (existing && existing->constant) v.constant = existing->constant;
      graph.set_value(std::move(v));
    }
  }
}

int64_t node_flops(const Graph& graph, const Node& node) {
  std::vector<const TensorType*> inputs, outputs;
  for (const std::string& in : node.inputs) {
    const Value* v = in.empty() ? nullptr : graph.find_value(in);
    inputs.push_back(v ? &v->type : nullptr);
  }
  for (const std::string& out : node.outputs) {
    const Value* v = out.empty() ? nullptr : graph.find_value(out);
    outputs.push_back(v ? &v->type : nullptr);
  }
  return node_flops(node, std::move(inputs), std::move(outputs));
}

int64_t node_flops(const Node& node, std::vector<const TensorType*> inputs, std::vector<const TensorType*> outputs) {
  const OpSchema* schema = OpRegistry::instance().find(node.op, node.domain);
  if (!schema || !schema->flops) return 0;
  return schema->flops(FlopsContext{node, std::move(inputs), std::move(outputs)});
}

}  // namespace kiln::ir
