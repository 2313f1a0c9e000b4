// Numpy-style broadcasting for CPU kernels of elementwise ops (binary ops, variadic ops,
// Where).
//
// The output shape is split into rows: dimensions of size 1 are dropped and neighbouring
// dimensions that every input either reads fully or broadcasts are merged. After that, the
// innermost dimension of every input has stride 1 or 0, so a kernel's inner loop is one of a
// few contiguous forms the compiler vectorizes: equal shapes become one long row, and an SE
// block's [N,C,H,W] * [N,C,1,1] becomes N*C rows of H*W elements times one scalar.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::cpu {

struct BroadcastPlan {
  std::vector<int64_t> dims;                  // merged output dims (at least one)
  std::vector<std::vector<int64_t>> strides;  // per input, per merged dim; 0 = broadcast
  int64_t inner() const { return dims.back(); }
  int64_t rows() const {
    int64_t r = 1;
    for (size_t d = 0; d + 1 < dims.size(); ++d) r *= dims[d];
    return r;
  }
  // Element offsets of each input at the start of `row`.
  void row_offsets(int64_t row, int64_t* offsets) const {
    for (size_t i = 0; i < strides.size(); ++i) offsets[i] = 0;
    for (size_t d = dims.size() - 1; d-- > 0;) {
      int64_t idx = row % dims[d];
      row /= dims[d];
      for (size_t i = 0; i < strides.size(); ++i) offsets[i] += idx * strides[i][d];
    }
  }
};

// Each input's element offset at the start of consecutive rows of a plan, from a first row on:
// the row's index in each merged dim carried from one row to the next like an odometer's
// digits, with no division per row (a channels-last [1, H, W, C] * [1, 1, 1, C] is H * W rows of
// C elements, where a division per row took about as long as the row).
class BroadcastCursor {
 public:
  BroadcastCursor(const BroadcastPlan& plan, int64_t row)
      : plan_(plan), index_(plan.dims.size() - 1), offsets_(plan.strides.size()) {
    plan.row_offsets(row, offsets_.data());
    for (size_t d = index_.size(); d-- > 0;) {
      index_[d] = row % plan.dims[d];
      row /= plan.dims[d];
    }
  }
  int64_t offset(size_t input) const { return offsets_[input]; }
  const int64_t* offsets() const { return offsets_.data(); }
  void next() {
    for (size_t d = index_.size(); d-- > 0;) {
      const std::vector<std::vector<int64_t>>& s = plan_.strides;
      if (++index_[d] < plan_.dims[d]) {
        for (size_t i = 0; i < s.size(); ++i) offsets_[i] += s[i][d];
        return;
      }
      index_[d] = 0;
      for (size_t i = 0; i < s.size(); ++i) offsets_[i] -= s[i][d] * (plan_.dims[d] - 1);
    }
  }

 private:
  const BroadcastPlan& plan_;
  std::vector<int64_t> index_, offsets_;
};

inline BroadcastPlan plan_broadcast(const std::vector<int64_t>& out,
                                    const std::vector<const std::vector<int64_t>*>& inputs) {
  const size_t rank = out.size();
  const size_t n = inputs.size();
  // Input dims aligned to the output rank.
  std::vector<std::vector<int64_t>> aligned(n, std::vector<int64_t>(rank, 1));
  for (size_t i = 0; i < n; ++i) {
    const auto& s = *inputs[i];
    for (size_t d = 0; d < s.size(); ++d) aligned[i][rank - s.size() + d] = s[d];
  }
  // Merged dims, innermost first, with each input's extent (1 when broadcast).
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> extents(n);
  std::vector<bool> prev_bcast(n, false);
  for (size_t d = rank; d-- > 0;) {
    if (out[d] == 1) continue;
    std::vector<bool> bcast(n);
    for (size_t i = 0; i < n; ++i) bcast[i] = aligned[i][d] == 1;
    bool merge = !dims.empty() && bcast == prev_bcast;
    if (merge) {
      dims.back() *= out[d];
      for (size_t i = 0; i < n; ++i)
        if (!bcast[i]) extents[i].back() *= out[d];
    } else {
      dims.push_back(out[d]);
      for (size_t i = 0; i < n; ++i) extents[i].push_back(bcast[i] ? 1 : out[d]);
    }
    prev_bcast = bcast;
  }
  BroadcastPlan plan;
  if (dims.empty()) {  // every dim is 1 (or the output is a scalar)
    plan.dims = {1};
    plan.strides.assign(n, std::vector<int64_t>{0});
    return plan;
  }
  plan.dims.assign(dims.rbegin(), dims.rend());
  plan.strides.assign(n, std::vector<int64_t>(plan.dims.size()));
  for (size_t i = 0; i < n; ++i) {
    int64_t stride = 1;
    for (size_t k = 0; k < dims.size(); ++k) {  // innermost first
      size_t d = dims.size() - 1 - k;
      bool broadcast = extents[i][k] == 1 && dims[k] != 1;
      plan.strides[i][d] = broadcast ? 0 : stride;
      stride *= extents[i][k];
    }
  }
  return plan;
}

}  // namespace kiln::cpu
