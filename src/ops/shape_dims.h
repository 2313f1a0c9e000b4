// Helpers for the shape and data-movement schemas: arithmetic on dims that may be symbolic,
// and reading small integer inputs (axes, pads, repeats) that must be known.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/op_schema.h"

namespace kiln::ir {

// The integer elements of input i when every one of them is a known number (a constant or
// a shape chain without symbols); nullopt otherwise (absent, computed at run time, symbolic).
inline std::optional<std::vector<int64_t>> known_ints(const InferContext& ctx, size_t i) {
  if (!ctx.has_input(i)) return std::nullopt;
  std::optional<Dims> e = ctx.int_elements(i);
  if (!e) return std::nullopt;
  std::vector<int64_t> out;
  out.reserve(e->size());
  for (const Dim& d : *e) {
    if (!d.known()) {
      // A known element may also be a negative number (-1 in a Reshape shape): Dim stores
      // those as "unknown" with an empty symbol, so read it back from the tensor if we can.
      const Tensor* t = ctx.value(i);
      if (!t) return std::nullopt;
      return t->to_int_vector();
    }
    out.push_back(d.value);
  }
  return out;
}

// normalize_axis for ops that index a dim of the input: rank 0 has no axis at all (the shared
// normalize_axis accepts axis 0 there, for ops that treat scalars as 1-element vectors).
inline size_t dim_axis(const InferContext& ctx, int64_t axis, int64_t rank) {
  if (rank == 0) ctx.fail("the input is a scalar, which has no axis " + std::to_string(axis));
  return static_cast<size_t>(normalize_axis(ctx, axis, rank));
}

// A dim's factorization for element counting: a known product, the symbols (as a multiset),
// and how many dims are neither known nor symbolic.
struct DimProduct {
  int64_t known = 1;
  std::map<std::string, int> symbols;
  int unknown = 0;

  void add(const Dim& d) {
    // A product past int64 (a malformed model's dims) says nothing: counted as unknown.
    if (d.known() && !__builtin_mul_overflow(known, d.value, &known)) return;
    if (d.known()) ++unknown, known = 1;
    else if (d.symbolic()) ++symbols[d.symbol];
    else ++unknown;
  }
  // As one Dim: the number if all known, the symbol if it is a single symbol times 1.
  Dim as_dim() const {
    if (unknown) return Dim::unknown();
    if (symbols.empty()) return Dim(known);
    if (known == 1 && symbols.size() == 1 && symbols.begin()->second == 1)
      return Dim::named(symbols.begin()->first);
    return Dim::unknown();
  }
};

inline DimProduct dim_product(const Dims& dims, size_t begin, size_t end) {
  DimProduct p;
  for (size_t i = begin; i < end && i < dims.size(); ++i) p.add(dims[i]);
  return p;
}

// Reads the shape-tensor elements of a Value-like source where negative numbers matter
// (Reshape's -1): Dim cannot hold negative numbers, so -1 comes back as unknown; this
// returns the raw numbers from the constant tensor when there is one.
inline std::optional<std::vector<int64_t>> raw_ints(const InferContext& ctx, size_t i) {
  const Tensor* t = ctx.value(i);
  if (!t || (!is_integer(t->dtype()) && t->dtype() != DType::kBool)) return std::nullopt;
  return t->to_int_vector();
}

}  // namespace kiln::ir
