// kiln's INT8 convolution for few input channels (1 to 4): the stem of an image model, e.g.
// ResNet's 7x7 stride-2 convolution over 3 channels. cuDNN's engines and kiln's implicit GEMM
// read 16-byte channel rows, so such a layer used to stay float16 (0.31 ms of ResNet-50's 3.5 ms
// INT8 batch of 128 layer by layer on an H100, with an fp16 MaxPool and a QuantizeLinear after
// it: docs/design/int8.md, "The image stem and the int8 MaxPool").
//
// The input is int8 NCHW (what an elementwise QuantizeLinear of the image writes). A block
// computes an 8 x 16 tile of output pixels for up to 64 output channels: it copies the input
// patch under the tile into shared memory as one 32-bit word per pixel (its channels, zero
// padded to 4), so that one word is one filter tap's 4 reduction bytes of an m16n8k32 int8
// product, and the GEMM's reduction runs over taps x 4 channels (the weights padded to match,
// zeros in the padding). int32 sums, and kiln::QConv's epilogue exactly as the CPU reference
// computes it (int8_epilogue.cuh), so the layer gives the CPU engine's integers bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "cuda/kernels/int8_conv.h"

namespace kiln::cuda {

// Whether the stem kernel runs this geometry (1 to 4 input channels, output channels a multiple
// of 16, at most 64 filter taps, no residual) with this output type (int8 or float16).
bool int8_stem_supported(const Int8ConvGeometry& g, DType y_type, DType z_type, std::string* why = nullptr);

// args.x: int8 NCHW [batch][c][h][w]; args.w: the weights as stem_weights() lays them out.
void launch_int8_stem(const Int8ConvGeometry& g, DType y_type, const Int8ConvArgs& args, const ir::Activation& act,
                      cudaStream_t stream);

// QConv weights [k, c, r, s] -> [k][taps rounded up to 8][4]: channel ch of tap t at byte
// t * 4 + ch of its row, zeros for channels >= c and taps >= r * s.
std::vector<int8_t> stem_weights(const int8_t* w, int k, int c, int r, int s);

}  // namespace kiln::cuda
