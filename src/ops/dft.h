// The parameters of DFT and STFT, one definition for their schemas and their CPU kernels.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/op_schema.h"

namespace kiln::ir {

struct DftParams {
  int64_t axis = 0;      // non-negative, never the last (real/imaginary) dim
  int64_t length = 0;    // the transform's length (dft_length, else as ONNX's reference defaults it)
  int64_t out_size = 0;  // the output's size along axis
  bool inverse = false, onesided = false;
  bool real_output = false;  // inverse and onesided: a real signal ([..., 1])
};

// From the input's shape (rank >= 2, last dim 1 or 2), dft_length and axis (nullopt: absent;
// the axis defaults to -2). Throws kInvalidModel naming the node for an axis out of range or
// on the last dim, a non-positive length, or a last dim other than 1 or 2.
DftParams dft_params(const Node& node, const std::vector<int64_t>& shape, std::optional<int64_t> length,
                     std::optional<int64_t> axis);

// STFT (opset 17): the DFT of frames of a signal [batch, length, 1 or 2], each frame_length long
// and frame_step after the one before, multiplied by a window; output [batch, frames, bins, 2].
struct StftParams {
  int64_t batch = 0, signal_length = 0;
  int64_t frame_step = 0, frame_length = 0;
  int64_t frames = 0, bins = 0;  // bins: frame_length / 2 + 1 when onesided, else frame_length
  bool complex_input = false;
};

// From the signal's shape, frame_step, the window's length (nullopt: no window) and frame_length
// (nullopt: absent; then the window's). Throws kInvalidModel naming the node for a signal not of
// rank 3 with a last dim of 1 or 2, a non-positive step or length, a frame longer than the
// signal, a window of another length than the frame, or neither window nor frame_length.
StftParams stft_params(const Node& node, const std::vector<int64_t>& shape, int64_t frame_step,
                       std::optional<int64_t> window_length, std::optional<int64_t> frame_length);

}  // namespace kiln::ir
