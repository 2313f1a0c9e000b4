// Conv, kiln::FusedConv and ConvTranspose: CPU kernels against naive reference loops on random
// inputs, shape inference (auto_pad, symbolic batch), FLOPs and bad-input errors.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "compute_test_util.h"
#include "cpu/conv_winograd.h"
#include "cpu/parallel.h"
#include "cpu/sgemm.h"
#include "ir/activation.h"

namespace kiln {
namespace {

using testing::all_close;
using testing::NodeInput;
using testing::random_tensor;
using testing::run_single_node;

// Steps a multi-index through `dims` in row-major order; false after the last one.
bool next_index(std::vector<int64_t>& idx, const std::vector<int64_t>& dims) {
  for (size_t i = idx.size(); i-- > 0;) {
    if (++idx[i] < dims[i]) return true;
    idx[i] = 0;
  }
  return false;
}

int64_t flat(const std::vector<int64_t>& idx, const std::vector<int64_t>& dims) {
  int64_t f = 0;
  for (size_t i = 0; i < idx.size(); ++i) f = f * dims[i] + idx[i];
  return f;
}

struct Geometry {
  std::vector<int64_t> strides, dilations, pads;  // pads: begins then ends
  int64_t group = 1;
};

// The textbook definition: every output element sums its window.
Tensor reference_conv(const Tensor& x, const Tensor& w, const Tensor* b, const Geometry& g) {
  const size_t sp = static_cast<size_t>(x.rank() - 2);
  const int64_t n = x.dim(0), c = x.dim(1), m = w.dim(0), cg = c / g.group, mg = m / g.group;
  std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end()), k(w.shape().begin() + 2, w.shape().end()), out(sp);
  for (size_t i = 0; i < sp; ++i)
    out[i] = (in[i] + g.pads[i] + g.pads[i + sp] - ((k[i] - 1) * g.dilations[i] + 1)) / g.strides[i] + 1;
  std::vector<int64_t> yshape{n, m};
  yshape.insert(yshape.end(), out.begin(), out.end());
  Tensor y(DType::kFloat32, yshape);
  const float* xv = x.data<float>();
  const float* wv = w.data<float>();
  float* yv = y.data<float>();
  for (int64_t bi = 0; bi < n; ++bi)
    for (int64_t mi = 0; mi < m; ++mi) {
      std::vector<int64_t> o(sp, 0);
      do {
        double acc = b ? b->data<float>()[mi] : 0.0;
        for (int64_t cl = 0; cl < cg; ++cl) {
          int64_t ci = (mi / mg) * cg + cl;
          std::vector<int64_t> kk(sp, 0);
          do {
            std::vector<int64_t> ip(sp);
            bool inside = true;
            for (size_t i = 0; i < sp; ++i) {
              ip[i] = o[i] * g.strides[i] - g.pads[i] + kk[i] * g.dilations[i];
              inside = inside && ip[i] >= 0 && ip[i] < in[i];
            }
            if (inside)
              acc += static_cast<double>(xv[(bi * c + ci) * shape_numel(in) + flat(ip, in)]) *
                     wv[(mi * cg + cl) * shape_numel(k) + flat(kk, k)];
          } while (next_index(kk, k));
        }
        yv[(bi * m + mi) * shape_numel(out) + flat(o, out)] = static_cast<float>(acc);
      } while (next_index(o, out));
    }
  return y;
}

// ConvTranspose by its definition: every input element scatters its kernel-sized patch.
Tensor reference_conv_transpose(const Tensor& x, const Tensor& w, const Tensor* b, const Geometry& g,
                                const std::vector<int64_t>& output_padding) {
  const size_t sp = static_cast<size_t>(x.rank() - 2);
  const int64_t n = x.dim(0), c = x.dim(1), mg = w.dim(1), m = mg * g.group, cg = c / g.group;
  std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end()), k(w.shape().begin() + 2, w.shape().end()), out(sp);
  for (size_t i = 0; i < sp; ++i)
    out[i] = g.strides[i] * (in[i] - 1) + output_padding[i] + (k[i] - 1) * g.dilations[i] + 1 - g.pads[i] -
             g.pads[i + sp];
  std::vector<int64_t> yshape{n, m};
  yshape.insert(yshape.end(), out.begin(), out.end());
  std::vector<double> acc(static_cast<size_t>(shape_numel(yshape)), 0.0);
  const int64_t osz = shape_numel(out);
  if (b)
    for (int64_t bi = 0; bi < n; ++bi)
      for (int64_t mi = 0; mi < m; ++mi)
        for (int64_t p = 0; p < osz; ++p) acc[static_cast<size_t>((bi * m + mi) * osz + p)] = b->data<float>()[mi];
  const float* xv = x.data<float>();
  const float* wv = w.data<float>();
  for (int64_t bi = 0; bi < n; ++bi)
    for (int64_t ci = 0; ci < c; ++ci) {
      std::vector<int64_t> ip(sp, 0);
      do {
        float xval = xv[(bi * c + ci) * shape_numel(in) + flat(ip, in)];
        for (int64_t ml = 0; ml < mg; ++ml) {
          int64_t mi = (ci / cg) * mg + ml;
          std::vector<int64_t> kk(sp, 0);
          do {
            std::vector<int64_t> op(sp);
            bool inside = true;
            for (size_t i = 0; i < sp; ++i) {
              op[i] = ip[i] * g.strides[i] - g.pads[i] + kk[i] * g.dilations[i];
              inside = inside && op[i] >= 0 && op[i] < out[i];
            }
            if (inside)
              acc[static_cast<size_t>((bi * m + mi) * osz + flat(op, out))] +=
                  static_cast<double>(xval) * wv[(ci * mg + ml) * shape_numel(k) + flat(kk, k)];
          } while (next_index(kk, k));
        }
      } while (next_index(ip, in));
    }
  Tensor y(DType::kFloat32, yshape);
  for (size_t i = 0; i < acc.size(); ++i) y.data<float>()[i] = static_cast<float>(acc[i]);
  return y;
}

ir::Node conv_node(const std::string& op, const Geometry& g) {
  ir::Node node;
  node.name = "node0";
  node.op = op;
  if (op == "FusedConv") node.domain = "kiln";
  node.attrs.set("strides", g.strides);
  node.attrs.set("dilations", g.dilations);
  node.attrs.set("pads", g.pads);
  node.attrs.set("group", g.group);
  return node;
}

struct ConvCase {
  const char* name;
  std::vector<int64_t> x, w;
  Geometry g;
  bool bias;
};

std::vector<ConvCase> conv_cases() {
  return {
      {"3x3 pad 1", {1, 3, 9, 9}, {4, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 1}, true},
      {"3x3 stride 2 asymmetric pads", {1, 5, 10, 11}, {6, 5, 3, 3}, {{2, 2}, {1, 1}, {1, 0, 2, 1}, 1}, true},
      {"dilation 2", {1, 4, 12, 12}, {3, 4, 3, 3}, {{1, 1}, {2, 2}, {2, 2, 2, 2}, 1}, false},
      {"rectangular kernel, strides 1x3", {1, 2, 8, 13}, {5, 2, 2, 4}, {{1, 3}, {1, 1}, {0, 1, 1, 0}, 1}, true},
      {"groups 2", {1, 4, 7, 7}, {6, 2, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 2}, true},
      {"groups 3 batch 2", {2, 6, 6, 5}, {9, 2, 3, 3}, {{2, 1}, {1, 1}, {1, 1, 1, 1}, 3}, true},
      {"depthwise 3x3 stride 2", {1, 5, 11, 11}, {5, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 5}, true},
      {"depthwise multiplier 2, dilation", {2, 3, 9, 8}, {6, 1, 3, 3}, {{1, 1}, {2, 1}, {2, 0, 1, 2}, 3}, false},
      {"depthwise 5x5 stride 3", {1, 4, 13, 17}, {4, 1, 5, 5}, {{3, 3}, {1, 1}, {2, 2, 2, 2}, 4}, true},
      // The 3x3 depthwise rows (dilation 1): stride 1 and 2, edges, tiny and all-padding rows.
      {"depthwise 3x3 stride 1", {2, 6, 9, 10}, {6, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 6}, true},
      {"depthwise 3x3 stride 2 odd width", {1, 4, 12, 13}, {4, 1, 3, 3}, {{2, 2}, {1, 1}, {0, 1, 1, 0}, 4}, false},
      {"depthwise 3x3 narrower than the kernel", {1, 3, 4, 2}, {3, 1, 3, 3}, {{1, 1}, {1, 1}, {0, 1, 0, 1}, 3}, true},
      {"depthwise 3x3 rows of padding", {1, 4, 5, 6}, {4, 1, 3, 3}, {{1, 1}, {1, 1}, {3, 1, 3, 1}, 4}, true},
      // Rows of several 8-output vectors and a tail, and unequal strides (the general loop).
      {"depthwise 3x3 stride 2 wide rows", {1, 3, 9, 37}, {3, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 3}, true},
      {"depthwise 3x3 stride 1 wide rows", {2, 2, 5, 41}, {2, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 0, 0, 1}, 2}, true},
      {"depthwise 3x3 strides 1 and 2", {1, 2, 7, 9}, {2, 1, 3, 3}, {{1, 2}, {1, 1}, {1, 1, 1, 1}, 2}, false},
      // Stride 2 read in place (AVX-512): rows of one and two columns, pads wider than the input,
      // no pads, and rows of two 16-output groups and a tail whose loads end inside and past the row.
      {"depthwise 3x3 stride 2 one column", {1, 3, 7, 1}, {3, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 3}, true},
      {"depthwise 3x3 stride 2 two columns, wide pads", {1, 2, 2, 2}, {2, 1, 3, 3}, {{2, 2}, {1, 1}, {2, 3, 2, 3}, 2}, true},
      {"depthwise 3x3 stride 2 no pads", {2, 3, 11, 35}, {3, 1, 3, 3}, {{2, 2}, {1, 1}, {0, 0, 0, 0}, 3}, false},
      {"depthwise 3x3 stride 2 two groups and a tail", {1, 2, 6, 70}, {2, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 0, 1}, 2}, true},
      {"depthwise 3x3 stride 2 MobileNet's 56x56", {1, 2, 56, 56}, {2, 1, 3, 3}, {{2, 2}, {1, 1}, {0, 0, 1, 1}, 2}, true},
      // Depthwise across channels (AVX-512): 16 channels a vector and a partial group, kernels
      // other than 3x3, dilation, unequal strides, asymmetric pads, 3x3 rows of fewer than 16
      // outputs, a batch of two and a plane too wide for the buffer (the general loop).
      {"depthwise 5x5 37 channels batch 2", {2, 37, 9, 11}, {37, 1, 5, 5}, {{1, 1}, {1, 1}, {2, 2, 2, 2}, 37}, true},
      {"depthwise 3x3 to 7x7, 20 channels", {1, 20, 14, 14}, {20, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 20}, true},
      {"depthwise 3x3 at 7x7, 33 channels", {1, 33, 7, 7}, {33, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 33}, false},
      {"depthwise 7x5 dilation 2, strides 2 and 1", {1, 18, 17, 12}, {18, 1, 7, 5}, {{2, 1}, {2, 2}, {3, 0, 5, 4}, 18}, true},
      {"depthwise 5x5 stride 2 wide plane", {1, 17, 40, 45}, {17, 1, 5, 5}, {{2, 2}, {1, 1}, {1, 2, 2, 1}, 17}, false},
      {"depthwise 1x7 over a 300-wide row", {1, 3, 2, 300}, {3, 1, 1, 7}, {{1, 1}, {1, 1}, {0, 3, 0, 3}, 3}, true},
      {"1x1 direct", {1, 16, 9, 9}, {8, 16, 1, 1}, {{1, 1}, {1, 1}, {0, 0, 0, 0}, 1}, true},
      {"1x1 direct batch 3", {3, 8, 5, 6}, {7, 8, 1, 1}, {{1, 1}, {1, 1}, {0, 0, 0, 0}, 1}, true},
      {"1x1 stride 2", {1, 8, 10, 10}, {4, 8, 1, 1}, {{2, 2}, {1, 1}, {0, 0, 0, 0}, 1}, false},
      {"wide output (column split)", {1, 3, 40, 37}, {8, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 1}, true},
      {"wide 1x1 (column split, direct)", {1, 16, 30, 30}, {12, 16, 1, 1}, {{1, 1}, {1, 1}, {0, 0, 0, 0}, 1}, true},
      {"narrow output, many channels (row split)", {1, 32, 4, 4}, {70, 32, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 1}, true},
      {"narrow 1x1 (row split, direct)", {1, 64, 3, 3}, {33, 64, 1, 1}, {{1, 1}, {1, 1}, {0, 0, 0, 0}, 1}, false},
      // Narrow outputs with fewer output channels than outputs: on two threads each task packs
      // its own columns of the im2col matrix (or of X, 1x1) and runs every row of W over them.
      {"narrow, few channels (columns per thread)", {1, 64, 15, 15}, {24, 64, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 1}, true},
      {"narrow stride 2, few channels (columns per thread)", {1, 48, 27, 27}, {20, 48, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 1}, true},
      {"narrow 1x1, few channels (columns per thread, direct)", {1, 384, 14, 14}, {64, 384, 1, 1}, {{1, 1}, {1, 1}, {0, 0, 0, 0}, 1}, false},
      // 3x3 stride 1 with 16 channels or more and 32 tiles of 2x2 outputs or more: Winograd
      // F(2x2, 3x3) on AVX-512 (constant W).
      {"Winograd odd sizes", {1, 16, 13, 11}, {16, 16, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 1}, true},
      {"Winograd rows of more than 16 tiles, no pads", {2, 17, 5, 40}, {20, 17, 3, 3}, {{1, 1}, {1, 1}, {0, 0, 0, 0}, 1}, true},
      {"Winograd asymmetric pads", {1, 16, 11, 10}, {24, 16, 3, 3}, {{1, 1}, {1, 1}, {2, 0, 1, 3}, 1}, false},
      {"3x3 of 16 channels, one output: too few tiles for Winograd", {1, 16, 3, 3}, {16, 16, 3, 3}, {{1, 1}, {1, 1}, {0, 0, 0, 0}, 1}, true},
      {"Winograd wide output", {1, 16, 34, 35}, {33, 16, 3, 3}, {{1, 1}, {1, 1}, {1, 1, 1, 1}, 1}, true},
      {"1-D", {2, 3, 20}, {4, 3, 5}, {{2}, {1}, {2, 1}, 1}, true},
      {"3-D", {1, 2, 5, 6, 7}, {3, 2, 3, 2, 3}, {{1, 2, 1}, {1, 1, 2}, {1, 0, 1, 1, 1, 0}, 1}, true},
      {"3-D depthwise", {1, 3, 4, 5, 6}, {3, 1, 3, 3, 3}, {{1, 1, 2}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, 3}, false},
  };
}

TEST(Conv, MatchesReference) {
  uint32_t seed = 1;
  for (const ConvCase& c : conv_cases())
    for (bool constant_weights : {true, false}) {
      SCOPED_TRACE(std::string(c.name) + (constant_weights ? " (constant W)" : " (runtime W)"));
      Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++);
      Tensor b = random_tensor({c.w[0]}, seed++);
      std::vector<NodeInput> in{{"X", x}, {"W", w, constant_weights}};
      if (c.bias) in.push_back({"B", b, constant_weights});
      Tensor got = run_single_node(conv_node("Conv", c.g), in);
      EXPECT_TRUE(all_close(got, reference_conv(x, w, c.bias ? &b : nullptr, c.g)));
    }
}

TEST(Conv, FusedConvAddsBiasResidualAndActivation) {
  uint32_t seed = 100;
  for (const ConvCase& c : conv_cases())
    for (const char* act : {"Relu", "LeakyRelu", "Sigmoid", "SiLU", "HardSwish", "HardSigmoid", "Clip", ""}) {
      SCOPED_TRACE(std::string(c.name) + " activation '" + act + "'");
      Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++);
      Tensor b = random_tensor({c.w[0]}, seed++);
      Tensor want = reference_conv(x, w, &b, c.g);
      Tensor z = random_tensor(want.shape(), seed++);
      ir::Node node = conv_node("FusedConv", c.g);
      ir::Activation a = ir::Activation::named(act, std::string(act) == "Clip" ? -0.25f : 0.1f, 0.5f);
      a.store(node);
      float* wv = want.data<float>();
      for (int64_t i = 0; i < want.numel(); ++i) wv[i] = a.apply(wv[i] + z.data<float>()[i]);
      Tensor got = run_single_node(node, {{"X", x}, {"W", w, true}, {"B", b, true}, {"Z", z}});
      EXPECT_TRUE(all_close(got, want));
    }
}

// The 3x3 depthwise rows of stride 2 run 16 outputs at a time on AVX-512, reading the input in
// place with masked loads at its edges, and 8 on AVX2, in place where most of a row's groups
// load whole (the 64-, 70- and 35-wide rows below) and from a padded copy otherwise; stride 1
// runs 16 outputs at a time in place on AVX-512 and from the padded copy on AVX2 (the kernel
// follows sgemm_isa()): the same sums bit for bit, both
// against the reference, on rows of one partial group, of several, of exactly 16 and 32
// outputs, of one and two columns, with pads wider than the input and with none, of more than
// the 64 groups whose load masks the stride-2 rows make once per plane (2,086 columns), with a
// residual and Relu.
TEST(Conv, DepthwiseRowsMatchOnEveryVectorWidth) {
  struct Shape {
    int64_t c, h, w;
    std::vector<int64_t> pads;
  };
  const Shape shapes[] = {{3, 9, 37, {1, 1, 1, 1}}, {2, 12, 31, {1, 1, 1, 1}}, {2, 7, 65, {0, 1, 1, 0}},
                          {4, 5, 12, {1, 0, 0, 1}}, {1, 40, 64, {1, 1, 1, 1}}, {3, 7, 1, {1, 1, 1, 1}},
                          {2, 2, 2, {2, 3, 2, 3}}, {2, 11, 35, {0, 0, 0, 0}}, {2, 6, 70, {1, 1, 0, 1}},
                          {2, 16, 16, {1, 1, 1, 1}}, {2, 3, 2086, {1, 1, 1, 1}}};
  uint32_t seed = 4100;
  for (int64_t stride : {1, 2})
  for (const Shape& sh : shapes) {
    SCOPED_TRACE("stride " + std::to_string(stride) + ", " + std::to_string(sh.c) + " channels " + std::to_string(sh.h) +
                 "x" + std::to_string(sh.w));
    Geometry g{{stride, stride}, {1, 1}, sh.pads, sh.c};
    Tensor x = random_tensor({1, sh.c, sh.h, sh.w}, seed++), w = random_tensor({sh.c, 1, 3, 3}, seed++);
    Tensor b = random_tensor({sh.c}, seed++);
    Tensor want = reference_conv(x, w, &b, g);
    Tensor z = random_tensor(want.shape(), seed++);
    for (int64_t i = 0; i < want.numel(); ++i)
      want.data<float>()[i] = std::max(0.f, want.data<float>()[i] + z.data<float>()[i]);
    ir::Node node = conv_node("FusedConv", g);
    ir::Activation{ir::ActivationKind::kRelu}.store(node);
    std::vector<Tensor> got;
    for (cpu::SgemmIsa isa : {cpu::SgemmIsa::kAvx2, cpu::SgemmIsa::kAvx512}) {
      if (cpu::sgemm_best_isa() < isa) continue;  // a CPU without AVX-512 runs the AVX2 rows only
      cpu::sgemm_force_isa(isa);
      got.push_back(run_single_node(node, {{"X", x}, {"W", w, true}, {"B", b, true}, {"Z", z}}));
      cpu::sgemm_reset_isa();
      EXPECT_TRUE(all_close(got.back(), want)) << cpu::sgemm_isa_name(isa);
    }
    for (size_t i = 1; i < got.size(); ++i)
      for (int64_t j = 0; j < want.numel(); ++j)
        ASSERT_EQ(got[0].data<float>()[j], got[i].data<float>()[j]) << "output " << j;
  }
}

// Depthwise convolutions across channels run 16 channels a vector on AVX-512 and 8 on AVX2 (the
// kernel follows sgemm_isa()): kernels other than 3x3, dilation, unequal strides, asymmetric
// pads, partial groups of channels, short and long rows, a batch of two, each with a bias, a
// residual and Relu or Clip, against the reference on both widths.
TEST(Conv, DepthwiseAcrossChannelsMatchesOnEveryVectorWidth) {
  struct Case {
    std::vector<int64_t> x, w;
    Geometry g;
  };
  const Case cases[] = {
      {{2, 37, 9, 11}, {37, 1, 5, 5}, {{1, 1}, {1, 1}, {2, 2, 2, 2}, 37}},
      {{1, 8, 12, 12}, {8, 1, 5, 5}, {{2, 2}, {1, 1}, {2, 2, 2, 2}, 8}},
      {{1, 18, 17, 12}, {18, 1, 7, 5}, {{2, 1}, {2, 2}, {3, 0, 5, 4}, 18}},
      {{1, 17, 40, 45}, {17, 1, 5, 5}, {{2, 2}, {1, 1}, {1, 2, 2, 1}, 17}},
      {{1, 20, 14, 14}, {20, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 20}},
      {{1, 5, 1, 30}, {5, 1, 1, 9}, {{1, 1}, {1, 1}, {0, 4, 0, 4}, 5}},
  };
  uint32_t seed = 5100;
  for (const Case& c : cases)
    for (const char* act : {"Relu", "Clip"}) {
      SCOPED_TRACE(std::to_string(c.w[0]) + " channels, kernel " + std::to_string(c.w[2]) + "x" +
                   std::to_string(c.w[3]) + ", " + act);
      Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++), b = random_tensor({c.w[0]}, seed++);
      Tensor want = reference_conv(x, w, &b, c.g);
      Tensor z = random_tensor(want.shape(), seed++);
      ir::Node node = conv_node("FusedConv", c.g);
      const ir::Activation a = ir::Activation::named(act, -0.25f, 0.5f);
      a.store(node);
      for (int64_t i = 0; i < want.numel(); ++i) want.data<float>()[i] = a.apply(want.data<float>()[i] + z.data<float>()[i]);
      for (cpu::SgemmIsa isa : {cpu::SgemmIsa::kAvx2, cpu::SgemmIsa::kAvx512}) {
        if (cpu::sgemm_best_isa() < isa) continue;  // a CPU without AVX-512 runs the 8-channel form only
        cpu::sgemm_force_isa(isa);
        Tensor got = run_single_node(node, {{"X", x}, {"W", w, true}, {"B", b, true}, {"Z", z}});
        cpu::sgemm_reset_isa();
        EXPECT_TRUE(all_close(got, want)) << cpu::sgemm_isa_name(isa);
      }
    }
}

// Both ways Winograd shares an image among threads, with several images, a residual and Relu
// (kAuto picks by the sizes, so each is forced here); 29x29 outputs make two blocks of tile rows
// per image, the second of two rows, the last half a tile.
TEST(Conv, WinogradSchedulesMatchReference) {
  Geometry g{{1, 1}, {1, 1}, {1, 1, 0, 1}, 1};
  Tensor x = random_tensor({3, 16, 30, 29}, 31), w = random_tensor({24, 16, 3, 3}, 32), b = random_tensor({24}, 33);
  Tensor want = reference_conv(x, w, &b, g);
  Tensor z = random_tensor(want.shape(), 34);
  for (int64_t i = 0; i < want.numel(); ++i)
    want.data<float>()[i] = std::max(0.f, want.data<float>()[i] + z.data<float>()[i]);
  ir::Node node = conv_node("FusedConv", g);
  ir::Activation{ir::ActivationKind::kRelu}.store(node);
  for (cpu::WinogradSchedule schedule : {cpu::WinogradSchedule::kImagePhases, cpu::WinogradSchedule::kThreadBlocks}) {
    SCOPED_TRACE(schedule == cpu::WinogradSchedule::kImagePhases ? "phases" : "blocks");
    cpu::winograd_set_schedule(schedule);
    Tensor got = run_single_node(node, {{"X", x}, {"W", w, true}, {"B", b, true}, {"Z", z}});
    cpu::winograd_set_schedule(cpu::WinogradSchedule::kAuto);
    EXPECT_TRUE(all_close(got, want));
  }
}

// Random shapes, pads, batches and epilogues through Winograd's path (and, below 32 tiles, the
// direct one it falls back to), under both schedules, against the reference.
TEST(Conv, WinogradRandomShapesMatchReference) {
  std::mt19937 rng(2026);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const char* acts[] = {"", "Relu", "Clip", "LeakyRelu"};
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t n = pick(1, 3), c = pick(16, 40), m = pick(16, 40), h = pick(2, 40), w = pick(2, 40);
    Geometry g{{1, 1}, {1, 1}, {pick(0, 2), pick(0, 2), pick(0, 2), pick(0, 2)}, 1};
    if (h + g.pads[0] + g.pads[2] < 3 || w + g.pads[1] + g.pads[3] < 3) continue;  // no output
    const char* act = acts[pick(0, 3)];
    const bool residual = pick(0, 1) == 1;
    const auto schedule = pick(0, 1) ? cpu::WinogradSchedule::kImagePhases : cpu::WinogradSchedule::kThreadBlocks;
    SCOPED_TRACE("trial " + std::to_string(trial) + ": x " + std::to_string(n) + "x" + std::to_string(c) + "x" +
                 std::to_string(h) + "x" + std::to_string(w) + ", " + std::to_string(m) + " filters, pads " +
                 std::to_string(g.pads[0]) + std::to_string(g.pads[1]) + std::to_string(g.pads[2]) +
                 std::to_string(g.pads[3]) + ", activation '" + act + "'" + (residual ? ", residual" : ""));
    const uint32_t seed = static_cast<uint32_t>(1000 + 4 * trial);
    Tensor x = random_tensor({n, c, h, w}, seed), wt = random_tensor({m, c, 3, 3}, seed + 1);
    Tensor b = random_tensor({m}, seed + 2);
    Tensor want = reference_conv(x, wt, &b, g);
    Tensor z = random_tensor(want.shape(), seed + 3);
    ir::Node node = conv_node("FusedConv", g);
    ir::Activation a = ir::Activation::named(act, std::string(act) == "Clip" ? -0.25f : 0.1f, 0.5f);
    a.store(node);
    float* wv = want.data<float>();
    for (int64_t i = 0; i < want.numel(); ++i) wv[i] = a.apply(wv[i] + (residual ? z.data<float>()[i] : 0.f));
    std::vector<NodeInput> in{{"X", x}, {"W", wt, true}, {"B", b, true}};
    if (residual) in.push_back({"Z", z});
    cpu::winograd_set_schedule(schedule);
    Tensor got = run_single_node(node, in);
    cpu::winograd_set_schedule(cpu::WinogradSchedule::kAuto);
    EXPECT_TRUE(all_close(got, want));
  }
}

// An image whose transforms pass 8 MiB runs in parts of tile rows (130x130 outputs of 16
// channels: 4,225 tiles, 8.7 MB of transforms and sums), the last part shorter.
TEST(Conv, WinogradLargeImageRunsInParts) {
  Geometry g{{1, 1}, {1, 1}, {1, 1, 1, 1}, 1};
  Tensor x = random_tensor({1, 16, 130, 130}, 41), w = random_tensor({16, 16, 3, 3}, 42), b = random_tensor({16}, 43);
  cpu::winograd_set_schedule(cpu::WinogradSchedule::kImagePhases);
  Tensor got = run_single_node(conv_node("Conv", g), {{"X", x}, {"W", w, true}, {"B", b, true}});
  cpu::winograd_set_schedule(cpu::WinogradSchedule::kAuto);
  EXPECT_TRUE(all_close(got, reference_conv(x, w, &b, g)));
}

TEST(Conv, FusedConvWithoutBiasTakesResidual) {
  Geometry g{{1, 1}, {1, 1}, {1, 1, 1, 1}, 1};
  Tensor x = random_tensor({1, 4, 6, 6}, 7), w = random_tensor({4, 4, 3, 3}, 8);
  Tensor want = reference_conv(x, w, nullptr, g);
  Tensor z = random_tensor(want.shape(), 9);
  for (int64_t i = 0; i < want.numel(); ++i) want.data<float>()[i] = std::max(0.f, want.data<float>()[i] + z.data<float>()[i]);
  ir::Node node = conv_node("FusedConv", g);
  ir::Activation{ir::ActivationKind::kRelu}.store(node);
  EXPECT_TRUE(all_close(run_single_node(node, {{"X", x}, {"W", w, true}, {"", {}}, {"Z", z}}), want));
}

TEST(Conv, AutoPadResolvesLikeExplicitPads) {
  // in 6, kernel 4, stride 1: total pad 3; SAME_UPPER puts 1 before, SAME_LOWER 2 before.
  // in 7, kernel 3, stride 2: output 4, total pad 2 (1 + 1).
  struct Case {
    const char* auto_pad;
    std::vector<int64_t> x, w, strides, explicit_pads;
  };
  for (const Case& c : std::vector<Case>{{"SAME_UPPER", {1, 2, 6, 6}, {3, 2, 4, 4}, {1, 1}, {1, 1, 2, 2}},
                                         {"SAME_LOWER", {1, 2, 6, 6}, {3, 2, 4, 4}, {1, 1}, {2, 2, 1, 1}},
                                         {"SAME_UPPER", {1, 2, 7, 7}, {3, 2, 3, 3}, {2, 2}, {1, 1, 1, 1}},
                                         {"SAME_LOWER", {1, 2, 8, 8}, {3, 2, 3, 3}, {2, 2}, {1, 1, 0, 0}},
                                         {"VALID", {1, 2, 8, 7}, {3, 2, 3, 2}, {2, 2}, {0, 0, 0, 0}}}) {
    SCOPED_TRACE(std::string(c.auto_pad) + " input " + shape_to_string(c.x));
    Tensor x = random_tensor(c.x, 21), w = random_tensor(c.w, 22);
    ir::Node node;
    node.name = "node0";
    node.op = "Conv";
    node.attrs.set("auto_pad", std::string(c.auto_pad));
    node.attrs.set("strides", c.strides);
    Tensor got = run_single_node(node, {{"X", x}, {"W", w, true}});
    EXPECT_TRUE(all_close(got, reference_conv(x, w, nullptr, {c.strides, {1, 1}, c.explicit_pads, 1})));
  }
}

TEST(Conv, ShapeInferenceKeepsSymbolicBatch) {
  ir::Node node;
  node.name = "node0";
  node.op = "Conv";
  node.attrs.set("strides", std::vector<int64_t>{2, 2});
  node.attrs.set("pads", std::vector<int64_t>{3, 3, 3, 3});
  ir::Graph g = testing::single_node_graph(
      node, {{"X", Tensor(DType::kFloat32, {1, 3, 224, 224})}, {"W", random_tensor({64, 3, 7, 7}, 1), true}},
      {ir::Dims{ir::Dim::named("N"), 3, 224, 224}});
  const ir::Dims& y = *g.value("Y").type.shape;
  EXPECT_EQ(ir::dims_to_string(y), "Nx64x112x112");
  EXPECT_EQ(ir::node_flops(g, g.nodes[0]), 0);  // unknown batch: not counted
  // With batch 1 known: 2 * output elements * fan-in.
  ir::Graph g1 = testing::single_node_graph(
      node, {{"X", Tensor(DType::kFloat32, {1, 3, 224, 224})}, {"W", random_tensor({64, 3, 7, 7}, 1), true}});
  EXPECT_EQ(ir::node_flops(g1, g1.nodes[0]), 2LL * 64 * 112 * 112 * 3 * 7 * 7);

  // One engine runs two batch sizes.
  Tensor w = *g.constant("W");
  node.attrs.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  ir::Graph gs = testing::single_node_graph(
      node, {{"X", Tensor(DType::kFloat32, {1, 3, 10, 10})}, {"W", w, true}},
      {ir::Dims{ir::Dim::named("N"), 3, 10, 10}});
  cpu::CpuEngine dyn(gs);
  for (int64_t n : {1, 3}) {
    Tensor x = random_tensor({n, 3, 10, 10}, 6);
    EXPECT_TRUE(all_close(dyn.run({{"X", x}}).at("Y"), reference_conv(x, w, nullptr, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 1})));
  }
}

TEST(Conv, MismatchedChannelsNamesTheNode) {
  ir::Node node;
  node.name = "my_conv";
  node.op = "Conv";
  try {
    testing::single_node_graph(node, {{"X", Tensor(DType::kFloat32, {1, 3, 8, 8})},
                                      {"W", Tensor(DType::kFloat32, {4, 5, 3, 3}), true}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.node_name(), "my_conv");
    EXPECT_EQ(e.op_type(), "Conv");
    EXPECT_NE(std::string(e.what()).find("3 channels"), std::string::npos) << e.what();
  }
}

TEST(Conv, RejectsBadAttributes) {
  auto expect_error = [](ir::Node node, std::vector<int64_t> w, const std::string& fragment) {
    node.name = "bad";
    try {
      testing::single_node_graph(node, {{"X", Tensor(DType::kFloat32, {1, 4, 8, 8})},
                                        {"W", Tensor(DType::kFloat32, w), true}});
      ADD_FAILURE() << "expected an error mentioning " << fragment;
    } catch (const Error& e) {
      EXPECT_EQ(e.node_name(), "bad");
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  ir::Node n;
  n.op = "Conv";
  ir::Node strides = n;
  strides.attrs.set("strides", std::vector<int64_t>{1, 1, 1});
  expect_error(strides, {4, 4, 3, 3}, "strides");
  ir::Node zero = n;
  zero.attrs.set("strides", std::vector<int64_t>{0, 1});
  expect_error(zero, {4, 4, 3, 3}, "strides");
  ir::Node group = n;
  group.attrs.set("group", int64_t{3});
  expect_error(group, {6, 2, 3, 3}, "channels");
  expect_error(n, {4, 4, 9, 9}, "larger than the padded input");
  ir::Node ks = n;
  ks.attrs.set("kernel_shape", std::vector<int64_t>{5, 5});
  expect_error(ks, {4, 4, 3, 3}, "kernel_shape");
  ir::Node autopad = n;
  autopad.attrs.set("auto_pad", std::string("SAME"));
  expect_error(autopad, {4, 4, 3, 3}, "auto_pad");
  ir::Node fused = n;
  fused.op = "FusedConv";
  fused.domain = "kiln";
  fused.attrs.set("activation", std::string("Swish3"));
  expect_error(fused, {4, 4, 3, 3}, "Swish3");
}

struct ConvTransposeCase {
  const char* name;
  std::vector<int64_t> x, w;
  Geometry g;
  std::vector<int64_t> output_padding;
  bool bias;
};

TEST(ConvTranspose, MatchesReference) {
  std::vector<ConvTransposeCase> cases{
      {"3x3 stride 1", {1, 3, 5, 5}, {3, 4, 3, 3}, {{1, 1}, {1, 1}, {0, 0, 0, 0}, 1}, {0, 0}, true},
      {"stride 2 pad 1 output_padding 1", {1, 4, 6, 5}, {4, 3, 3, 3}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 1}, {1, 1}, true},
      {"asymmetric pads, dilation", {2, 2, 4, 6}, {2, 3, 3, 2}, {{2, 1}, {2, 2}, {0, 1, 2, 0}, 1}, {0, 0}, false},
      {"groups 2", {1, 4, 5, 5}, {4, 3, 2, 2}, {{2, 2}, {1, 1}, {0, 0, 0, 0}, 2}, {0, 0}, true},
      {"stride 2 kernel 4 (upsampling)", {1, 8, 7, 7}, {8, 5, 4, 4}, {{2, 2}, {1, 1}, {1, 1, 1, 1}, 1}, {0, 0}, true},
      {"1-D", {1, 3, 9}, {3, 2, 3}, {{3}, {1}, {1, 0}, 1}, {2}, true},
      {"3-D", {1, 2, 3, 4, 3}, {2, 2, 2, 3, 2}, {{2, 1, 2}, {1, 1, 1}, {0, 1, 0, 0, 0, 1}, 1}, {1, 0, 0}, false},
  };
  uint32_t seed = 300;
  for (const ConvTransposeCase& c : cases)
    // The case's batch (products split over the threads), and images enough for every thread to
    // take whole images (a product and its scatter each).
    for (int64_t batch : {c.x[0], int64_t{2} * cpu::thread_count() + 1}) {
      SCOPED_TRACE(std::string(c.name) + ", batch " + std::to_string(batch));
      std::vector<int64_t> shape = c.x;
      shape[0] = batch;
      Tensor x = random_tensor(shape, seed++), w = random_tensor(c.w, seed++);
      Tensor b = random_tensor({c.w[1] * c.g.group}, seed++);
      ir::Node node = conv_node("ConvTranspose", c.g);
      node.attrs.set("output_padding", c.output_padding);
      std::vector<NodeInput> in{{"X", x}, {"W", w, true}};
      if (c.bias) in.push_back({"B", b, true});
      EXPECT_TRUE(all_close(run_single_node(node, in),
                            reference_conv_transpose(x, w, c.bias ? &b : nullptr, c.g, c.output_padding)));
    }
}

TEST(ConvTranspose, OutputShapeAndAutoPadFollowOnnxPadSplit) {
  // in 3, stride 2, kernel 3: the natural output is 7. output_shape 6 needs a total pad of 1;
  // outside SAME_UPPER, ONNX gives the begin the larger half (1) and the end the smaller (0).
  Tensor x = random_tensor({1, 1, 3, 3}, 40), w = random_tensor({1, 2, 3, 3}, 41);
  ir::Node node;
  node.name = "node0";
  node.op = "ConvTranspose";
  node.attrs.set("strides", std::vector<int64_t>{2, 2});
  node.attrs.set("output_shape", std::vector<int64_t>{6, 6});
  Geometry notset{{2, 2}, {1, 1}, {1, 1, 0, 0}, 1};  // total 1: begin gets total - total/2 = 1
  EXPECT_TRUE(all_close(run_single_node(node, {{"X", x}, {"W", w, true}}),
                        reference_conv_transpose(x, w, nullptr, notset, {0, 0})));
  ir::Node same = node;
  same.attrs.erase("output_shape");
  same.attrs.set("auto_pad", std::string("SAME_UPPER"));  // output in*stride = 6, begin total/2 = 0
  Geometry upper{{2, 2}, {1, 1}, {0, 0, 1, 1}, 1};
  EXPECT_TRUE(all_close(run_single_node(same, {{"X", x}, {"W", w, true}}),
                        reference_conv_transpose(x, w, nullptr, upper, {0, 0})));
}

}  // namespace
}  // namespace kiln
