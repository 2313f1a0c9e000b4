// Schemas of reductions (Reduce*, with axes as an input as in opset 18) and ArgMax/ArgMin.
#include "ops/reduce.h"

#include <algorithm>

#include "ir/op_schema.h"

namespace kiln::ir {

const char* const kReduceOps[] = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                                  "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};

std::vector<int64_t> reduce_axes(const Node& node, const std::optional<std::vector<int64_t>>& axes, int64_t rank,
                                 bool* noop) {
  *noop = false;
  std::vector<int64_t> out;
  if (!axes || axes->empty()) {
    if (node.attrs.get_int("noop_with_empty_axes", 0) != 0) {
      *noop = true;
      return out;
    }
    for (int64_t i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : *axes) {
    if (a < -rank || a >= std::max<int64_t>(rank, 1))
      throw node.error(ErrorKind::kInvalidModel, "axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    out.push_back(a < 0 ? a + rank : a);
  }
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    throw node.error(ErrorKind::kInvalidModel, "an axis is repeated in axes");
  // A scalar's axis 0 (accepted, as exporters write it) is its one element: no dimension to
  // index, the same reduction as a scalar's with no axes (fuzz_onnx_import: ReduceL1 of a uint8
  // scalar with axes [0] indexed a rank-0 axis list).
  if (rank == 0) out.clear();
  return out;
}

namespace {

void infer_reduce(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  const bool bool_ok = x.dtype == DType::kBool && (ctx.node.op == "ReduceMax" || ctx.node.op == "ReduceMin");
  if (!is_float(x.dtype) && !is_integer(x.dtype) && !bool_ok)
    ctx.fail("input type " + to_string(x.dtype) + " is not numeric");
  const bool keepdims = ctx.node.attrs.get_int("keepdims", 1) != 0;
  std::optional<std::vector<int64_t>> axes;
  if (ctx.has_input(1)) {
    if (ctx.dtype(1) != DType::kInt64) ctx.fail("axes must be int64, is " + to_string(ctx.dtype(1)));
    // A constant gives the axes directly (negative ones included); a shape-derived value
    // only when every element is known.
    if (const Tensor* t = ctx.value(1)) {
      axes = t->to_int_vector();
    } else if (std::optional<Dims> e = ctx.int_elements(1); e && all_known(*e)) {
      axes = known_values(*e);
    } else {
      // Axes computed at run time: the rank is known only when dims are kept.
      std::optional<Dims> shape;
      if (x.shape && keepdims) shape = Dims(x.shape->size(), Dim::unknown());
      ctx.set_output(0, x.dtype, shape);
      return;
    }
  }
  if (!x.shape) {
    ctx.set_output(0, x.dtype, std::nullopt);
    return;
  }
  const Dims& dims = *x.shape;
  bool noop = false;
  std::vector<int64_t> red = reduce_axes(ctx.node, axes, static_cast<int64_t>(dims.size()), &noop);
  Dims out;
  for (size_t i = 0; i < dims.size(); ++i) {
    bool reduced = !noop && std::binary_search(red.begin(), red.end(), static_cast<int64_t>(i));
    if (!reduced) out.push_back(dims[i]);
    else if (keepdims) out.push_back(Dim(1));
  }
  ctx.set_output(0, x.dtype, out);
}

void infer_arg(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  const bool bool_ok = x.dtype == DType::kBool && (ctx.node.op == "ReduceMax" || ctx.node.op == "ReduceMin");
  if (!is_float(x.dtype) && !is_integer(x.dtype) && !bool_ok)
    ctx.fail("input type " + to_string(x.dtype) + " is not numeric");
  if (!x.shape) {
    ctx.set_output(0, DType::kInt64, std::nullopt);
    return;
  }
  const Dims& dims = *x.shape;
  int64_t axis = normalize_axis(ctx, ctx.node.attrs.get_int("axis", 0), static_cast<int64_t>(dims.size()));
  const bool keepdims = ctx.node.attrs.get_int("keepdims", 1) != 0;
  Dims out;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (static_cast<int64_t>(i) != axis) out.push_back(dims[i]);
    else if (keepdims) out.push_back(Dim(1));
  }
  ctx.set_output(0, DType::kInt64, out);
}

int64_t input_numel(const FlopsContext& c) { return FlopsContext::numel(c.input_types[0]); }

}  // namespace

KILN_REGISTER_OPS(reduce) {
  for (const char* op : kReduceOps) {
    OpSchema s;
    s.op = op;
    s.min_inputs = 1;
    s.max_inputs = 2;
    s.infer = infer_reduce;
    s.flops = input_numel;
    s.limits = "axes must be known when the engine is built";
    registry.add(std::move(s));
  }
  for (const char* op : {"ArgMax", "ArgMin"}) {
    OpSchema s;
    s.op = op;
    s.infer = infer_arg;
    s.flops = input_numel;
    registry.add(std::move(s));
  }
}

}  // namespace kiln::ir
