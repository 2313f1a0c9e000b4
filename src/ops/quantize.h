// QuantizeLinear / DequantizeLinear: the parts of their meaning that every backend shares.
//   Q:  y = saturate(round_half_even(x / scale) + zero_point)
//   DQ: y = (x - zero_point) * scale
// The scale (float32) and zero point are one value (per tensor) or one per index of `axis`
// (per channel); blocked quantization (block_size) is not supported.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

struct QuantizeAxis {
  int64_t channels = 1;  // 1: per tensor
  int64_t inner = 1;     // elements after the axis: channel of element i = (i / inner) % channels
};

// The axis layout of a Q/DQ node's scale for an input of shape `x` (concrete dims); throws
// kInvalidModel naming the node when the scale's length does not match.
QuantizeAxis quantize_axis(const Node& node, const std::vector<int64_t>& x, int64_t scale_numel);

// The integer range of a quantized dtype (int8, uint8, int16, uint16).
bool quantized_range(DType dtype, int64_t& lo, int64_t& hi);

// Symmetric per-channel int8 weights: `channels` rows of `inner` values each (row c is the
// values whose index / inner % channels == c). Writes q (same size) and one scale per channel
// (max|row| / 127; 1 for an all-zero row).
void quantize_per_channel(const float* w, int64_t count, int64_t channels, int64_t inner, int8_t* q, float* scales);
// The same for FP8: scale max|row| / 448, values rounded to E4M3 (nearest even).
void quantize_per_channel_float8(const float* w, int64_t count, int64_t channels, int64_t inner, uint8_t* q, float* scales);

}  // namespace kiln::ir
