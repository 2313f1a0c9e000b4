// Loading a photo as a network input: decode (JPEG, PNG, BMP, PPM/PGM, ... through
// stb_image), resize, center-crop and normalize the way torchvision's ImageNet preprocessing
// does: Resize(resize) -> CenterCrop(crop) -> ToTensor() -> Normalize(mean, std).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::io {

struct ImageOptions {
  int64_t resize = 256;       // the shorter side is scaled to this (0: keep the size)
  int64_t crop_height = 224;  // then the center crop_height x crop_width is taken
  int64_t crop_width = 224;
  bool gray = false;          // one channel (luma) instead of RGB
  bool bgr = false;           // channels in B, G, R order (models trained on OpenCV / Caffe images)
  // Per channel (of the output's order: B, G, R with bgr), applied to values scaled to [0, 1]:
  // (v - mean) / std. For gray only element 0 is used.
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
};

// A float32 tensor of shape [1, C, crop_height, crop_width], C = 3 (RGB) or 1 (gray).
Tensor load_image(const std::string& path, const ImageOptions& options);

// The steps, exposed for tests. `pixels` is interleaved 8-bit (height x width x channels).
// Resizes with a triangle (bilinear) filter widened when shrinking, as PIL does, so a large
// photo is averaged rather than sampled.
std::vector<uint8_t> resize_pixels(const std::vector<uint8_t>& pixels, int64_t height, int64_t width, int64_t channels,
                          int64_t new_height, int64_t new_width);
Tensor pixels_to_tensor(const std::vector<uint8_t>& pixels, int64_t height, int64_t width, int64_t channels,
                        const ImageOptions& options);

}  // namespace kiln::io
