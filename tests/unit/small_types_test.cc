// The 8-bit floats besides E4M3FN, float4 E2M1 and the sub-byte integers (ir/small_types.h):
// every code's value survives a conversion back, rounding ties go to the even code, out-of-range
// values saturate or become infinity / NaN as ONNX's reference (ml_dtypes) converts them; and
// ONNX files' packing of the sub-byte types reads and writes back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "graph_builder.h"
#include "ir/small_types.h"
#include "onnx.pb.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace kiln::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

const DType kSmallFloats[] = {DType::kFloat8E4M3FN, DType::kFloat8E4M3FNUZ, DType::kFloat8E5M2, DType::kFloat8E5M2FNUZ,
                              DType::kFloat4E2M1};

TEST(SmallFloats, EveryFiniteCodeRoundTrips) {
  for (DType d : kSmallFloats) {
    SCOPED_TRACE(to_string(d));
    const int codes = d == DType::kFloat4E2M1 ? 16 : 256;
    int finite = 0;
    for (int c = 0; c < codes; ++c) {
      const float v = small_float_to_float(d, static_cast<uint8_t>(c));
      if (!std::isfinite(v)) continue;
      ++finite;
      EXPECT_EQ(float_to_small_float(d, v, true), c) << "code " << c << " value " << v;
      EXPECT_EQ(float_to_small_float(d, v, false), c) << "code " << c << " value " << v;
    }
    // NaN and infinity codes: E4M3FN 2, E5M2 2 infinities + 6 NaNs, the FNUZ types one NaN (and
    // no negative zero, so one code fewer of finite values too), float4e2m1 none.
    const int expected = d == DType::kFloat8E4M3FN ? 254 : d == DType::kFloat8E5M2 ? 248 : d == DType::kFloat4E2M1 ? 16 : 255;
    EXPECT_EQ(finite, expected);
  }
}

TEST(SmallFloats, LimitsAndSpecialValues) {
  EXPECT_EQ(small_float_to_float(DType::kFloat8E4M3FNUZ, 0x7f), 240.f);
  EXPECT_EQ(small_float_to_float(DType::kFloat8E5M2, 0x7b), 57344.f);
  EXPECT_EQ(small_float_to_float(DType::kFloat8E5M2FNUZ, 0x7f), 57344.f);
  EXPECT_EQ(small_float_to_float(DType::kFloat4E2M1, 0x7), 6.f);
  EXPECT_EQ(small_float_to_float(DType::kFloat4E2M1, 0x9), -0.5f);
  EXPECT_EQ(small_float_to_float(DType::kFloat8E5M2, 0x7c), kInf);
  EXPECT_EQ(small_float_to_float(DType::kFloat8E5M2, 0xfc), -kInf);
  EXPECT_TRUE(std::isnan(small_float_to_float(DType::kFloat8E5M2, 0x7e)));
  EXPECT_TRUE(std::isnan(small_float_to_float(DType::kFloat8E4M3FNUZ, 0x80)));
  EXPECT_TRUE(std::isnan(small_float_to_float(DType::kFloat8E5M2FNUZ, 0x80)));
  // The smallest subnormals: 2^-10 (E4M3FNUZ), 2^-16 (E5M2), 2^-17 (E5M2FNUZ).
  EXPECT_EQ(small_float_to_float(DType::kFloat8E4M3FNUZ, 0x01), std::ldexp(1.f, -10));
  EXPECT_EQ(small_float_to_float(DType::kFloat8E5M2, 0x01), std::ldexp(1.f, -16));
  EXPECT_EQ(small_float_to_float(DType::kFloat8E5M2FNUZ, 0x01), std::ldexp(1.f, -17));
}

TEST(SmallFloats, OutOfRangeSaturatesOrOverflows) {
  // The values ml_dtypes gives for 1e6, -1e6, +-infinity, NaN and -0 without saturation.
  struct Case { DType d; float x; uint8_t saturated, not_saturated; };
  const Case cases[] = {
      {DType::kFloat8E5M2, 1e6f, 0x7b, 0x7c},       {DType::kFloat8E5M2, -1e6f, 0xfb, 0xfc},
      {DType::kFloat8E5M2, kInf, 0x7b, 0x7c},       {DType::kFloat8E5M2, -kInf, 0xfb, 0xfc},
      {DType::kFloat8E5M2, kNaN, 0x7e, 0x7e},       {DType::kFloat8E5M2, -0.f, 0x80, 0x80},
      {DType::kFloat8E4M3FNUZ, 1e6f, 0x7f, 0x80},   {DType::kFloat8E4M3FNUZ, -1e6f, 0xff, 0x80},
      {DType::kFloat8E4M3FNUZ, kNaN, 0x80, 0x80},   {DType::kFloat8E4M3FNUZ, -0.f, 0x00, 0x00},
      {DType::kFloat8E4M3FNUZ, -1e-7f, 0x00, 0x00}, {DType::kFloat8E5M2FNUZ, -kInf, 0xff, 0x80},
      {DType::kFloat8E5M2FNUZ, 60000.f, 0x7f, 0x7f},  // below the midpoint to the next binade
      {DType::kFloat4E2M1, 1e6f, 0x7, 0x7},         {DType::kFloat4E2M1, -kInf, 0xf, 0xf},
      {DType::kFloat4E2M1, kNaN, 0x8, 0x8},         {DType::kFloat4E2M1, -0.f, 0x8, 0x8},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(to_string(c.d) + " of " + std::to_string(c.x));
    EXPECT_EQ(float_to_small_float(c.d, c.x, true), c.saturated);
    EXPECT_EQ(float_to_small_float(c.d, c.x, false), c.not_saturated);
  }
}

TEST(SmallFloats, TiesRoundToTheEvenCode) {
  // float4e2m1: 0.25 between 0 and 0.5 -> 0; 0.75 between 0.5 and 1 -> 1 (code 2); 2.5 -> 2;
  // 5 between 4 and 6 -> 4 (code 6); 7, halfway past 6, saturates.
  EXPECT_EQ(float_to_small_float(DType::kFloat4E2M1, 0.25f, true), 0x0);
  EXPECT_EQ(float_to_small_float(DType::kFloat4E2M1, 0.75f, true), 0x2);
  EXPECT_EQ(float_to_small_float(DType::kFloat4E2M1, 2.5f, true), 0x4);
  EXPECT_EQ(float_to_small_float(DType::kFloat4E2M1, 5.f, true), 0x6);
  EXPECT_EQ(float_to_small_float(DType::kFloat4E2M1, 7.f, true), 0x7);
  EXPECT_EQ(float_to_small_float(DType::kFloat4E2M1, 3.7f, true), 0x6);
  // E5M2: 1.125 between 1 (0x3c) and 1.25 (0x3d) -> 0x3c; 1.375 -> 1.5 (0x3e); just above a
  // tie rounds up.
  EXPECT_EQ(float_to_small_float(DType::kFloat8E5M2, 1.125f, true), 0x3c);
  EXPECT_EQ(float_to_small_float(DType::kFloat8E5M2, 1.375f, true), 0x3e);
  EXPECT_EQ(float_to_small_float(DType::kFloat8E5M2, std::nextafter(1.125f, 2.f), true), 0x3d);
  // E5M2's largest finite code is odd, so the tie past it goes to infinity without saturation.
  EXPECT_EQ(float_to_small_float(DType::kFloat8E5M2, 61440.f, false), 0x7c);
  EXPECT_EQ(float_to_small_float(DType::kFloat8E5M2, 61439.f, false), 0x7b);
}

// The GPU's casts use ir/small_float.h's arithmetic for every small float; the CPU converts
// float8e4m3fn with its own bit-level functions (kiln/tensor.h). Both must give the same code for
// every float and the same value for every code.
TEST(SmallFloats, SharedArithmeticAgreesWithTheE4M3FnFunctions) {
  const SmallFloatFormat e4m3fn = small_float_format(DType::kFloat8E4M3FN);
  for (int c = 0; c < 256; ++c) {
    const float fast = float8e4m3fn_to_float(static_cast<uint8_t>(c));
    const float shared = small_float_decode(e4m3fn, static_cast<uint8_t>(c));
    EXPECT_TRUE(fast == shared || (std::isnan(fast) && std::isnan(shared))) << "code " << c;
  }
  // Every 2^11-th float32 bit pattern (both signs, subnormals, infinities, NaNs) and the
  // neighbours of every code's value and of the midpoints between codes.
  std::vector<float> values;
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 2048) {
    const uint32_t b = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &b, sizeof f);
    values.push_back(f);
  }
  for (int c = 0; c < 127; ++c) {
    const float v = float8e4m3fn_to_float(static_cast<uint8_t>(c)), next = float8e4m3fn_to_float(static_cast<uint8_t>(c + 1));
    for (float x : {v, (v + next) / 2, next}) {
      values.insert(values.end(), {x, -x, std::nextafter(x, kInf), std::nextafter(x, -kInf)});
    }
  }
  values.insert(values.end(), {464.f, -464.f, 448.f, 480.f, kInf, -kInf, kNaN, -kNaN});
  for (float x : values)
    for (bool saturate : {true, false})
      ASSERT_EQ(small_float_encode(e4m3fn, x, saturate), float_to_float8e4m3fn(x, saturate))
          << "value " << x << " saturate " << saturate;
}

TEST(SubByteIntegers, PackUnpackAndWrap) {
  const uint8_t values[] = {1, 0xff /* -1 */, 7, 0xf8 /* -8 */, 3};
  uint8_t packed[3] = {};
  pack_elements(DType::kInt4, values, 5, packed);
  EXPECT_EQ(packed_bytes(DType::kInt4, 5), 3);
  EXPECT_EQ(packed[0], 0xf1);  // the first element in the low bits
  EXPECT_EQ(packed[1], 0x87);
  EXPECT_EQ(packed[2], 0x03);
  uint8_t back[5] = {};
  unpack_elements(DType::kInt4, packed, 5, back);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back[i], values[i]) << i;
  const uint8_t two_bit[] = {1, 0xfe /* -2 */, 0, 0xff /* -1 */, 1};
  uint8_t packed2[2] = {};
  pack_elements(DType::kInt2, two_bit, 5, packed2);
  EXPECT_EQ(packed2[0], 0xc9);  // 01 10 00 11 from the low bits up
  unpack_elements(DType::kInt2, packed2, 5, back);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back[i], two_bit[i]) << i;
  EXPECT_EQ(static_cast<int8_t>(wrap_to_sub_byte(DType::kInt4, 9)), -7);
  EXPECT_EQ(wrap_to_sub_byte(DType::kUInt4, -1), 15);
  EXPECT_EQ(static_cast<int8_t>(wrap_to_sub_byte(DType::kInt2, 2)), -2);
  EXPECT_EQ(wrap_to_sub_byte(DType::kUInt2, 7), 3);
}

TEST(SubByteIntegers, OnnxTensorsArePackedInFiles) {
  onnx::TensorProto proto;
  proto.set_name("w");
  proto.set_data_type(static_cast<int>(DType::kInt4));
  proto.add_dims(3);
  proto.set_raw_data(std::string("\xf1\x07", 2));
  Tensor t = onnx_import::tensor_from_proto(proto, "");
  ASSERT_EQ(t.dtype(), DType::kInt4);
  EXPECT_EQ(t.value_as_int(0), 1);
  EXPECT_EQ(t.value_as_int(1), -1);
  EXPECT_EQ(t.value_as_int(2), 7);
  // int32_data holds one packed byte per entry.
  proto.clear_raw_data();
  proto.add_int32_data(0xf1);
  proto.add_int32_data(0x07);
  EXPECT_EQ(onnx_import::tensor_from_proto(proto, "").value_as_int(1), -1);
  // The unpacked size is refused.
  proto.clear_int32_data();
  proto.set_raw_data(std::string(3, '\0'));
  try {
    onnx_import::tensor_from_proto(proto, "");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 2 packed"), std::string::npos) << e.what();
  }
}

TEST(SubByteIntegers, AWrittenModelKeepsTheValues) {
  // An int4 and a float8e5m2 constant through kiln's ONNX writer and reader.
  GraphBuilder b;
  Tensor w(DType::kUInt4, {5});
  for (int i = 0; i < 5; ++i) static_cast<uint8_t*>(w.raw())[i] = static_cast<uint8_t>(3 * i);
  Tensor f(DType::kFloat8E5M2, {2});
  static_cast<uint8_t*>(f.raw())[0] = 0x3c;
  static_cast<uint8_t*>(f.raw())[1] = 0xc1;
  b.node("Identity", {b.constant("w", w)}, "wo");
  b.node("Identity", {b.constant("f", f)}, "fo");
  b.output("wo");
  b.output("fo");
  const std::string bytes = onnx_export::export_model(b.build());
  ir::Graph g = onnx_import::import_bytes(bytes, "m", "");
  const Tensor* w2 = g.constant("w");
  const Tensor* f2 = g.constant("f");
  ASSERT_TRUE(w2 && f2);
  ASSERT_EQ(w2->dtype(), DType::kUInt4);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(w2->value_as_int(i), 3 * i) << i;
  EXPECT_EQ(f2->value_as_double(0), 1.0);
  EXPECT_EQ(f2->value_as_double(1), -small_float_to_float(DType::kFloat8E5M2, 0x41));
}

}  // namespace
}  // namespace kiln::testing
