// QuantizeLinear / DequantizeLinear: the parts of their meaning that every backend shares.
//   Q:  y = saturate(round_half_even(x / scale) + zero_point)
//   DQ: y = (x - zero_point) * scale
// The scale (float32) and zero point are one value (per tensor), one per index of `axis` (per
// channel), or (block_size, opset 21) a tensor of the input's rank whose `axis` has one entry per
// block of block_size indices of the input's, the other dims the input's (the CPU engine only).
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

struct QuantizeAxis {
  int64_t channels = 1;  // the input's dim at the axis; 1: per tensor
  int64_t inner = 1;     // elements after the axis: channel of element i = (i / inner) % channels
  int64_t block = 0;     // blocked: indices of the axis per scale entry (0: not blocked)
  int64_t blocks = 1;    // blocked: scale entries along the axis, ceil(channels / block)

  // The index into the scale (and zero point) of the input's element i.
  int64_t scale_index(int64_t i) const {
    const int64_t c = (i / inner) % channels;
    if (block == 0) return c;
    return ((i / inner / channels) * blocks + c / block) * inner + i % inner;
  }
};

// The axis layout of a Q/DQ node's scale for an input of shape `x` (concrete dims), per tensor or
// per channel; throws kInvalidModel naming the node when the scale's length does not match.
QuantizeAxis quantize_axis(const Node& node, const std::vector<int64_t>& x, int64_t scale_numel);
// The same for any form, blocked included (the node's block_size): for blocked quantization the
// scale must have the input's rank, ceil(x[axis] / block_size) at the axis and the input's dims
// elsewhere; kInvalidModel naming the node otherwise.
QuantizeAxis quantize_layout(const Node& node, const std::vector<int64_t>& x, const std::vector<int64_t>& scale);

// The integer range of a quantized dtype (int8, uint8, int16, uint16).
bool quantized_range(DType dtype, int64_t& lo, int64_t& hi);

// Symmetric per-channel int8 weights: `channels` rows of `inner` values each (row c is the
// values whose index / inner % channels == c). Writes q (same size) and one scale per channel
// (max|row| / 127; 1 for an all-zero row).
void quantize_per_channel(const float* w, int64_t count, int64_t channels, int64_t inner, int8_t* q, float* scales);
// The same for FP8: scale max|row| / 448, values rounded to E4M3 (nearest even).
void quantize_per_channel_float8(const float* w, int64_t count, int64_t channels, int64_t inner, uint8_t* q, float* scales);

}  // namespace kiln::ir
