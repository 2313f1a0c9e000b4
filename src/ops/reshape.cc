// Schemas of Reshape and Flatten. Reshape reads its target shape through int_elements, so a
// shape computed from symbolic dims (Shape -> Gather -> Concat) gives a symbolic output shape.
#include <algorithm>

#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

std::string count_string(const DimProduct& p) {
  std::string s = std::to_string(p.known);
  for (const auto& [sym, n] : p.symbols)
    for (int k = 0; k < n; ++k) s += "*" + sym;
  return s;
}

void infer_reshape(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  if (ctx.dtype(1) != DType::kInt64) ctx.fail("the shape input must be int64, is " + to_string(ctx.dtype(1)));
  std::optional<Dims> target = ctx.int_elements(1);
  if (!target) {
    // The target is computed at run time: only its length (the output rank) may be known.
    if (ctx.shape_known(1) && ctx.shape(1).size() == 1 && ctx.shape(1)[0].known())
      ctx.set_output(0, dtype, unknown_dims(ctx, ctx.shape(1)[0].value));
    else
      ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  // Dim cannot hold negative numbers, so a literal -1 reads as "unknown"; the raw constant
  // tells them apart when there is one.
  std::optional<std::vector<int64_t>> raw = raw_ints(ctx, 1);
  bool allowzero = ctx.node.attrs.get_int("allowzero", 0) != 0;
  const Dims* in = ctx.shape_known(0) ? &ctx.shape(0) : nullptr;

  Dims out(target->size());
  std::vector<size_t> infer_slots;  // -1 (or, without a constant, unknown) elements
  for (size_t i = 0; i < target->size(); ++i) {
    const Dim& t = (*target)[i];
    int64_t v = raw ? (*raw)[i] : t.value;
    if (t.symbolic()) {
      out[i] = t;
    } else if (raw && v < -1) {
      ctx.fail("shape element " + std::to_string(i) + " is " + std::to_string(v) + " (only -1 and sizes >= 0 are allowed)");
    } else if (v == 0 && !allowzero) {
      // 0 copies the input's dim at the same position.
      if (!in) out[i] = Dim::unknown();
      else if (i >= in->size())
        ctx.fail("shape element " + std::to_string(i) + " is 0 (copy the input dim) but the input has rank " +
                 std::to_string(in->size()));
      else out[i] = (*in)[i];
    } else if (v >= 0) {
      out[i] = Dim(v);
    } else {
      infer_slots.push_back(i);
    }
  }
  if (raw && infer_slots.size() > 1) ctx.fail("the shape has more than one -1");
  if (allowzero && infer_slots.size() == 1 && raw)
    for (int64_t v : *raw)
      if (v == 0) ctx.fail("the shape has both -1 and 0 while allowzero=1");

  if (in) {
    DimProduct in_count = dim_product(*in, 0, in->size());
    DimProduct out_count;
    for (size_t i = 0; i < out.size(); ++i)
      if (std::find(infer_slots.begin(), infer_slots.end(), i) == infer_slots.end()) out_count.add(out[i]);
    // Symbols must cancel between the two sides for anything to be concluded.
    bool comparable = !in_count.unknown && !out_count.unknown;
    std::map<std::string, int> rest = in_count.symbols;
    if (comparable)
      for (const auto& [sym, n] : out_count.symbols) {
        if (rest[sym] < n) { comparable = false; break; }
        rest[sym] -= n;
        if (!rest[sym]) rest.erase(sym);
      }
    auto incompatible = [&]() {
      ctx.fail("cannot reshape " + dims_to_string(*in) + " (" + count_string(in_count) + " elements) to " +
               dims_to_string(out) + " (" + count_string(out_count) + " elements)");
    };
    if (infer_slots.empty()) {
      if (comparable && rest.empty() && in_count.known != out_count.known) incompatible();
    } else if (infer_slots.size() == 1 && comparable) {
      // One -1 (or one unknown element, which the element count pins down all the same).
      Dim& slot = out[infer_slots[0]];
      if (out_count.known == 0) {
        if (in_count.known != 0 && raw) incompatible();
      } else if (in_count.known % out_count.known != 0) {
        if (rest.empty()) incompatible();
      } else {
        int64_t q = in_count.known / out_count.known;
        if (rest.empty()) slot = Dim(q);
        else if (q == 1 && rest.size() == 1 && rest.begin()->second == 1) slot = Dim::named(rest.begin()->first);
      }
    }
  }
  ctx.set_output(0, dtype, out);
  // Reshaping a shape value (e.g. [N] to a scalar) keeps its elements.
  if (out.size() <= 1) {
    std::optional<Dims> sv = ctx.int_elements(0);
    if (sv && (out.empty() ? sv->size() == 1 : (out[0].known() && out[0].value == static_cast<int64_t>(sv->size()))))
      ctx.set_symbolic(0, *sv);
  }
}

void infer_flatten(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, dtype, Dims{Dim::unknown(), Dim::unknown()});
    return;
  }
  const Dims& in = ctx.shape(0);
  int64_t rank = static_cast<int64_t>(in.size());
  int64_t axis = ctx.node.attrs.get_int("axis", 1);
  if (axis < -rank || axis > rank)
    ctx.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  if (axis < 0) axis += rank;
  size_t a = static_cast<size_t>(axis);
  ctx.set_output(0, dtype, Dims{dim_product(in, 0, a).as_dim(), dim_product(in, a, in.size()).as_dim()});
}

}  // namespace

KILN_REGISTER_OPS(reshape) {
  registry.add({"Reshape", "", 2, 2, 1, 1, infer_reshape, nullptr, ""});
  registry.add({"Flatten", "", 1, 1, 1, 1, infer_flatten, nullptr, ""});
}

}  // namespace kiln::ir
