// Reductions and ArgMax/ArgMin against a naive reference over every axis set; importer
// rewrites of the axes attribute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "elementwise_util.h"
#include "onnx/importer.h"

namespace kiln {
namespace {

using ew_test::make_node;
using ew_test::run_node;

// Naive: groups input elements by their output index (reduced coordinates zeroed).
std::vector<float> reference(const std::string& op, const Tensor& x, const std::vector<int64_t>& axes) {
  std::vector<int64_t> out_shape = x.shape();
  for (int64_t a : axes) out_shape[static_cast<size_t>(a)] = 1;
  std::vector<std::vector<double>> groups(static_cast<size_t>(shape_numel(out_shape)));
  for (int64_t i = 0; i < x.numel(); ++i) {
    std::vector<int64_t> idx = ew_test::unravel(i, x.shape());
    for (int64_t a : axes) idx[static_cast<size_t>(a)] = 0;
    int64_t o = 0;
    for (size_t d = 0; d < idx.size(); ++d) o = o * out_shape[d] + idx[d];
    groups[static_cast<size_t>(o)].push_back(x.data<float>()[i]);
  }
  std::vector<float> y;
  for (const auto& g : groups) {
    double acc = op == "ReduceProd" ? 1 : 0, mx = -1e300, mn = 1e300;
    for (double v : g) {
      mx = std::max(mx, v);
      mn = std::min(mn, v);
      if (op == "ReduceProd") acc *= v;
      else if (op == "ReduceL1") acc += std::fabs(v);
      else if (op == "ReduceL2" || op == "ReduceSumSquare") acc += v * v;
      else if (op == "ReduceLogSumExp") acc += std::exp(v);
      else acc += v;
    }
    if (op == "ReduceMean") acc /= double(g.size());
    if (op == "ReduceMax") acc = mx;
    if (op == "ReduceMin") acc = mn;
    if (op == "ReduceL2") acc = std::sqrt(acc);
    if (op == "ReduceLogSumExp" || op == "ReduceLogSum") acc = std::log(acc);
    y.push_back(float(acc));
  }
  return y;
}

TEST(Reduce, AllOpsAllAxisSets) {
  Tensor x = ew_test::random_floats({3, 4, 5}, 40, 0.5f, 1.5f);  // positive: LogSum is defined
  const std::vector<std::vector<int64_t>> axis_sets = {{0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1}, {0, 1, 2}};
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})
    for (const auto& axes : axis_sets)
      for (int64_t keep : {0, 1}) {
        ir::Node n = make_node(op);
        n.attrs.set("keepdims", keep);
        Tensor axes_t = Tensor::from_vector<int64_t>({int64_t(axes.size())}, axes);
        Tensor y = run_node(n, {{x}, {axes_t, true}})[0];
        std::vector<int64_t> want_shape;
        for (int64_t d = 0; d < 3; ++d) {
          bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
          if (!reduced) want_shape.push_back(x.dim(int(d)));
          else if (keep) want_shape.push_back(1);
        }
        ASSERT_EQ(y.shape(), want_shape) << op;
        SCOPED_TRACE(op);
        ew_test::expect_close(y, reference(op, x, axes), 1e-4f);
      }
}

TEST(Reduce, EmptyAxesAndNegativeAxes) {
  Tensor x = ew_test::random_floats({2, 3}, 41);
  Tensor all = run_node(make_node("ReduceSum"), {{x}})[0];
  EXPECT_EQ(all.shape(), (std::vector<int64_t>{1, 1}));
  ew_test::expect_close(all, reference("ReduceSum", x, {0, 1}));
  ir::Node noop = make_node("ReduceSum");
  noop.attrs.set("noop_with_empty_axes", int64_t{1});
  ew_test::expect_close(run_node(noop, {{x}})[0], std::vector<float>(x.data<float>(), x.data<float>() + 6));
  Tensor neg = Tensor::from_vector<int64_t>({1}, {-1});
  ew_test::expect_close(run_node(make_node("ReduceMax"), {{x}, {neg, true}})[0], reference("ReduceMax", x, {1}));
  Tensor bad = Tensor::from_vector<int64_t>({1}, {2});
  EXPECT_THROW(run_node(make_node("ReduceMax"), {{x}, {bad, true}}), Error);
  Tensor twice = Tensor::from_vector<int64_t>({2}, {1, -1});
  EXPECT_THROW(run_node(make_node("ReduceMax"), {{x}, {twice, true}}), Error);
}

TEST(Reduce, IntegerSum) {
  Tensor x = Tensor::from_vector<int64_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor axes = Tensor::from_vector<int64_t>({1}, {0});
  EXPECT_EQ(run_node(make_node("ReduceSum"), {{x}, {axes, true}})[0].to_int_vector(), (std::vector<int64_t>{5, 7, 9}));
}

// Integer results that do not fit: real-valued ones (L2, LogSum) saturate at the type's range,
// sums and products wrap, as defined behaviour (fuzz_onnx_import found ReduceL2 of uint8 at
// 859.9 converted to uint8 with undefined behaviour).
TEST(Reduce, IntegerResultsOutOfRangeSaturateOrWrap) {
  auto reduce_all = [](const char* op, const Tensor& x) {
    ir::Node n = make_node(op);
    n.attrs.set("keepdims", int64_t{0});
    return run_node(n, {{x}})[0];
  };
  Tensor small = Tensor::from_vector<uint8_t>({2}, {30, 30});
  EXPECT_EQ(reduce_all("ReduceL2", small).data<uint8_t>()[0], 42);  // sqrt(1800) = 42.4, truncated
  Tensor big = Tensor::from_vector<uint8_t>({12}, std::vector<uint8_t>(12, 255));
  EXPECT_EQ(reduce_all("ReduceL2", big).data<uint8_t>()[0], 255);  // sqrt(780300) = 883.3
  Tensor zeros = Tensor::from_vector<int32_t>({3}, {0, 0, 0});
  EXPECT_EQ(reduce_all("ReduceLogSum", zeros).data<int32_t>()[0], INT32_MIN);  // log(0) = -inf
  Tensor negative = Tensor::from_vector<int32_t>({2}, {-5, 1});
  EXPECT_EQ(reduce_all("ReduceLogSum", negative).data<int32_t>()[0], 0);  // log(-4) is NaN
  Tensor edge = Tensor::from_vector<int64_t>({2}, {INT64_MAX, 1});
  EXPECT_EQ(reduce_all("ReduceSum", edge).data<int64_t>()[0], INT64_MIN);
  EXPECT_EQ(reduce_all("ReduceProd", Tensor::from_vector<int64_t>({2}, {INT64_MAX, 2})).data<int64_t>()[0], -2);
  EXPECT_EQ(reduce_all("ReduceL1", Tensor::from_vector<int64_t>({1}, {INT64_MIN})).data<int64_t>()[0], INT64_MIN);
  EXPECT_EQ(reduce_all("ReduceL1", Tensor::from_vector<int8_t>({3}, {-100, -100, 50})).data<int8_t>()[0],
            static_cast<int8_t>(250));  // 250 wraps to -6 in int8
}

// A scalar reduced over axis 0 (or no axes) is its one element reduced: ReduceL1 |x|, ReduceSum x,
// ReduceSumSquare x*x; axis 1 is out of range (fuzz_onnx_import: axes [0] on a rank-0 input
// indexed past an empty axis list).
TEST(Reduce, AScalarOverAxisZeroIsItsOneElement) {
  Tensor scalar = Tensor::from_vector<int32_t>({}, {-7});
  Tensor axis0 = Tensor::from_vector<int64_t>({1}, {0});
  for (const char* op : {"ReduceL1", "ReduceSum", "ReduceSumSquare"}) {
    ir::Node n = make_node(op);
    n.attrs.set("keepdims", int64_t{0});
    const Tensor y = run_node(n, {{scalar}, {axis0, true}})[0];
    EXPECT_EQ(y.shape(), std::vector<int64_t>{}) << op;
    const int64_t want = std::string(op) == "ReduceL1" ? 7 : std::string(op) == "ReduceSum" ? -7 : 49;
    EXPECT_EQ(y.to_int_vector(), (std::vector<int64_t>{want})) << op;
    EXPECT_EQ(run_node(n, {{scalar}})[0].to_int_vector(), (std::vector<int64_t>{want})) << op;
  }
  Tensor axis1 = Tensor::from_vector<int64_t>({1}, {1});
  EXPECT_THROW(run_node(make_node("ReduceSum"), {{scalar}, {axis1, true}}), Error);
}

TEST(Reduce, ArgMaxArgMinWithTiesAndLastIndex) {
  Tensor x = Tensor::from_vector<float>({2, 4}, {1, 3, 3, 0, 2, 2, 2, 5});
  ir::Node n = make_node("ArgMax");
  n.attrs.set("axis", int64_t{1});
  n.attrs.set("keepdims", int64_t{0});
  Tensor y = run_node(n, {{x}})[0];
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{2}));
  EXPECT_EQ(y.to_int_vector(), (std::vector<int64_t>{1, 3}));
  n.attrs.set("select_last_index", int64_t{1});
  EXPECT_EQ(run_node(n, {{x}})[0].to_int_vector(), (std::vector<int64_t>{2, 3}));
  ir::Node m = make_node("ArgMin");  // axis 0, keepdims 1
  Tensor z = run_node(m, {{x}})[0];
  EXPECT_EQ(z.shape(), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(z.to_int_vector(), (std::vector<int64_t>{0, 1, 1, 0}));
}

TEST(Reduce, OldOpsetAxesAttributeBecomesInput) {
  Tensor x = ew_test::random_floats({2, 3, 4}, 42);
  ir::Graph g11 = onnx_import::import_file(ew_test::test_data("reducesum_opset11_axes_attr.onnx"));
  ASSERT_EQ(g11.nodes.size(), 1u);
  EXPECT_FALSE(g11.nodes[0].attrs.has("axes"));
  ASSERT_EQ(g11.nodes[0].inputs.size(), 2u);
  Tensor y = cpu::CpuEngine(g11).run({{"X", x}}).at("Y");
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{2, 4}));
  ew_test::expect_close(y, reference("ReduceSum", x, {1}));

  ir::Graph g13 = onnx_import::import_file(ew_test::test_data("reducemean_opset13_axes_attr.onnx"));
  Tensor m = cpu::CpuEngine(g13).run({{"X", x}}).at("Y");
  EXPECT_EQ(m.shape(), (std::vector<int64_t>{2, 3, 1}));
  ew_test::expect_close(m, reference("ReduceMean", x, {2}));
}

}  // namespace
}  // namespace kiln
