// The geometry of MaxPool, AveragePool and LpPool: kernel, strides, dilations, pads after
// resolving auto_pad, and output sizes with ceil_mode.
//
// One definition used by the op schemas (build time, where spatial dims may be unknown) and
// by the CPU kernels (run time), so both agree on every pad.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

struct PoolGeometry {
  std::vector<int64_t> kernel, strides, dilations;
  std::vector<int64_t> pad_begin, pad_end;  // explicit pads; auto_pad resolves them per input size
  std::string auto_pad;                     // "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"
  bool ceil_mode = false;

  int64_t effective_kernel(size_t i) const { return (kernel[i] - 1) * dilations[i] + 1; }
};

// Reads and checks a pooling node's attributes for `spatial` spatial dims; throws
// kInvalidModel naming the node on wrong list lengths or non-positive values.
PoolGeometry pool_geometry(const Node& node, size_t spatial);

// Output size of spatial dim i for input size `in` (-1 when unknown: returns -1). Resolves
// auto_pad into g.pad_begin/pad_end[i]. Throws kInvalidModel when the output would be empty.
int64_t pool_output_size(const Node& node, PoolGeometry& g, size_t i, int64_t in);

}  // namespace kiln::ir
