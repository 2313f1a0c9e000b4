// Non-overlapping patches of a channels-last image as the rows of a matrix: the im2col of a
// convolution whose stride is at least its kernel, with no padding and no dilation (a vision
// transformer's patch embedding, ConvNeXt's and Swin's stems, a strided 1x1 shortcut). Each
// patch row is [R][S][C] in memory order, so the convolution is then one matrix product by the
// filter in KRSC order. The copy moves each patch row's R runs of S*C contiguous elements.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kiln::cuda {

struct PatchGeometry {
  int64_t n, h, w, c;          // input, channels-last
  int64_t oh, ow;              // output pixels (patches per column, per row)
  int64_t r, s;                // patch (kernel) height and width
  int64_t stride_h, stride_w;  // at least r and s
  int64_t rows() const { return n * oh * ow; }
  int64_t row_elements() const { return r * s * c; }
};

// x: channels-last [n, h, w, c] of `element_bytes`-byte elements; patches: [rows(), row_elements()].
void launch_gather_patches_nhwc(const void* x, void* patches, const PatchGeometry& g, size_t element_bytes,
                                cudaStream_t stream);

}  // namespace kiln::cuda
