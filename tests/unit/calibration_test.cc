// Calibration: histograms of |x|, the entropy / minmax / percentile thresholds, and the
// calibration cache formats (kiln's and TensorRT's).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>

#include "kiln/error.h"
#include "calibration/calibration.h"
#include "calibration/calibration_cache.h"

namespace kiln::calibration {
namespace {

std::vector<float> gaussian(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(AbsHistogram, CountsEveryValueAndKeepsCountsWhenTheRangeGrows) {
  AbsHistogram h;
  std::vector<float> a = {0.f, -1.f, 0.5f, 1.f};
  h.add(a.data(), static_cast<int64_t>(a.size()));
  EXPECT_DOUBLE_EQ(h.range(), 1.0);
  EXPECT_DOUBLE_EQ(h.count(), 4);
  EXPECT_DOUBLE_EQ(h.bins()[0], 1);                       // 0
  EXPECT_DOUBLE_EQ(h.bins()[AbsHistogram::kBins / 2], 1);  // 0.5
  EXPECT_DOUBLE_EQ(h.bins()[AbsHistogram::kBins - 1], 2);  // |-1| and 1, clamped into the last bin
  std::vector<float> b = {3.f, std::nanf("")};             // range 1 -> 2 -> 4; NaN ignored
  h.add(b.data(), 2);
  EXPECT_DOUBLE_EQ(h.range(), 4.0);
  EXPECT_DOUBLE_EQ(h.count(), 5);
  EXPECT_DOUBLE_EQ(h.max_abs(), 3.0);
  double total = 0;
  for (double c : h.bins()) total += c;
  EXPECT_DOUBLE_EQ(total, 5);
  EXPECT_DOUBLE_EQ(h.bins()[AbsHistogram::kBins / 8], 1);      // 0.5 of 4
  EXPECT_DOUBLE_EQ(h.bins()[AbsHistogram::kBins / 4 - 1], 2);  // the two 1s
  EXPECT_DOUBLE_EQ(h.bins()[3 * AbsHistogram::kBins / 4], 1);  // 3
}

TEST(AbsHistogram, ZerosFirstThenValues) {
  AbsHistogram h;
  std::vector<float> zeros(10, 0.f), ones(5, 1.f);
  h.add(zeros.data(), 10);
  EXPECT_EQ(calibration_threshold(h, CalibrationAlgorithm::kEntropy), 0.0);
  h.add(ones.data(), 5);
  EXPECT_DOUBLE_EQ(h.bins()[0], 10);
  EXPECT_DOUBLE_EQ(h.count(), 15);
  EXPECT_DOUBLE_EQ(calibration_threshold(h, CalibrationAlgorithm::kMinMax), 1.0);
}

TEST(AbsHistogram, InfinityIsAnError) {
  AbsHistogram h;
  std::vector<float> v = {1.f, std::numeric_limits<float>::infinity()};
  EXPECT_THROW(h.add(v.data(), 2), Error);
}

TEST(CalibrationThreshold, MinMaxIsTheLargestMagnitude) {
  AbsHistogram h;
  std::vector<float> v = gaussian(10000, 1);
  v[17] = -42.f;
  h.add(v.data(), static_cast<int64_t>(v.size()));
  EXPECT_FLOAT_EQ(calibration_threshold(h, CalibrationAlgorithm::kMinMax), 42.f);
}

TEST(CalibrationThreshold, PercentileOfUniformValues) {
  AbsHistogram h;
  std::vector<float> v(100000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i + 1) / static_cast<float>(v.size());
  h.add(v.data(), static_cast<int64_t>(v.size()));
  const double width = h.bin_width();
  EXPECT_NEAR(calibration_threshold(h, CalibrationAlgorithm::kPercentile, 50), 0.5, 2 * width);
  EXPECT_NEAR(calibration_threshold(h, CalibrationAlgorithm::kPercentile, 90), 0.9, 2 * width);
  EXPECT_NEAR(calibration_threshold(h, CalibrationAlgorithm::kPercentile, 100), 1.0, 1e-6);
  EXPECT_THROW(calibration_threshold(h, CalibrationAlgorithm::kPercentile, 0), Error);
  EXPECT_THROW(calibration_threshold(h, CalibrationAlgorithm::kPercentile, 101), Error);
}

TEST(CalibrationThreshold, EntropyClipsRareOutliersThatMinMaxKeeps) {
  AbsHistogram h;
  std::vector<float> v = gaussian(1000000, 2);
  for (int i = 0; i < 5; ++i) v[static_cast<size_t>(i) * 1000] = 100.f;  // 5 outliers in a million
  h.add(v.data(), static_cast<int64_t>(v.size()));
  const double entropy = calibration_threshold(h, CalibrationAlgorithm::kEntropy);
  EXPECT_DOUBLE_EQ(calibration_threshold(h, CalibrationAlgorithm::kMinMax), 100.0);
  // Clipping the outliers costs less than spending 127 levels on [0, 100]: the threshold
  // lands far below them. (The histogram's range is set by the outliers, so its bins are
  // 0.05 wide and the smallest candidate, 128 bins, is 6.25: near the Gaussian's body.)
  EXPECT_GT(entropy, 2.0);
  EXPECT_LT(entropy, 25.0);
}

TEST(CalibrationThreshold, EntropyKeepsTheWholeRangeOfAUniformDistribution) {
  AbsHistogram h;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(500000);
  for (float& x : v) x = d(rng);
  h.add(v.data(), static_cast<int64_t>(v.size()));
  // Any clipping piles mass into the last bin that 128 levels cannot represent: no gain.
  EXPECT_GT(calibration_threshold(h, CalibrationAlgorithm::kEntropy), 0.95);
}

TEST(CalibrationThreshold, EntropyIsNotPulledDownByTheZerosOfAReLU) {
  // ReLU of N(0, 1): half the values are exactly 0. Without flattening that spike the search
  // clipped such tensors near 1 standard deviation (ResNet-18's QDQ model then lost 59% of its
  // output); with it, the threshold stays in the tail.
  AbsHistogram h;
  std::vector<float> v = gaussian(1000000, 4);
  for (float& x : v) x = std::max(x, 0.f);
  h.add(v.data(), static_cast<int64_t>(v.size()));
  const double entropy = calibration_threshold(h, CalibrationAlgorithm::kEntropy);
  EXPECT_GT(entropy, 2.5);
  EXPECT_LE(entropy, h.max_abs());
}

TEST(CalibrationThreshold, EntropySearchOnASmallHistogram) {
  // Fewer bins than levels: nothing to choose, everything is kept.
  EXPECT_EQ(entropy_threshold_bins(std::vector<double>(64, 1.0)), 64);
  // A spike far out on a compact body: the body is kept, the tail clipped.
  std::vector<double> bins(2048, 0.0);
  for (int b = 0; b < 256; ++b) bins[b] = 1000.0 - 3.0 * b;
  bins[2000] = 1;
  const int kept = entropy_threshold_bins(bins);
  EXPECT_GE(kept, 200);
  EXPECT_LT(kept, 600);
}

TEST(CalibrationAlgorithm, Names) {
  for (auto a : {CalibrationAlgorithm::kEntropy, CalibrationAlgorithm::kMinMax, CalibrationAlgorithm::kPercentile})
    EXPECT_EQ(parse_calibration_algorithm(to_string(a)), a);
  try {
    parse_calibration_algorithm("kl");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("entropy, minmax or percentile"), std::string::npos) << e.what();
  }
}

CalibrationCache sample_cache() {
  CalibrationCache c;
  c.model_fingerprint = model_fingerprint("model bytes");
  c.algorithm = "entropy";
  c.batches = 16;
  c.scales["input"] = 0.0215743f;
  c.scales["/layer1/layer1.0/relu/Relu_output_0"] = 1.f / 127.f;
  c.scales["odd: name"] = 3.5e-7f;  // a ':' inside the name: the value follows the last one
  return c;
}

TEST(CalibrationCache, KilnTextRoundTripsExactly) {
  const CalibrationCache c = sample_cache();
  const std::string text = to_kiln_text(c);
  EXPECT_EQ(text.rfind("kiln-calibration 1\nmodel: ", 0), 0u) << text;
  const CalibrationCache back = parse_calibration_cache(text, "x.cache");
  EXPECT_EQ(back.model_fingerprint, c.model_fingerprint);
  EXPECT_EQ(back.algorithm, "entropy");
  EXPECT_EQ(back.batches, 16);
  EXPECT_EQ(back.scales, c.scales);  // float32 values bit for bit
}

TEST(CalibrationCache, TensorRtTextRoundTripsExactly) {
  const CalibrationCache c = sample_cache();
  const std::string text = to_tensorrt_text(c);
  EXPECT_EQ(text.rfind("TRT-8601-EntropyCalibration2\n", 0), 0u) << text;
  const CalibrationCache back = parse_calibration_cache(text, "x.trt");
  EXPECT_EQ(back.algorithm, "EntropyCalibration2");
  EXPECT_TRUE(back.model_fingerprint.empty());
  EXPECT_EQ(back.scales, c.scales);
}

TEST(CalibrationCache, ReadsATensorRtCacheLine) {
  // TensorRT writes the scale's float32 bits in hex: 3c010a14 is 2^-7 * (1 + 0x010a14 / 2^23).
  const CalibrationCache c = parse_calibration_cache("TRT-8502-EntropyCalibration2\ninput: 3c010a14\n", "t");
  uint32_t bits = 0x3c010a14;
  float want;
  std::memcpy(&want, &bits, sizeof want);
  ASSERT_EQ(c.scales.count("input"), 1u);
  EXPECT_EQ(c.scales.at("input"), want);
  EXPECT_NEAR(want, 0.0078125 * (1 + 68116.0 / 8388608.0), 1e-9);
}

// A cache in TensorRT's format as its files come (tests/cli/data/classifier_tensorrt.cache,
// written by hand to that format: TensorRT cannot be installed where kiln is tested): another
// version in the header, names with spaces, brackets, '::' and '/', entries for TensorRT's own
// layers that the model lacks, and no newline after the last line.
TEST(CalibrationCache, ReadsATensorRtCacheFileWithItsQuirks) {
  std::ifstream f(std::string(KILN_SOURCE_DIR) + "/tests/cli/data/classifier_tensorrt.cache", std::ios::binary);
  ASSERT_TRUE(f);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_NE(text.back(), '\n');
  const CalibrationCache c = parse_calibration_cache(text, "classifier_tensorrt.cache");
  EXPECT_EQ(c.algorithm, "EntropyCalibration2");
  EXPECT_TRUE(c.model_fingerprint.empty());
  auto bits_of = [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
  };
  const std::map<std::string, uint32_t> want = {{"x", 0x3c95f941},
                                                {"(Unnamed Layer* 0) [Constant]_output", 0x3c010a14},
                                                {"onnx::Gemm_5", 0x3d0e5d21},
                                                {"/Gemm_output_0", 0x3c90a98b},
                                                {"y", 0x3c90a98b}};
  ASSERT_EQ(c.scales.size(), want.size());
  for (const auto& [name, bits] : want) {
    ASSERT_EQ(c.scales.count(name), 1u) << name;
    EXPECT_EQ(bits_of(c.scales.at(name)), bits) << name;
  }
}

void expect_error(const std::string& text, const std::string& fragment) {
  try {
    parse_calibration_cache(text, "bad.cache");
    FAIL() << "expected an error for:\n" << text;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bad.cache"), std::string::npos) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
  }
}

TEST(CalibrationCache, MalformedCachesAreClearErrors) {
  expect_error("", "empty");
  expect_error("hello\n", "neither kiln's");
  expect_error("TRT-x-Entropy\n", "neither kiln's");
  expect_error("kiln-calibration 1\nno colon here\n", "line 2");
  expect_error("kiln-calibration 1\nx: abc\n", "not a number");
  expect_error("kiln-calibration 1\nx: -1\n", "not a finite positive number");
  expect_error("kiln-calibration 1\nx: 1e300\n", "not a finite positive number");
  expect_error("kiln-calibration 1\nx:\n", "no value");
  expect_error("kiln-calibration 1\nx: 1\nx: 2\n", "appears twice");
  expect_error("TRT-8601-EntropyCalibration2\nx: 0.5\n", "not 8 hex digits");
  expect_error("TRT-8601-EntropyCalibration2\nx: 7f800000\n", "not a finite positive number");  // +inf
}

TEST(CalibrationCache, AStaleCacheIsRefused) {
  const std::string path = ::testing::TempDir() + "/kiln_calibration_test.cache";
  const CalibrationCache c = sample_cache();
  write_calibration_cache(path, c);
  EXPECT_EQ(read_calibration_cache(path, c.model_fingerprint).scales, c.scales);
  try {
    read_calibration_cache(path, model_fingerprint("another model"));
    FAIL() << "expected a stale-cache error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  }
  // TensorRT caches carry no fingerprint: accepted for any model.
  const std::string trt = ::testing::TempDir() + "/kiln_calibration_test.trt";
  write_calibration_cache(trt, c);
  EXPECT_EQ(read_calibration_cache(trt, model_fingerprint("another model")).scales, c.scales);
  EXPECT_THROW(read_calibration_cache(::testing::TempDir() + "/no_such.cache", ""), Error);
}

}  // namespace
}  // namespace kiln::calibration
