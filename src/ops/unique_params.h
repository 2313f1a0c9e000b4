// Unique's arithmetic, shared by its schema (which sizes the outputs from the actual input on the
// CPU engine) and its CPU kernel: the distinct elements of x (flattened), or its distinct slices
// along `axis`, compared as numbers, slice by slice in row-major order.
#pragma once

#include <algorithm>
#include <numeric>
#include <optional>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::ops {

struct UniqueSlices {
  int64_t outer = 1, along = 0, inner = 1;  // x seen as [outer, along, inner]
  std::vector<int64_t> first;    // per distinct slice, in output order: its first index along the axis
  std::vector<int64_t> inverse;  // per slice of x: its distinct slice's position in the output
  std::vector<int64_t> counts;   // per distinct slice: how often it occurs
};

inline UniqueSlices unique_slices(const Tensor& x, std::optional<int64_t> axis, bool sorted) {
  UniqueSlices u;
  u.along = x.numel();
  if (axis) {
    const int64_t a = *axis < 0 ? *axis + x.rank() : *axis;
    u.along = x.dim(static_cast<int>(a));
    u.outer = u.inner = 1;
    for (int64_t d = 0; d < a; ++d) u.outer *= x.dim(static_cast<int>(d));
    for (int64_t d = a + 1; d < x.rank(); ++d) u.inner *= x.dim(static_cast<int>(d));
  }
  const bool integer = is_integer(x.dtype()) || x.dtype() == DType::kBool;
  // -1, 0, 1: slice p against slice q.
  auto compare = [&](int64_t p, int64_t q) {
    for (int64_t o = 0; o < u.outer; ++o)
      for (int64_t i = 0; i < u.inner; ++i) {
        const int64_t ip = (o * u.along + p) * u.inner + i, iq = (o * u.along + q) * u.inner + i;
        if (integer) {
          const int64_t a = x.value_as_int(ip), b = x.value_as_int(iq);
          if (a != b) return a < b ? -1 : 1;
        } else {
          const double a = x.value_as_double(ip), b = x.value_as_double(iq);
          if (a != b) return a < b ? -1 : 1;
        }
      }
    return 0;
  };
  std::vector<int64_t> order(static_cast<size_t>(u.along));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) { return compare(p, q) < 0; });
  // Groups of equal slices, in sorted order; the first of each group is its first occurrence.
  std::vector<int64_t> group_of(static_cast<size_t>(u.along));
  for (size_t k = 0; k < order.size(); ++k) {
    if (k == 0 || compare(order[k - 1], order[k]) != 0) {
      u.first.push_back(order[k]);
      u.counts.push_back(0);
    }
    group_of[static_cast<size_t>(order[k])] = static_cast<int64_t>(u.first.size()) - 1;
    ++u.counts.back();
  }
  std::vector<int64_t> position(u.first.size());
  std::iota(position.begin(), position.end(), 0);
  if (!sorted) {
    // Output in order of first occurrence.
    std::vector<int64_t> by_first(u.first.size());
    std::iota(by_first.begin(), by_first.end(), 0);
    std::sort(by_first.begin(), by_first.end(), [&](int64_t a, int64_t b) { return u.first[a] < u.first[b]; });
    std::vector<int64_t> first, counts;
    for (size_t k = 0; k < by_first.size(); ++k) {
      first.push_back(u.first[static_cast<size_t>(by_first[k])]);
      counts.push_back(u.counts[static_cast<size_t>(by_first[k])]);
      position[static_cast<size_t>(by_first[k])] = static_cast<int64_t>(k);
    }
    u.first = first;
    u.counts = counts;
  }
  for (int64_t j = 0; j < u.along; ++j) u.inverse.push_back(position[static_cast<size_t>(group_of[static_cast<size_t>(j)])]);
  return u;
}

}  // namespace kiln::ops
