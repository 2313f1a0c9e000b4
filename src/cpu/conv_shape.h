// The shape of a CPU convolution as a 3-D one (1-D and 2-D convs get leading spatial dims of
// size 1), shared by the float kernels (conv.cc) and the INT8 reference (quantized_conv.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "ops/conv_geometry.h"

namespace kiln::cpu {

struct Geo3 {
  int64_t batch = 0, in_c = 0, out_c = 0, group = 1;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1};
  int64_t s[3] = {1, 1, 1}, d[3] = {1, 1, 1}, p[3] = {0, 0, 0};

  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t kernel_size() const { return k[0] * k[1] * k[2]; }
};

inline Geo3 make_geo3(const ir::Node& node, const std::vector<int64_t>& x, const std::vector<int64_t>& w, bool transpose) {
  int spatial = static_cast<int>(x.size()) - 2;
  std::vector<int64_t> wk(w.begin() + 2, w.end()), in(x.begin() + 2, x.end());
  ir::ConvGeometry g = ir::conv_geometry(node, spatial, wk, in, transpose);
  Geo3 r;
  int off = 3 - spatial;
  for (int i = 0; i < spatial; ++i) {
    size_t u = static_cast<size_t>(i);
    r.in[off + i] = in[u];
    r.out[off + i] = ir::conv_output_size(node, g, i, in[u], transpose);
    r.k[off + i] = g.kernel[u];
    r.s[off + i] = g.strides[u];
    r.d[off + i] = g.dilations[u];
    r.p[off + i] = g.pad_begin[u];
  }
  r.batch = x[0];
  r.in_c = x[1];
  r.group = g.group;
  r.out_c = transpose ? w[1] * g.group : w[0];
  return r;
}

}  // namespace kiln::cpu
