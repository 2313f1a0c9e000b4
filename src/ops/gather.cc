// Schemas of Gather, GatherElements, GatherND, Compress, ScatterElements and ScatterND. Gather with constant
// indices on a 1-D shape value picks its symbolic elements (Shape -> Gather(0) gives N).
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void check_indices(const InferContext& ctx, size_t i) {
  DType t = ctx.dtype(i);
  if (t != DType::kInt64 && t != DType::kInt32) ctx.fail("indices must be int32 or int64, are " + to_string(t));
}

void infer_gather(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  check_indices(ctx, 1);
  if (!ctx.shape_known(0) || !ctx.shape_known(1)) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  const Dims& data = ctx.shape(0);
  const Dims& idx = ctx.shape(1);
  if (data.empty()) ctx.fail("data must have rank >= 1");
  int64_t axis = static_cast<int64_t>(dim_axis(ctx, ctx.node.attrs.get_int("axis", 0), static_cast<int64_t>(data.size())));
  size_t a = static_cast<size_t>(axis);
  Dims out(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(a));
  out.insert(out.end(), idx.begin(), idx.end());
  out.insert(out.end(), data.begin() + static_cast<std::ptrdiff_t>(a) + 1, data.end());
  ctx.set_output(0, dtype, out);

  std::optional<std::vector<int64_t>> indices = known_ints(ctx, 1);
  const Dim& d = data[a];
  if (indices && d.known())
    for (int64_t i : *indices)
      if (i < -d.value || i >= d.value)
        ctx.fail("index " + std::to_string(i) + " is out of range for axis " + std::to_string(axis) + " of size " +
                 std::to_string(d.value));
  if (data.size() == 1 && idx.size() <= 1 && indices && d.known()) {
    std::optional<Dims> sv = ctx.int_elements(0);
    if (sv && static_cast<int64_t>(sv->size()) == d.value) {
      Dims value;
      for (int64_t i : *indices) value.push_back((*sv)[static_cast<size_t>(i < 0 ? i + d.value : i)]);
      ctx.set_symbolic(0, std::move(value));
    }
  }
}

void infer_gather_elements(InferContext& ctx) {
  check_indices(ctx, 1);
  if (ctx.shape_known(0) && ctx.shape_known(1)) {
    if (ctx.shape(0).size() != ctx.shape(1).size())
      ctx.fail("data has rank " + std::to_string(ctx.shape(0).size()) + ", indices rank " + std::to_string(ctx.shape(1).size()));
    dim_axis(ctx, ctx.node.attrs.get_int("axis", 0), static_cast<int64_t>(ctx.shape(0).size()));
  }
  ctx.set_output(0, ctx.dtype(0), ctx.type(1).shape);
}

void infer_gather_nd(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  if (ctx.dtype(1) != DType::kInt64) ctx.fail("indices must be int64");
  if (!ctx.shape_known(0) || !ctx.shape_known(1)) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  const Dims& data = ctx.shape(0);
  const Dims& idx = ctx.shape(1);
  size_t b = static_cast<size_t>(ctx.node.attrs.get_int("batch_dims", 0));
  if (idx.empty() || b >= idx.size() || b >= data.size()) ctx.fail("batch_dims is too large for the ranks of data and indices");
  for (size_t i = 0; i < b; ++i)
    if (data[i].known() && idx[i].known() && data[i].value != idx[i].value)
      ctx.fail("batch dim " + std::to_string(i) + " is " + std::to_string(data[i].value) + " in data and " +
               std::to_string(idx[i].value) + " in indices");
  const Dim& last = idx.back();
  if (!last.known()) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  size_t k = static_cast<size_t>(last.value);
  if (b + k > data.size())
    ctx.fail("indices' last dim (" + std::to_string(k) + ") plus batch_dims exceeds the data rank " + std::to_string(data.size()));
  Dims out(idx.begin(), idx.end() - 1);
  out.insert(out.end(), data.begin() + static_cast<std::ptrdiff_t>(b + k), data.end());
  ctx.set_output(0, dtype, out);
}

void infer_scatter_elements(InferContext& ctx) {
  check_indices(ctx, 1);
  if (ctx.dtype(2) != ctx.dtype(0)) ctx.fail("updates must have the data's type");
  std::string r = ctx.node.attrs.get_string("reduction", "none");
  if (r != "none" && r != "add" && r != "mul" && r != "max" && r != "min") ctx.fail("unknown reduction '" + r + "'");
  if (ctx.shape_known(0) && ctx.shape_known(1) && ctx.shape(0).size() != ctx.shape(1).size())
    ctx.fail("data has rank " + std::to_string(ctx.shape(0).size()) + ", indices rank " + std::to_string(ctx.shape(1).size()));
  if (ctx.shape_known(0))
    dim_axis(ctx, ctx.node.attrs.get_int("axis", 0), static_cast<int64_t>(ctx.shape(0).size()));
  ctx.set_output(0, ctx.dtype(0), ctx.type(0).shape);
}

// ScatterND: data [r dims], indices [..., k] (k <= r), updates [indices' dims but the last] +
// data's dims from k on; the output is the data with each indexed slice written (or reduced).
void infer_scatter_nd(InferContext& ctx) {
  if (ctx.dtype(1) != DType::kInt64) ctx.fail("indices must be int64");
  if (ctx.dtype(2) != ctx.dtype(0)) ctx.fail("updates must have the data's type");
  const std::string r = ctx.node.attrs.get_string("reduction", "none");
  if (r != "none" && r != "add" && r != "mul" && r != "max" && r != "min") ctx.fail("unknown reduction '" + r + "'");
  if (ctx.shape_known(0) && ctx.shape_known(1) && ctx.shape_known(2)) {
    const Dims &data = ctx.shape(0), &idx = ctx.shape(1), &upd = ctx.shape(2);
    if (idx.empty()) ctx.fail("indices must have rank 1 or more");
    if (idx.back().known()) {
      const int64_t k = idx.back().value;
      if (k < 1 || k > static_cast<int64_t>(data.size()))
        ctx.fail("indices' last dim (" + std::to_string(k) + ") must be 1 to the data's rank (" + std::to_string(data.size()) + ")");
      Dims want(idx.begin(), idx.end() - 1);
      want.insert(want.end(), data.begin() + k, data.end());
      if (want.size() != upd.size()) ctx.fail("updates must have shape " + dims_to_string(want) + ", not " + dims_to_string(upd));
      for (size_t i = 0; i < want.size(); ++i)
        if (want[i].known() && upd[i].known() && want[i].value != upd[i].value)
          ctx.fail("updates must have shape " + dims_to_string(want) + ", not " + dims_to_string(upd));
    }
  }
  ctx.set_output(0, ctx.dtype(0), ctx.type(0).shape);
}

// Compress: the slices along `axis` (of the flattened input without it) whose condition is
// true; the length is known when the condition is (always on the CPU engine, which runs the
// schema on the actual inputs).
void infer_compress(InferContext& ctx) {
  if (ctx.dtype(1) != DType::kBool) ctx.fail("the condition must be bool");
  if (ctx.shape_known(1) && ctx.shape(1).size() != 1) ctx.fail("the condition must have rank 1");
  const bool has_axis = ctx.node.attrs.has("axis");
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, ctx.dtype(0), std::nullopt);
    return;
  }
  Dims dims = ctx.shape(0);
  Dim along = Dim::unknown();
  size_t axis = 0;
  if (has_axis) {
    if (dims.empty()) ctx.fail("axis is given but the input is a scalar");
    axis = static_cast<size_t>(normalize_axis(ctx, ctx.node.attrs.get_int("axis", 0), static_cast<int64_t>(dims.size())));
    along = dims[axis];
  } else {
    int64_t n = 1;
    for (const Dim& d : dims) {
      if (!d.known()) { n = -1; break; }
      n = d.value == 0 || n == 0 ? 0 : (n > INT64_MAX / d.value ? -1 : n * d.value);
      if (n < 0) break;
    }
    if (n >= 0) along = Dim(n);
  }
  Dim count = Dim::unknown();
  if (const Tensor* c = ctx.value(1)) {
    int64_t taken = 0;
    for (int64_t i = 0; i < c->numel(); ++i) {
      if (c->value_as_int(i) == 0) continue;
      if (along.known() && i >= along.value)
        ctx.fail("the condition selects index " + std::to_string(i) + " of an axis of " + std::to_string(along.value));
      ++taken;
    }
    count = Dim(taken);
  }
  if (has_axis) dims[axis] = count;
  else dims = Dims{count};
  ctx.set_output(0, ctx.dtype(0), dims);
}

}  // namespace

KILN_REGISTER_OPS(gather) {
  registry.add({"Gather", "", 2, 2, 1, 1, infer_gather, nullptr, ""});
  registry.add({"GatherElements", "", 2, 2, 1, 1, infer_gather_elements, nullptr, ""});
  registry.add({"GatherND", "", 2, 2, 1, 1, infer_gather_nd, nullptr, ""});
  registry.add({"Compress", "", 2, 2, 1, 1, infer_compress, nullptr,
                "output length depends on the data: unknown when building, known when run"});
  registry.add({"ScatterElements", "", 3, 3, 1, 1, infer_scatter_elements, nullptr, ""});
  registry.add({"ScatterND", "", 3, 3, 1, 1, infer_scatter_nd, nullptr, ""});
}

}  // namespace kiln::ir
