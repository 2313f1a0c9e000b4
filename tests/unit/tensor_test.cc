#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

TEST(Tensor, HalfRoundTripsExactValues) {
  for (float f : {0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f, 5.960464477539063e-08f})
    EXPECT_EQ(half_to_float(float_to_half(f)), f) << f;
}

TEST(Tensor, HalfRoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: rounds to the even mantissa (1).
  EXPECT_EQ(half_to_float(float_to_half(1.f + 1.f / 2048.f)), 1.f);
  EXPECT_EQ(half_to_float(float_to_half(1e6f)), INFINITY);
}

// FLOAT8E4M3FN against a reference made the slow way: the nearest of all 254 finite values
// (ties to the even code), saturating or NaN past 448.
TEST(Tensor, Float8E4M3RoundTripsAndDecodes) {
  int finite = 0;
  for (int b = 0; b < 256; ++b) {
    const float f = float8e4m3fn_to_float(static_cast<uint8_t>(b));
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << b;
      continue;
    }
    ++finite;
    EXPECT_EQ(float_to_float8e4m3fn(f), static_cast<uint8_t>(b)) << b << " " << f;
  }
  EXPECT_EQ(finite, 254);
  EXPECT_EQ(float8e4m3fn_to_float(0x7e), 448.f);
  EXPECT_EQ(float8e4m3fn_to_float(0x01), std::ldexp(1.f, -9));  // the smallest subnormal
  EXPECT_EQ(float8e4m3fn_to_float(0x08), std::ldexp(1.f, -6));  // the smallest normal
  EXPECT_EQ(float8e4m3fn_to_float(0xb8), -1.f);
}

TEST(Tensor, Float8E4M3RoundsToNearestEvenAndSaturates) {
  auto reference = [](float f, bool saturate) -> uint8_t {
    if (std::isnan(f)) return 0x7f;
    const uint8_t sign = std::signbit(f) ? 0x80 : 0;
    const float a = std::fabs(f);
    if (a > 448.f) {
      // Past the largest value: saturate, or NaN once the value rounds above 448 (464 is the
      // tie between 448 and the missing 480, and rounds to 448's even code).
      if (saturate) return sign | 0x7e;
      return a <= 464.f ? (sign | 0x7e) : (sign | 0x7f);
    }
    uint8_t best = 0;
    float best_d = INFINITY;
    for (int b = 0; b < 0x7f; ++b) {
      const float d = std::fabs(float8e4m3fn_to_float(static_cast<uint8_t>(b)) - a);
      if (d < best_d || (d == best_d && (b & 1) == 0)) best = static_cast<uint8_t>(b), best_d = d;
    }
    return sign | best;
  };
  std::vector<float> values = {0.f, -0.f, 1.0625f, 1.1875f, 3.f / 1024, 1.f / 1024, 0.0009765625f, 240.f, 247.f, 248.f,
                               440.f, 447.f, 449.f, 460.f, 463.9f, 464.f, 500.f, 1e9f, -1e9f, INFINITY, -INFINITY};
  for (int i = 0; i < 20000; ++i) values.push_back(std::ldexp(static_cast<float>((i * 7919) % 4096 - 2048) / 1024.f, i % 24 - 14));
  for (bool saturate : {true, false})
    for (float f : values) {
      if (std::isinf(f)) {
        EXPECT_EQ(float_to_float8e4m3fn(f, saturate), saturate ? (f < 0 ? 0xfe : 0x7e) : (f < 0 ? 0xff : 0x7f));
        continue;
      }
      EXPECT_EQ(float_to_float8e4m3fn(f, saturate), reference(f, saturate)) << f << " saturate " << saturate;
    }
  EXPECT_EQ(float_to_float8e4m3fn(NAN) & 0x7f, 0x7f);
}

TEST(Tensor, ReshapeSharesStorageAndChecksCount) {
  Tensor t = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor r = t.reshaped({3, 2});
  r.data<float>()[0] = 42.f;
  EXPECT_EQ(t.data<float>()[0], 42.f);
  EXPECT_THROW(t.reshaped({4}), Error);
}

TEST(Tensor, TypedAccessChecksType) {
  Tensor t(DType::kInt64, {2});
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_NO_THROW(t.data<int64_t>());
}

TEST(Tensor, RefusesAbsurdSizes) {
  EXPECT_THROW(Tensor(DType::kFloat32, {1LL << 40, 1LL << 40}), Error);
  EXPECT_THROW(Tensor(DType::kFloat32, {-1}), Error);
}

}  // namespace kiln
