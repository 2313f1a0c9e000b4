#include <gtest/gtest.h>

#include <cmath>

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
