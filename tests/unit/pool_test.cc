// Pooling against a naive reference that pads explicitly, and the output-size rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "cpu/sgemm.h"
#include "elementwise_util.h"

namespace kiln {
namespace {

using ew_test::make_node;
using ew_test::run_node;

struct Pool2d {
  int64_t kh, kw, sh, sw, dh = 1, dw = 1;
  int64_t pt = 0, pl = 0, pb = 0, pr = 0;
  bool ceil = false;
};

ir::Node pool_node(const std::string& op, const Pool2d& p) {
  ir::Node n = make_node(op);
  n.attrs.set("kernel_shape", std::vector<int64_t>{p.kh, p.kw});
  n.attrs.set("strides", std::vector<int64_t>{p.sh, p.sw});
  n.attrs.set("dilations", std::vector<int64_t>{p.dh, p.dw});
  n.attrs.set("pads", std::vector<int64_t>{p.pt, p.pl, p.pb, p.pr});
  n.attrs.set("ceil_mode", int64_t{p.ceil});
  return n;
}

// Reference: visits every window tap; a tap is "in" when inside the input, "padded" when
// inside input + pads.
std::vector<float> reference(const Tensor& x, const Pool2d& p, const std::vector<int64_t>& out_shape, bool max,
                             bool include_pad) {
  const int64_t nc = x.dim(0) * x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t OH = out_shape[2], OW = out_shape[3];
  std::vector<float> y;
  for (int64_t c = 0; c < nc; ++c)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        float best = -std::numeric_limits<float>::infinity();
        double sum = 0;
        int64_t in = 0, padded = 0;
        for (int64_t i = 0; i < p.kh; ++i)
          for (int64_t j = 0; j < p.kw; ++j) {
            int64_t h = oh * p.sh - p.pt + i * p.dh, w = ow * p.sw - p.pl + j * p.dw;
            if (h < H + p.pb && w < W + p.pr) ++padded;
            if (h < 0 || w < 0 || h >= H || w >= W) continue;
            float v = x.data<float>()[(c * H + h) * W + w];
            best = std::max(best, v);
            sum += v;
            ++in;
          }
        y.push_back(max ? best : float(sum / double(include_pad ? padded : in)));
      }
  return y;
}

int64_t expected_size(int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe, bool ceil) {
  double span = double(in + pb + pe - ((k - 1) * d + 1)) / double(s);
  int64_t out = (ceil ? int64_t(std::ceil(span)) : int64_t(std::floor(span))) + 1;
  if (ceil && (out - 1) * s >= in + pb) --out;
  return out;
}

TEST(Pool, MaxAndAverageMatchReference) {
  const Pool2d cases[] = {
      {3, 3, 2, 2, 1, 1, 1, 1, 1, 1, false},  // ResNet stem max pool
      {2, 2, 2, 2, 1, 1, 0, 0, 0, 0, true},   // ceil mode, odd input
      {3, 2, 1, 2, 2, 1, 2, 0, 1, 1, false},  // dilation, asymmetric pads
      {3, 3, 2, 2, 1, 1, 1, 1, 1, 1, true},
  };
  uint32_t seed = 20;
  for (const Pool2d& p : cases) {
    Tensor x = ew_test::random_floats({2, 3, 9, 7}, seed++);
    std::vector<int64_t> want_shape = {2, 3, expected_size(9, p.kh, p.sh, p.dh, p.pt, p.pb, p.ceil),
                                       expected_size(7, p.kw, p.sw, p.dw, p.pl, p.pr, p.ceil)};
    Tensor mx = run_node(pool_node("MaxPool", p), {{x}})[0];
    ASSERT_EQ(mx.shape(), want_shape);
    ew_test::expect_close(mx, reference(x, p, want_shape, true, false));
    for (int64_t include : {0, 1}) {
      ir::Node avg = pool_node("AveragePool", p);
      avg.attrs.set("count_include_pad", include);
      Tensor y = run_node(avg, {{x}})[0];
      ASSERT_EQ(y.shape(), want_shape);
      ew_test::expect_close(y, reference(x, p, want_shape, false, include != 0));
    }
  }
}

// int8 and uint8 (INT8 engines pool their quantized images) take the same separable loop as
// float32 and agree with the reference on the same values; a window wholly in the padding
// gives the type's lowest value, as float32's gives its lowest.
TEST(Pool, MaxPoolOfBytesMatchesReference) {
  const Pool2d cases[] = {
      {3, 3, 2, 2, 1, 1, 1, 1, 1, 1, false},
      {3, 2, 1, 2, 2, 1, 2, 0, 1, 1, false},
      {3, 3, 2, 2, 1, 1, 1, 1, 1, 1, true},
      {2, 2, 3, 3, 1, 1, 2, 2, 0, 0, false},  // the first window row and column lie in the padding
  };
  uint32_t seed = 40;
  for (const DType dtype : {DType::kInt8, DType::kUInt8})
    for (const Pool2d& p : cases) {
      Tensor xf = ew_test::random_floats({2, 3, 9, 7}, seed++);
      Tensor x(dtype, xf.shape());
      for (int64_t i = 0; i < x.numel(); ++i) {
        const float v = std::round(xf.data<float>()[i] * 120.f);
        if (dtype == DType::kInt8) x.data<int8_t>()[i] = static_cast<int8_t>(v);
        else x.data<uint8_t>()[i] = static_cast<uint8_t>(std::fabs(v));
        xf.data<float>()[i] = dtype == DType::kInt8 ? static_cast<float>(x.data<int8_t>()[i]) : static_cast<float>(x.data<uint8_t>()[i]);
      }
      std::vector<int64_t> want_shape = {2, 3, expected_size(9, p.kh, p.sh, p.dh, p.pt, p.pb, p.ceil),
                                         expected_size(7, p.kw, p.sw, p.dw, p.pl, p.pr, p.ceil)};
      Tensor y = run_node(pool_node("MaxPool", p), {{x}})[0];
      ASSERT_EQ(y.shape(), want_shape);
      ASSERT_EQ(y.dtype(), dtype);
      const std::vector<float> want = reference(xf, p, want_shape, true, false);
      const float lowest = dtype == DType::kInt8 ? -128.f : 0.f;
      for (int64_t i = 0; i < y.numel(); ++i) {
        const float got = dtype == DType::kInt8 ? static_cast<float>(y.data<int8_t>()[i]) : static_cast<float>(y.data<uint8_t>()[i]);
        const float expected = std::isinf(want[static_cast<size_t>(i)]) ? lowest : want[static_cast<size_t>(i)];
        ASSERT_EQ(got, expected) << to_string(dtype) << " output " << i;
      }
    }
}

// Windows for the vector column passes of MaxPool (and one they leave to the plain loop).
const Pool2d kColumnPassCases[] = {
    {3, 3, 2, 2, 1, 1, 1, 1, 1, 1, false},  // ResNet's stem pool
    {2, 2, 2, 2, 1, 1, 0, 0, 0, 0, false},
    {3, 5, 1, 1, 1, 1, 1, 2, 1, 2, false},  // stride 1, pads on both sides
    {1, 4, 1, 2, 1, 1, 0, 3, 0, 0, true},   // stride 2, wide kernel, left pad only, ceil mode
    {3, 3, 2, 2, 1, 2, 1, 1, 1, 1, false},  // dilation 2: the plain loop
};

// float32 MaxPool's column pass runs 16 outputs at a time on AVX-512 where a window lies inside
// the row (stride 1 or 2, dilation 1): bit for bit the plain loop's outputs (NaN and -inf
// included, in the same order of taps), on rows wide enough for several vectors and a partial
// one, with windows reaching into the pads on either side.
TEST(Pool, MaxPoolVectorColumnsMatchThePlainLoop) {
  uint32_t seed = 70;
  for (const Pool2d& p : kColumnPassCases)
    for (const int64_t width : {7, 40, 83}) {
      Tensor x = ew_test::random_floats({1, 3, 6, width}, seed++);
      float* xv = x.data<float>();
      xv[5] = std::numeric_limits<float>::quiet_NaN();
      xv[width + 20 < x.numel() ? width + 20 : 1] = -std::numeric_limits<float>::infinity();
      xv[x.numel() - 3] = std::numeric_limits<float>::quiet_NaN();
      Tensor fast = run_node(pool_node("MaxPool", p), {{x}})[0];
      cpu::sgemm_force_isa(cpu::SgemmIsa::kPlain);
      Tensor plain = run_node(pool_node("MaxPool", p), {{x}})[0];
      cpu::sgemm_reset_isa();
      ASSERT_EQ(fast.shape(), plain.shape());
      for (int64_t i = 0; i < fast.numel(); ++i) {
        const float a = fast.data<float>()[i], b = plain.data<float>()[i];
        ASSERT_TRUE(std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, sizeof a) == 0)
            << "case " << p.kh << "x" << p.kw << " s" << p.sw << " width " << width << " output " << i << ": " << a
            << " against " << b;
      }
      std::vector<int64_t> want_shape = {1, 3, expected_size(6, p.kh, p.sh, p.dh, p.pt, p.pb, p.ceil),
                                         expected_size(width, p.kw, p.sw, p.dw, p.pl, p.pr, p.ceil)};
      ASSERT_EQ(fast.shape(), want_shape);
    }
}

// int8 MaxPool's column pass runs 16 outputs at a time on AVX2 where a window lies inside the
// row (stride 1 or 2, dilation 1): the same integers as float32's plain loop on the same values
// (the extremes included), on rows of several vectors and a partial one, pads on either side.
TEST(Pool, Int8MaxPoolVectorColumnsMatchTheFloatLoop) {
  std::mt19937 rng(71);
  std::uniform_int_distribution<int> byte(-128, 127);
  for (const Pool2d& p : kColumnPassCases)
    for (const int64_t width : {7, 40, 83, 130}) {
      Tensor q(DType::kInt8, {1, 3, 6, width}), f(DType::kFloat32, {1, 3, 6, width});
      for (int64_t i = 0; i < q.numel(); ++i) {
        const int v = i % 17 == 0 ? 127 : i % 13 == 0 ? -128 : byte(rng);
        q.data<int8_t>()[i] = static_cast<int8_t>(v);
        f.data<float>()[i] = static_cast<float>(v);
      }
      Tensor got = run_node(pool_node("MaxPool", p), {{q}})[0];
      cpu::sgemm_force_isa(cpu::SgemmIsa::kPlain);
      Tensor want = run_node(pool_node("MaxPool", p), {{f}})[0];
      cpu::sgemm_reset_isa();
      ASSERT_EQ(got.shape(), want.shape());
      for (int64_t i = 0; i < got.numel(); ++i)
        ASSERT_EQ(static_cast<float>(got.data<int8_t>()[i]), want.data<float>()[i])
            << "case " << p.kh << "x" << p.kw << " s" << p.sw << " width " << width << " output " << i;
    }
}

TEST(Pool, SameUpperPadsAtTheEnd) {
  ir::Node n = make_node("MaxPool");
  n.attrs.set("kernel_shape", std::vector<int64_t>{2});
  n.attrs.set("strides", std::vector<int64_t>{2});
  n.attrs.set("auto_pad", std::string("SAME_UPPER"));
  Tensor x = Tensor::from_vector<float>({1, 1, 5}, {1, 5, 2, 4, 3});
  Tensor y = run_node(n, {{x}})[0];
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{1, 1, 3}));
  ew_test::expect_close(y, {5, 4, 3});
}

TEST(Pool, MaxPoolIndices) {
  ir::Node n = make_node("MaxPool");
  n.attrs.set("kernel_shape", std::vector<int64_t>{2, 2});
  n.attrs.set("strides", std::vector<int64_t>{2, 2});
  Tensor x = Tensor::from_vector<float>({1, 2, 2, 2}, {1, 4, 3, 2, 9, 5, 6, 7});
  std::vector<Tensor> out = run_node(n, {{x}}, 2);
  ew_test::expect_close(out[0], {4, 9});
  EXPECT_EQ(out[1].to_int_vector(), (std::vector<int64_t>{1, 4}));
  n.attrs.set("storage_order", int64_t{1});  // column-major: (h=0, w=1) -> 0 + 1 * H = 2
  EXPECT_EQ(run_node(n, {{x}}, 2)[1].to_int_vector(), (std::vector<int64_t>{2, 4}));
}

TEST(Pool, GlobalPools) {
  Tensor x = ew_test::random_floats({2, 3, 4, 5}, 30);
  Tensor avg = run_node(make_node("GlobalAveragePool"), {{x}})[0];
  Tensor mx = run_node(make_node("GlobalMaxPool"), {{x}})[0];
  EXPECT_EQ(avg.shape(), (std::vector<int64_t>{2, 3, 1, 1}));
  for (int64_t c = 0; c < 6; ++c) {
    double s = 0;
    float m = -1e30f;
    for (int64_t i = 0; i < 20; ++i) {
      s += x.data<float>()[c * 20 + i];
      m = std::max(m, x.data<float>()[c * 20 + i]);
    }
    EXPECT_NEAR(avg.data<float>()[c], s / 20, 1e-5);
    EXPECT_EQ(mx.data<float>()[c], m);
  }
}

TEST(Pool, SymbolicBatchAndBadKernels) {
  ir::Graph g;
  ir::Value v;
  v.name = "x";
  v.type.dtype = DType::kFloat32;
  v.type.shape = ir::Dims{ir::Dim::named("N"), 3, 8, 8};
  g.set_value(v);
  g.inputs.push_back("x");
  Pool2d p{3, 3, 2, 2, 1, 1, 1, 1, 1, 1, false};
  ir::Node n = pool_node("MaxPool", p);
  n.name = "pool";
  n.inputs = {"x"};
  n.outputs = {"y"};
  g.nodes.push_back(n);
  ir::infer_shapes(g);
  EXPECT_EQ(ir::dims_to_string(*g.value("y").type.shape), "Nx3x4x4");

  Pool2d big{5, 5, 1, 1};
  try {
    run_node(pool_node("AveragePool", big), {{ew_test::random_floats({1, 1, 3, 3}, 1)}});
    FAIL() << "a kernel larger than the input was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
    EXPECT_EQ(e.op_type(), "AveragePool");
  }
  ir::Node wrong = make_node("MaxPool");
  wrong.attrs.set("kernel_shape", std::vector<int64_t>{3});
  EXPECT_THROW(run_node(wrong, {{ew_test::random_floats({1, 1, 3, 3}, 1)}}), Error);
}

}  // namespace
}  // namespace kiln
