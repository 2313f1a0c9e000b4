// The image preprocessing flags, one definition for every command that reads photos:
// `kiln run --input photo.jpg` and calibration on a folder of images (`kiln calibrate`,
// `kiln quantize`). --resize, --crop, --mean, --std, --gray: torchvision's ImageNet steps by
// default (io/image.h).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "io/image.h"
#include "kiln/kiln.h"

namespace kiln::tools {

struct ImageFlags {
  int64_t resize = 256;
  std::string crop;  // "224" or "HxW"; default: the model's H, W
  std::vector<float> mean = {0.485f, 0.456f, 0.406f};
  std::vector<float> std = {0.229f, 0.224f, 0.225f};
  bool gray = false;
  bool bgr = false;

  void add_to(CLI::App* cmd);

  // The preprocessing of images fed to `input` (a float [N, C, H, W] tensor, -1 where
  // dynamic): the crop is the input's H x W (--crop, else 224, where they are dynamic), one
  // gray channel for --gray or a 1-channel input (plain [0, 1] values unless --mean / --std are
  // given), else RGB normalized with --mean / --std. Throws kiln::Error (kInvalidArgument, with
  // `file` for the image or folder) for an input that images cannot feed and for flags that
  // contradict it.
  io::ImageOptions options(const TensorDesc& input, const std::string& file) const;
};

}  // namespace kiln::tools
