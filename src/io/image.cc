#include "io/image.h"

#include <algorithm>
#include <cmath>
#include <memory>

// stb_image (Debian's libstb-dev) is a single-header library: this file holds its code.
// Only the decoders are needed; warnings in third-party code are not ours to fix.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wall"
#pragma GCC diagnostic ignored "-Wextra"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO_FILE_SHARING
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

namespace kiln::io {

namespace {

// One output position's source range and weights along one axis.
struct Taps {
  int64_t first = 0;
  std::vector<float> weights;
};

// PIL's bilinear resampling: a triangle filter whose support grows with the shrink factor.
std::vector<Taps> make_taps(int64_t in, int64_t out) {
  double scale = static_cast<double>(in) / static_cast<double>(out);
  double filter_scale = std::max(scale, 1.0);
  double support = filter_scale;
  std::vector<Taps> taps(static_cast<size_t>(out));
  for (int64_t i = 0; i < out; ++i) {
    double center = (static_cast<double>(i) + 0.5) * scale;
    int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
    if (hi <= lo) hi = std::min(lo + 1, in);
    Taps& t = taps[static_cast<size_t>(i)];
    t.first = lo;
    double total = 0;
    for (int64_t x = lo; x < hi; ++x) {
      double w = std::max(0.0, 1.0 - std::abs((static_cast<double>(x) - center + 0.5) / filter_scale));
      t.weights.push_back(static_cast<float>(w));
      total += w;
    }
    if (total <= 0) {  // cannot happen with the range above, but never divide by zero
      t.weights.assign(1, 1.0f);
      continue;
    }
    for (float& w : t.weights) w = static_cast<float>(w / total);
  }
  return taps;
}

}  // namespace

std::vector<uint8_t> resize_pixels(const std::vector<uint8_t>& pixels, int64_t height, int64_t width, int64_t channels,
                                   int64_t new_height, int64_t new_width) {
  if (height <= 0 || width <= 0 || new_height <= 0 || new_width <= 0 || channels <= 0 ||
      static_cast<int64_t>(pixels.size()) != height * width * channels)
    throw Error(ErrorKind::kInvalidArgument, "resize_pixels: sizes do not match the pixel buffer");
  std::vector<Taps> tx = make_taps(width, new_width);
  std::vector<Taps> ty = make_taps(height, new_height);
  // Horizontal pass into floats, then vertical pass; round once at the end.
  std::vector<float> mid(static_cast<size_t>(height * new_width * channels));
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < new_width; ++x) {
      const Taps& t = tx[static_cast<size_t>(x)];
      for (int64_t c = 0; c < channels; ++c) {
        float acc = 0;
        for (size_t k = 0; k < t.weights.size(); ++k)
          acc += t.weights[k] * pixels[static_cast<size_t>((y * width + t.first + static_cast<int64_t>(k)) * channels + c)];
        mid[static_cast<size_t>((y * new_width + x) * channels + c)] = acc;
      }
    }
  std::vector<uint8_t> out(static_cast<size_t>(new_height * new_width * channels));
  for (int64_t y = 0; y < new_height; ++y) {
    const Taps& t = ty[static_cast<size_t>(y)];
    for (int64_t x = 0; x < new_width; ++x)
      for (int64_t c = 0; c < channels; ++c) {
        float acc = 0;
        for (size_t k = 0; k < t.weights.size(); ++k)
          acc += t.weights[k] * mid[static_cast<size_t>(((t.first + static_cast<int64_t>(k)) * new_width + x) * channels + c)];
        out[static_cast<size_t>((y * new_width + x) * channels + c)] =
            static_cast<uint8_t>(std::clamp(std::lround(acc), 0L, 255L));
      }
  }
  return out;
}

Tensor pixels_to_tensor(const std::vector<uint8_t>& pixels, int64_t height, int64_t width, int64_t channels,
                        const ImageOptions& o) {
  if (static_cast<int64_t>(pixels.size()) != height * width * channels)
    throw Error(ErrorKind::kInvalidArgument, "pixels_to_tensor: sizes do not match the pixel buffer");
  if (o.crop_height <= 0 || o.crop_width <= 0)
    throw Error(ErrorKind::kInvalidArgument, "the crop size must be positive");
  for (int c = 0; c < (o.gray ? 1 : 3); ++c)
    if (!(o.std[static_cast<size_t>(c)] != 0.0f))
      throw Error(ErrorKind::kInvalidArgument, "--std values must be non-zero");

  // Resize so the shorter side is o.resize, keeping the aspect ratio (torchvision's rule:
  // the longer side is truncated, not rounded).
  std::vector<uint8_t> img = pixels;
  int64_t h = height, w = width;
  if (o.resize > 0 && std::min(h, w) != o.resize) {
    int64_t nh, nw;
    if (h <= w) {
      nh = o.resize;
      nw = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(o.resize) * static_cast<double>(w) / static_cast<double>(h)));
    } else {
      nw = o.resize;
      nh = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(o.resize) * static_cast<double>(h) / static_cast<double>(w)));
    }
    img = resize_pixels(img, h, w, channels, nh, nw);
    h = nh;
    w = nw;
  }
  if (o.crop_height > h || o.crop_width > w)
    throw Error(ErrorKind::kInvalidArgument, "the center crop " + std::to_string(o.crop_height) + "x" + std::to_string(o.crop_width) +
                                                 " is larger than the resized image " + std::to_string(h) + "x" + std::to_string(w))
        .hint("raise --resize or lower --crop");
  int64_t top = static_cast<int64_t>(std::lround(static_cast<double>(h - o.crop_height) / 2.0));
  int64_t left = static_cast<int64_t>(std::lround(static_cast<double>(w - o.crop_width) / 2.0));

  int64_t out_c = o.gray ? 1 : 3;
  Tensor t(DType::kFloat32, {1, out_c, o.crop_height, o.crop_width});
  float* out = t.data<float>();
  for (int64_t c = 0; c < out_c; ++c)
    for (int64_t y = 0; y < o.crop_height; ++y)
      for (int64_t x = 0; x < o.crop_width; ++x) {
        const uint8_t* px = &img[static_cast<size_t>(((top + y) * w + left + x) * channels)];
        float v;
        if (out_c == channels) v = px[o.bgr && out_c == 3 ? 2 - c : c];
        else if (out_c == 1) v = 0.299f * px[0] + 0.587f * px[1] + 0.114f * px[2];  // ITU-R 601 luma, as PIL's "L"
        else v = px[0];  // a gray source feeding an RGB model: repeat the channel
        v /= 255.0f;
        out[(c * o.crop_height + y) * o.crop_width + x] = (v - o.mean[static_cast<size_t>(c)]) / o.std[static_cast<size_t>(c)];
      }
  return t;
}

Tensor load_image(const std::string& path, const ImageOptions& options) {
  int w = 0, h = 0, n = 0;
  // Decode as RGB or gray as stored, so gray photos for RGB models and the reverse both work.
  if (!stbi_info(path.c_str(), &w, &h, &n)) {
    const char* why = stbi_failure_reason();
    throw Error(ErrorKind::kInvalidArgument, std::string("cannot read the image: ") + (why ? why : "unknown format"))
        .file(path)
        .hint("kiln reads JPEG, PNG, BMP, GIF, TGA, PSD, HDR, PIC and PNM images, and .npy / .pb tensors");
  }
  // Refuse sizes that would need more than 1 GiB of pixels before allocating them.
  if (static_cast<int64_t>(w) * h > (int64_t{1} << 28))
    throw Error(ErrorKind::kInvalidArgument, "the image is too large (" + std::to_string(w) + "x" + std::to_string(h) + ")").file(path);
  int want = (n == 1 || n == 2) ? 1 : 3;
  std::unique_ptr<stbi_uc, void (*)(void*)> data(stbi_load(path.c_str(), &w, &h, &n, want), stbi_image_free);
  if (!data) {
    const char* why = stbi_failure_reason();
    throw Error(ErrorKind::kInvalidArgument, std::string("cannot decode the image: ") + (why ? why : "unknown error")).file(path);
  }
  std::vector<uint8_t> pixels(data.get(), data.get() + static_cast<size_t>(w) * static_cast<size_t>(h) * static_cast<size_t>(want));
  try {
    return pixels_to_tensor(pixels, h, w, want, options);
  } catch (Error& e) {
    e.file(path);
    throw;
  }
}

}  // namespace kiln::io
