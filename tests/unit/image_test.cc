// Image loading for `kiln run --input photo.jpg`: resize, center crop, normalization, and
// decoding through stb_image (a PPM file the test writes itself).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "io/image.h"

namespace kiln {
namespace {

std::vector<uint8_t> constant_image(int64_t h, int64_t w, int64_t c, uint8_t v) {
  return std::vector<uint8_t>(static_cast<size_t>(h * w * c), v);
}

TEST(Image, ResizingAConstantImageKeepsItConstant) {
  for (auto [nh, nw] : {std::pair<int64_t, int64_t>{3, 5}, {40, 17}, {1, 1}}) {
    std::vector<uint8_t> out = io::resize_pixels(constant_image(10, 12, 3, 77), 10, 12, 3, nh, nw);
    ASSERT_EQ(out.size(), static_cast<size_t>(nh * nw * 3));
    for (uint8_t v : out) EXPECT_EQ(v, 77);
  }
}

TEST(Image, ShrinkingAveragesInsteadOfSampling) {
  // Columns alternate 0 and 200: halving the width must give ~100 (an area average), not 0
  // or 200 (point sampling). At the borders the filter is cut off and renormalized, as in
  // PIL, which gives 200 * 0.75 / 1.75 = 86 on the left and 114 on the right.
  std::vector<uint8_t> px(4 * 8);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 8; ++x) px[static_cast<size_t>(y * 8 + x)] = x % 2 ? 200 : 0;
  std::vector<uint8_t> out = io::resize_pixels(px, 4, 8, 1, 4, 4);
  const int expected[4] = {86, 100, 100, 114};
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) EXPECT_NEAR(out[static_cast<size_t>(y * 4 + x)], expected[x], 1) << "x " << x;
}

TEST(Image, ResizeCropAndNormalizeLikeTorchvision) {
  // 4x8 RGB image where the red channel is the column index: resize the shorter side to 4
  // (no change), center crop 2x2 takes columns 3 and 4, rows 1 and 2.
  std::vector<uint8_t> px(4 * 8 * 3);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 8; ++x) {
      px[static_cast<size_t>((y * 8 + x) * 3 + 0)] = static_cast<uint8_t>(x * 10);
      px[static_cast<size_t>((y * 8 + x) * 3 + 1)] = static_cast<uint8_t>(y * 10);
      px[static_cast<size_t>((y * 8 + x) * 3 + 2)] = 255;
    }
  io::ImageOptions o;
  o.resize = 4;
  o.crop_height = 2;
  o.crop_width = 2;
  Tensor t = io::pixels_to_tensor(px, 4, 8, 3, o);
  ASSERT_EQ(t.shape(), (std::vector<int64_t>{1, 3, 2, 2}));
  const float* d = t.data<float>();
  auto expect = [&](int c, int y, int x, float raw) {
    float want = (raw / 255.0f - o.mean[static_cast<size_t>(c)]) / o.std[static_cast<size_t>(c)];
    EXPECT_NEAR(d[(c * 2 + y) * 2 + x], want, 1e-5) << "c" << c << " y" << y << " x" << x;
  };
  expect(0, 0, 0, 30);
  expect(0, 0, 1, 40);
  expect(1, 0, 0, 10);
  expect(1, 1, 0, 20);
  expect(2, 1, 1, 255);
}

TEST(Image, GrayUsesLuma) {
  std::vector<uint8_t> px = {255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255};  // 2x2: R G / B W
  io::ImageOptions o;
  o.resize = 0;
  o.crop_height = o.crop_width = 2;
  o.gray = true;
  o.mean = {0, 0, 0};
  o.std = {1, 1, 1};
  Tensor t = io::pixels_to_tensor(px, 2, 2, 3, o);
  ASSERT_EQ(t.shape(), (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_NEAR(t.data<float>()[0], 0.299f, 1e-5);
  EXPECT_NEAR(t.data<float>()[1], 0.587f, 1e-5);
  EXPECT_NEAR(t.data<float>()[2], 0.114f, 1e-5);
  EXPECT_NEAR(t.data<float>()[3], 1.0f, 1e-5);
}

TEST(Image, BgrReversesTheChannelsAndTheirStatistics) {
  std::vector<uint8_t> px = {10, 20, 30};  // one pixel: R G B
  io::ImageOptions o;
  o.resize = 0;
  o.crop_height = o.crop_width = 1;
  o.bgr = true;
  o.mean = {0.1f, 0.2f, 0.3f};  // for B, G, R
  o.std = {0.5f, 0.25f, 2.0f};
  Tensor t = io::pixels_to_tensor(px, 1, 1, 3, o);
  ASSERT_EQ(t.shape(), (std::vector<int64_t>{1, 3, 1, 1}));
  EXPECT_NEAR(t.data<float>()[0], (30 / 255.f - 0.1f) / 0.5f, 1e-6);   // B first
  EXPECT_NEAR(t.data<float>()[1], (20 / 255.f - 0.2f) / 0.25f, 1e-6);
  EXPECT_NEAR(t.data<float>()[2], (10 / 255.f - 0.3f) / 2.0f, 1e-6);  // R last
}

TEST(Image, CropLargerThanTheImageIsAnError) {
  io::ImageOptions o;
  o.resize = 0;
  o.crop_height = o.crop_width = 5;
  EXPECT_THROW(io::pixels_to_tensor(constant_image(4, 4, 3, 1), 4, 4, 3, o), Error);
}

TEST(Image, DecodesAFileAndReportsBadOnes) {
  namespace fs = std::filesystem;
  std::string path = (fs::temp_directory_path() / "kiln_image_test.ppm").string();
  {
    // A binary PPM, 6 wide and 3 high, every pixel (10, 20, 30).
    std::ofstream f(path, std::ios::binary);
    f << "P6\n6 3\n255\n";
    for (int i = 0; i < 6 * 3; ++i) f << static_cast<char>(10) << static_cast<char>(20) << static_cast<char>(30);
  }
  io::ImageOptions o;
  o.resize = 3;
  o.crop_height = o.crop_width = 3;
  o.mean = {0, 0, 0};
  o.std = {1, 1, 1};
  Tensor t = io::load_image(path, o);
  ASSERT_EQ(t.shape(), (std::vector<int64_t>{1, 3, 3, 3}));
  EXPECT_NEAR(t.data<float>()[0], 10 / 255.0f, 1e-5);
  EXPECT_NEAR(t.data<float>()[9], 20 / 255.0f, 1e-5);
  EXPECT_NEAR(t.data<float>()[26], 30 / 255.0f, 1e-5);

  {
    std::ofstream f(path, std::ios::binary);
    f << "this is not an image";
  }
  try {
    io::load_image(path, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  fs::remove(path);
  EXPECT_THROW(io::load_image(path, o), Error);
}

}  // namespace
}  // namespace kiln
