// Schema of Slice (starts/ends/axes/steps as inputs, as since opset 10). Slicing a shape
// value keeps the selected symbolic elements.
#include <algorithm>
#include <limits>

#include "ops/slice_params.h"

namespace kiln::ir {

namespace {

void infer_slice(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  const Dims& in = ctx.shape(0);
  int64_t rank = static_cast<int64_t>(in.size());
  std::optional<std::vector<int64_t>> starts = known_ints(ctx, 1), ends = known_ints(ctx, 2);
  std::optional<std::vector<int64_t>> axes, steps;
  bool axes_known = true;
  if (ctx.has_input(3)) axes_known = (axes = known_ints(ctx, 3)).has_value();
  if (ctx.has_input(4)) {
    steps = known_ints(ctx, 4);
    if (!steps) {
      ctx.set_output(0, dtype, Dims(in.size(), Dim::unknown()));
      return;
    }
  }
  if (!axes_known) {
    ctx.set_output(0, dtype, Dims(in.size(), Dim::unknown()));
    return;
  }
  if (!starts || !ends) {
    // Only the sliced axes change; which ones they are is known.
    Dims out = in;
    size_t count = ctx.shape_known(1) && ctx.shape(1).size() == 1 && ctx.shape(1)[0].known()
                       ? static_cast<size_t>(ctx.shape(1)[0].value) : in.size();
    for (size_t k = 0; k < count; ++k) {
      if (!axes) {
        if (k < out.size()) out[k] = Dim::unknown();
      } else if (k < axes->size()) {
        out[dim_axis(ctx, (*axes)[k], rank)] = Dim::unknown();
      }
    }
    ctx.set_output(0, dtype, out);
    return;
  }
  std::vector<SliceAxis> params = slice_params(ctx.node, in, *starts, *ends, axes, steps);
  Dims out = in;
  for (const SliceAxis& p : params) out[static_cast<size_t>(p.axis)] = p.length;
  ctx.set_output(0, dtype, out);

  // A 1-D shape value sliced with known bounds: pick its elements.
  if (rank == 1 && in[0].known()) {
    std::optional<Dims> sv = ctx.int_elements(0);
    if (sv && static_cast<int64_t>(sv->size()) == in[0].value && out[0].known()) {
      int64_t start = 0, step = 1;
      for (const SliceAxis& p : params) start = p.start, step = p.step;
      Dims value;
      for (int64_t i = 0; i < out[0].value; ++i) value.push_back((*sv)[static_cast<size_t>(start + i * step)]);
      ctx.set_symbolic(0, std::move(value));
    }
  }
}

}  // namespace

std::vector<SliceAxis> slice_params(const Node& node, const Dims& in, const std::vector<int64_t>& starts,
                                    const std::vector<int64_t>& ends, const std::optional<std::vector<int64_t>>& axes_in,
                                    const std::optional<std::vector<int64_t>>& steps_in) {
  auto fail = [&node](const std::string& m) { throw node.error(ErrorKind::kInvalidModel, m); };
  int64_t rank = static_cast<int64_t>(in.size());
  size_t n = starts.size();
  if (ends.size() != n) fail("starts has " + std::to_string(n) + " values, ends " + std::to_string(ends.size()));
  std::vector<int64_t> axes;
  if (axes_in) axes = *axes_in;
  else
    for (size_t k = 0; k < n; ++k) axes.push_back(static_cast<int64_t>(k));
  if (axes.size() != n) fail("axes has " + std::to_string(axes.size()) + " values, starts " + std::to_string(n));
  if (steps_in && steps_in->size() != n)
    fail("steps has " + std::to_string(steps_in->size()) + " values, starts " + std::to_string(n));
  std::vector<bool> seen(in.size(), false);
  std::vector<SliceAxis> out;
  for (size_t k = 0; k < n; ++k) {
    SliceAxis p;
    p.axis = axes[k] < 0 ? axes[k] + rank : axes[k];
    if (p.axis < 0 || p.axis >= rank) fail("axis " + std::to_string(axes[k]) + " is out of range for rank " + std::to_string(rank));
    if (seen[static_cast<size_t>(p.axis)]) fail("axis " + std::to_string(axes[k]) + " is sliced twice");
    seen[static_cast<size_t>(p.axis)] = true;
    p.step = steps_in ? (*steps_in)[k] : 1;
    if (p.step == 0) fail("a step is 0");
    const Dim& d = in[static_cast<size_t>(p.axis)];
    int64_t s = starts[k], e = ends[k];
    if (!d.known()) {
      // A symbolic dim keeps its name only when the slice takes all of it.
      bool whole = p.step == 1 && s == 0 && e >= (int64_t{1} << 31);
      p.length = whole ? d : Dim::unknown();
      out.push_back(p);
      continue;
    }
    int64_t dim = d.value;
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    // Elements in a span of `span` positions taken every `step`: a ceil division with no
    // span + step to overflow (a step is any int64 from the file, INT64_MIN included).
    auto count = [](int64_t span, int64_t step) {
      if (span <= 0) return int64_t{0};
      if (step == std::numeric_limits<int64_t>::min()) return int64_t{1};
      const int64_t stride = step < 0 ? -step : step;
      return span / stride + (span % stride != 0);
    };
    if (p.step > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      p.length = Dim(count(e - s, p.step));
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      p.length = Dim(count(s - e, p.step));
    }
    p.start = s;
    out.push_back(p);
  }
  return out;
}

bool slice_reads_leading_elements(const std::vector<int64_t>& in, const std::vector<SliceAxis>& params) {
  std::vector<int64_t> out = in;
  for (const SliceAxis& p : params) {
    if (!p.length.known() || p.length.value == 0) return false;
    if (p.length.value > 1 && p.step != 1) return false;  // a step over one element reads it alone
    if (p.start != 0) return false;
    out[static_cast<size_t>(p.axis)] = p.length.value;
  }
  // Axes before the first one that keeps several elements read index 0 only; that axis may be
  // cut short; every axis after it must be whole, or each of its rows would skip elements.
  if (std::find(out.begin(), out.end(), 0) != out.end()) return false;  // empty
  size_t first_several = 0;
  while (first_several < out.size() && out[first_several] == 1) ++first_several;
  for (size_t a = first_several + 1; a < out.size(); ++a)
    if (out[a] != in[a]) return false;
  return true;
}

KILN_REGISTER_OPS(slice) {
  registry.add({"Slice", "", 3, 5, 1, 1, infer_slice, nullptr, ""});
}

}  // namespace kiln::ir
