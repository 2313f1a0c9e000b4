// The image preprocessing flags (see image_flags.h).
#include "tools/image_flags.h"

#include <algorithm>

#include "tools/shapes.h"

namespace kiln::tools {

void ImageFlags::add_to(CLI::App* cmd) {
  cmd->add_option("--resize", resize, "Images: scale the shorter side to this before cropping (0: no resize)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--crop", crop, "Images: center crop SIZE or HxW (default: the model's input H, W, else 224)");
  cmd->add_option("--mean", mean, "Images: per-channel mean of [0,1] values (default ImageNet's)")->expected(1, 3);
  cmd->add_option("--std", std, "Images: per-channel standard deviation (default ImageNet's)")->expected(1, 3);
  cmd->add_flag("--gray", gray, "Images: one gray channel (automatic for 1-channel inputs)");
  cmd->add_flag("--bgr", bgr, "Images: channels in B, G, R order (OpenCV/Caffe-trained models; --mean/--std in that order)");
}

io::ImageOptions ImageFlags::options(const TensorDesc& desc, const std::string& file) const {
  if (desc.shape.size() != 4 || !is_float(desc.dtype))
    throw Error(ErrorKind::kInvalidArgument, "an image was given for input '" + desc.name + "', which is not a float NCHW tensor")
        .file(file)
        .hint("images become float32 [N, C, H, W] tensors; pass a .npy file for other inputs");
  int64_t c = desc.shape[1];
  if (c != -1 && c != 1 && c != 3)
    throw Error(ErrorKind::kInvalidArgument, "input '" + desc.name + "' has " + std::to_string(c) +
                                                 " channels; images give 1 (--gray) or 3")
        .file(file)
        .hint("if the model takes NHWC images, convert the photo to a .npy file yourself");
  io::ImageOptions io;
  io.resize = resize;
  io.gray = gray || c == 1;
  io.bgr = bgr;
  if (bgr && io.gray)
    throw Error(ErrorKind::kInvalidArgument, "--bgr is for 3-channel inputs; input '" + desc.name + "' takes gray images");
  if (gray && c == 3)
    throw Error(ErrorKind::kInvalidArgument, "--gray was given but input '" + desc.name + "' takes 3 channels");
  io.crop_height = desc.shape[2] > 0 ? desc.shape[2] : 224;
  io.crop_width = desc.shape[3] > 0 ? desc.shape[3] : 224;
  if (!crop.empty()) {
    ShapeBindings parse;
    parse.add_shapes_option("crop:" + crop);
    const std::vector<int64_t>& hw = parse.shapes["crop"];
    if (hw.size() != 1 && hw.size() != 2)
      throw Error(ErrorKind::kInvalidArgument, "--crop must be SIZE or HxW, got '" + crop + "'");
    io.crop_height = hw[0];
    io.crop_width = hw.back();
    if ((desc.shape[2] > 0 && desc.shape[2] != io.crop_height) || (desc.shape[3] > 0 && desc.shape[3] != io.crop_width))
      throw Error(ErrorKind::kInvalidArgument, "--crop " + crop + " does not match input '" + desc.name + "' (" +
                                                   std::to_string(desc.shape[2]) + "x" + std::to_string(desc.shape[3]) + ")");
  }
  if (io.gray) {
    // ImageNet's statistics are for RGB; a gray model gets plain [0, 1] unless told.
    bool defaults = mean == ImageFlags{}.mean && std == ImageFlags{}.std;
    io.mean = {defaults ? 0.0f : mean[0], 0, 0};
    io.std = {defaults ? 1.0f : std[0], 1, 1};
  } else {
    if (mean.size() != 3 && mean.size() != 1) throw Error(ErrorKind::kInvalidArgument, "--mean takes 1 or 3 values");
    if (std.size() != 3 && std.size() != 1) throw Error(ErrorKind::kInvalidArgument, "--std takes 1 or 3 values");
    for (size_t i = 0; i < 3; ++i) {
      io.mean[i] = mean[std::min(i, mean.size() - 1)];
      io.std[i] = std[std::min(i, std.size() - 1)];
    }
  }
  return io;
}

}  // namespace kiln::tools
