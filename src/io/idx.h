// IDX files (the MNIST family's format, gzipped or not) and the Fashion-MNIST dataset of
// Debian's dataset-fashion-mnist package, for calibration and `kiln eval`.
//
// IDX: a 4-byte magic (0, 0, type 0x08 = unsigned byte, number of dims), the dims as 32-bit
// big-endian integers, then the data row-major.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/tensor.h"

namespace kiln::io {

// A uint8 tensor with the file's dims. Throws kiln::Error naming the file and the reason for a
// missing, foreign (bad magic, non-byte type), implausible or truncated file.
Tensor read_idx(const std::string& path);

struct LabeledImages {
  Tensor images;  // uint8 [N, 28, 28]
  Tensor labels;  // uint8 [N]
};

// Fashion-MNIST's normalization, used by scripts/train_fashion_mnist.py: (pixel / 255 - mean) / std.
constexpr float kFashionMnistMean = 0.2860f;
constexpr float kFashionMnistStd = 0.3530f;
constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// split: "train" (60000 images) or "test" (10000). `dir` empty: $KILN_FASHION_MNIST_DIR if set,
// else kFashionMnistDir.
LabeledImages load_fashion_mnist(const std::string& split, const std::string& dir = "");

// Images [begin, end) as the model's input: float32 [end - begin, 1, 28, 28], normalized.
Tensor fashion_mnist_input(const LabeledImages& data, int64_t begin, int64_t end);

}  // namespace kiln::io
