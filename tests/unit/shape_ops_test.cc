// Tests of the shape and data-movement ops: symbolic shape inference through exported
// dynamic-batch chains, CPU kernels against hand-computed values and naive references, and
// errors that name the node.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cpu/engine.h"
#include "ir/op_schema.h"
#include "ops/non_zero.h"
#include "ops/slice_params.h"

namespace kiln {
namespace {

using ir::Dim;
using ir::Dims;

// A small graph builder: runtime inputs, constants and nodes, then shape inference.
struct Builder {
  ir::Graph g;
  int counter = 0;

  std::string input(const std::string& name, DType dtype, Dims shape) {
    ir::Value v;
    v.name = name;
    v.type.dtype = dtype;
    v.type.shape = std::move(shape);
    g.set_value(v);
    g.inputs.push_back(name);
    return name;
  }
  std::string constant(Tensor t) { return g.add_constant("c", std::move(t)); }
  std::string ints(std::vector<int64_t> v) {
    return constant(Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v));
  }
  std::vector<std::string> node(const std::string& op, std::vector<std::string> inputs, ir::Attributes attrs = {},
                                int outputs = 1) {
    ir::Node n;
    n.name = op + "_" + std::to_string(counter++);
    n.op = op;
    n.inputs = std::move(inputs);
    for (int i = 0; i < outputs; ++i) n.outputs.push_back(n.name + "_out" + std::to_string(i));
    n.attrs = std::move(attrs);
    std::vector<std::string> outs = n.outputs;
    g.nodes.push_back(std::move(n));
    return outs;
  }
  std::string one(const std::string& op, std::vector<std::string> inputs, ir::Attributes attrs = {}) {
    return node(op, std::move(inputs), std::move(attrs))[0];
  }
  const ir::TensorType& type(const std::string& v) const { return g.value(v).type; }
};

ir::Attributes attrs(std::initializer_list<std::pair<std::string, ir::AttrValue>> list) {
  ir::Attributes a;
  for (const auto& [k, v] : list) a.set(k, v);
  return a;
}

// Runs a graph on the CPU engine with the given outputs.
std::map<std::string, Tensor> run(ir::Graph g, std::vector<std::string> outputs, const std::map<std::string, Tensor>& in) {
  g.outputs = std::move(outputs);
  ir::infer_shapes(g);
  cpu::CpuEngine engine(std::move(g));
  return engine.run(in);
}

// Runs a single node whose input 0 is a runtime input and the rest are constants.
Tensor run_one(const std::string& op, const Tensor& x, std::vector<Tensor> consts = {}, ir::Attributes a = {}) {
  Builder b;
  std::vector<std::string> ins = {b.input("x", x.dtype(), ir::dims_of(x.shape()))};
  for (Tensor& t : consts) ins.push_back(t.defined() ? b.constant(t) : "");
  std::string out = b.one(op, ins, a);
  return run(std::move(b.g), {out}, {{"x", x}})[out];
}

template <class T>
std::vector<T> values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

Tensor iota_float(std::vector<int64_t> shape) {
  Tensor t(DType::kFloat32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  return t;
}

std::string dims(const ir::TensorType& t) { return t.shape ? ir::dims_to_string(*t.shape) : "unknown rank"; }

TEST(ShapeOps, DynamicBatchReshapeChainInfersSymbolicShape) {
  // What torch.onnx.export writes for x.view(x.size(0), -1).
  Builder b;
  std::string x = b.input("x", DType::kFloat32, {Dim::named("N"), 3, 8, 8});
  std::string shape = b.one("Shape", {x});
  std::string n = b.one("Gather", {shape, b.constant(Tensor::scalar<int64_t>(0))}, attrs({{"axis", int64_t{0}}}));
  std::string n1 = b.one("Unsqueeze", {n, b.ints({0})});
  std::string target = b.one("Concat", {n1, b.ints({-1})}, attrs({{"axis", int64_t{0}}}));
  std::string y = b.one("Reshape", {x, target});
  ir::infer_shapes(b.g);
  EXPECT_EQ(dims(b.type(y)), "Nx192");
  ASSERT_TRUE(b.g.value(target).symbolic_value);
  EXPECT_EQ(ir::dims_to_string(*b.g.value(n).symbolic_value), "N");

  // At run time the same chain gives concrete shapes and the data unchanged.
  Tensor in = iota_float({2, 3, 8, 8});
  Tensor out = run(b.g, {y}, {{"x", in}})[y];
  EXPECT_EQ(out.shape(), (std::vector<int64_t>{2, 192}));
  EXPECT_EQ(values<float>(out), values<float>(in));
}

TEST(ShapeOps, ReshapeInfersMinusOneAroundSymbols) {
  Builder b;
  std::string x = b.input("x", DType::kFloat32, {Dim::named("N"), 512, 1, 1});
  std::string n = b.one("Gather", {b.one("Shape", {x}), b.ints({0})}, attrs({{"axis", int64_t{0}}}));
  std::string y1 = b.one("Reshape", {x, b.one("Concat", {n, b.ints({-1})}, attrs({{"axis", int64_t{0}}}))});
  std::string y2 = b.one("Reshape", {x, b.ints({-1, 512})});
  std::string y3 = b.one("Reshape", {x, b.ints({0, 0, -1})});
  std::string y4 = b.one("Reshape", {x, b.ints({2, -1})});  // cannot say: N*512/2
  ir::infer_shapes(b.g);
  EXPECT_EQ(dims(b.type(y1)), "Nx512");
  EXPECT_EQ(dims(b.type(y2)), "Nx512");
  EXPECT_EQ(dims(b.type(y3)), "Nx512x1");
  EXPECT_EQ(dims(b.type(y4)), "2x?");
}

TEST(ShapeOps, ReshapeWithIncompatibleCountNamesTheNode) {
  Builder b;
  std::string x = b.input("x", DType::kFloat32, {2, 3, 4});
  b.one("Reshape", {x, b.ints({5, -1})});
  try {
    ir::infer_shapes(b.g);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.node_name(), "Reshape_0");
    EXPECT_EQ(e.op_type(), "Reshape");
    EXPECT_NE(e.message().find("cannot reshape"), std::string::npos) << e.what();
  }
  Builder c;
  c.one("Reshape", {c.input("x", DType::kFloat32, {2, 3}), c.ints({4, 2})});
  EXPECT_THROW(ir::infer_shapes(c.g), Error);
  Builder d;
  d.one("Reshape", {d.input("x", DType::kFloat32, {2, 3}), d.ints({-1, -1})});
  EXPECT_THROW(ir::infer_shapes(d.g), Error);
}

TEST(ShapeOps, SymbolicValuesFlowThroughSliceSqueezeExpandRangeTile) {
  Builder b;
  std::string x = b.input("x", DType::kFloat32, {Dim::named("N"), Dim::named("S"), 16});
  std::string shape = b.one("Shape", {x});
  std::string first2 = b.one("Slice", {shape, b.ints({0}), b.ints({2})});
  std::string last = b.one("Slice", {shape, b.ints({-1}), b.ints({INT64_MAX})});
  std::string s = b.one("Squeeze", {b.one("Gather", {shape, b.ints({1})}), b.ints({0})});
  std::string r = b.one("Range", {b.constant(Tensor::scalar<int64_t>(0)), s, b.constant(Tensor::scalar<int64_t>(1))});
  std::string e = b.one("Expand", {b.input("w", DType::kFloat32, {1, 1, 16}), b.one("Concat", {first2, b.ints({1})}, attrs({{"axis", int64_t{0}}}))});
  std::string t = b.one("Tile", {x, b.ints({1, 2, 1})});
  std::string c = b.one("ConstantOfShape", {first2});
  std::string sh = b.node("Shape", {x}, attrs({{"start", int64_t{1}}}))[0];
  ir::infer_shapes(b.g);
  EXPECT_EQ(ir::dims_to_string(*b.g.value(first2).symbolic_value), "NxS");
  EXPECT_EQ(ir::dims_to_string(*b.g.value(last).symbolic_value), "16");
  EXPECT_EQ(ir::dims_to_string(*b.g.value(s).symbolic_value), "S");
  EXPECT_EQ(dims(b.type(s)), "scalar");
  EXPECT_EQ(dims(b.type(r)), "S");
  EXPECT_EQ(dims(b.type(e)), "NxSx16");
  EXPECT_EQ(dims(b.type(t)), "Nx?x16");
  EXPECT_EQ(dims(b.type(c)), "NxS");
  EXPECT_EQ(ir::dims_to_string(*b.g.value(sh).symbolic_value), "Sx16");
}

TEST(ShapeOps, ShapeSizeAndConstantOfShapeRun) {
  Tensor x = iota_float({2, 3, 4});
  EXPECT_EQ(values<int64_t>(run_one("Shape", x)), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(values<int64_t>(run_one("Shape", x, {}, attrs({{"start", int64_t{-2}}, {"end", int64_t{10}}}))),
            (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(values<int64_t>(run_one("Size", x)), (std::vector<int64_t>{24}));
  Tensor shape = Tensor::from_vector<int64_t>({2}, {2, 3});
  Tensor c = run_one("ConstantOfShape", shape, {}, attrs({{"value", Tensor::from_vector<int32_t>({1}, {7})}}));
  EXPECT_EQ(c.dtype(), DType::kInt32);
  EXPECT_EQ(values<int32_t>(c), std::vector<int32_t>(6, 7));
}

// Naive transpose for the check.
template <class T>
std::vector<T> naive_transpose(const std::vector<T>& x, const std::vector<int64_t>& shape, const std::vector<int64_t>& perm) {
  size_t r = shape.size();
  std::vector<int64_t> out_shape(r), in_strides(r, 1);
  for (size_t i = r - 1; i > 0; --i) in_strides[i - 1] = in_strides[i] * shape[i];
  for (size_t i = 0; i < r; ++i) out_shape[i] = shape[static_cast<size_t>(perm[i])];
  std::vector<T> y(x.size());
  std::vector<int64_t> c(r, 0);
  for (size_t k = 0; k < y.size(); ++k) {
    int64_t off = 0;
    for (size_t i = 0; i < r; ++i) off += c[i] * in_strides[static_cast<size_t>(perm[i])];
    y[k] = x[static_cast<size_t>(off)];
    for (size_t i = r; i-- > 0;) {
      if (++c[i] < out_shape[i]) break;
      c[i] = 0;
    }
  }
  return y;
}

template <class T>
void check_transpose(std::vector<int64_t> shape, std::vector<int64_t> perm, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor x(dtype_of<T>(), shape);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<T>()[i] = static_cast<T>(rng() % 100);
  Tensor y = run_one("Transpose", x, {}, attrs({{"perm", perm}}));
  EXPECT_EQ(values<T>(y), naive_transpose(values<T>(x), shape, perm)) << shape_to_string(shape);
}

TEST(ShapeOps, TransposeMatchesNaiveForCommonPermutations) {
  // BERT/ViT head split, shufflenet channel shuffle, NCHW<->NHWC, full reversal, 2-D.
  check_transpose<float>({2, 7, 4, 8}, {0, 2, 1, 3}, 1);
  check_transpose<float>({2, 3, 5, 4, 4}, {0, 2, 1, 3, 4}, 2);
  check_transpose<float>({2, 3, 37, 41}, {0, 2, 3, 1}, 3);
  check_transpose<float>({2, 37, 41, 3}, {0, 3, 1, 2}, 4);
  check_transpose<uint8_t>({3, 5, 7, 2}, {3, 2, 1, 0}, 5);
  check_transpose<int64_t>({67, 45}, {1, 0}, 6);
  check_transpose<int8_t>({1, 64, 1, 33}, {3, 1, 2, 0}, 7);
  check_transpose<uint16_t>({4, 5, 6}, {2, 0, 1}, 8);  // e.g. float16 bits
  check_transpose<double>({4, 5, 6}, {1, 2, 0}, 9);
  // Large enough for the threaded, tiled path.
  check_transpose<float>({4, 96, 96, 8}, {0, 3, 1, 2}, 10);
  check_transpose<uint16_t>({2, 8, 197, 64}, {0, 2, 1, 3}, 11);
}

TEST(ShapeOps, SliceHandlesNegativeStepsAndClamping) {
  Tensor x = iota_float({3, 5});
  // Rows 2..0 backwards, columns from -2 to the end.
  Tensor y = run_one("Slice", x, {Tensor::from_vector<int64_t>({2}, {-1, -2}), Tensor::from_vector<int64_t>({2}, {INT64_MIN, 100}),
                                  Tensor::from_vector<int64_t>({2}, {0, 1}), Tensor::from_vector<int64_t>({2}, {-1, 1})});
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{13, 14, 8, 9, 3, 4}));
  // Step 2 on the last axis only, through axes = [-1].
  Tensor z = run_one("Slice", x, {Tensor::from_vector<int64_t>({1}, {0}), Tensor::from_vector<int64_t>({1}, {5}),
                                  Tensor::from_vector<int64_t>({1}, {-1}), Tensor::from_vector<int64_t>({1}, {2})});
  EXPECT_EQ(z.shape(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(values<float>(z), (std::vector<float>{0, 2, 4, 5, 7, 9, 10, 12, 14}));
  // Empty result when start is past end.
  Tensor e = run_one("Slice", x, {Tensor::from_vector<int64_t>({1}, {4}), Tensor::from_vector<int64_t>({1}, {1}),
                                  Tensor::from_vector<int64_t>({1}, {1})});
  EXPECT_EQ(e.shape(), (std::vector<int64_t>{3, 0}));
}

// Shape arithmetic on an empty integer value broadcast against one element: an empty result,
// with no symbolic value (fuzz_onnx_import read element 0 of the empty one).
TEST(ShapeOps, SymbolicArithmeticOfAnEmptyValueIsEmpty) {
  Builder b;
  std::string empty = b.constant(Tensor::from_vector<int64_t>({0}, {}));
  std::string sum = b.one("Add", {empty, b.ints({3})});
  std::map<std::string, Tensor> out = run(std::move(b.g), {sum}, {});
  EXPECT_EQ(out.at(sum).shape(), (std::vector<int64_t>{0}));
}

// The GPU builder makes a Slice that reads its input's first elements a view (no copy); the CPU
// kernel is the oracle: on an iota input such a slice returns 0, 1, 2, ...
TEST(ShapeOps, SliceReadsLeadingElementsExactlyWhenTheCpuKernelReturnsAPrefix) {
  const std::vector<std::vector<int64_t>> shapes = {{1, 6}, {2, 3}, {3, 4}, {1, 4, 1}, {2, 1, 3}, {1, 1, 5}, {1, 3, 2, 2}, {2, 0, 3}};
  std::mt19937 rng(5);
  int views = 0, copies = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const std::vector<int64_t>& shape = shapes[static_cast<size_t>(trial) % shapes.size()];
    const int64_t rank = static_cast<int64_t>(shape.size());
    std::vector<int64_t> starts, ends, axes, steps;
    for (int64_t a = 0; a < rank; ++a) {
      if (rng() % 2) continue;  // this axis not sliced
      const int64_t dim = shape[static_cast<size_t>(a)];
      axes.push_back(a);
      starts.push_back(rng() % 3 ? 0 : static_cast<int64_t>(rng() % static_cast<unsigned>(dim + 1)));
      ends.push_back(rng() % 3 ? static_cast<int64_t>(rng() % static_cast<unsigned>(dim + 2)) : INT64_MAX);
      steps.push_back(rng() % 4 ? 1 : 2);
    }
    if (axes.empty()) continue;
    const int64_t n = static_cast<int64_t>(axes.size());
    Tensor y = run_one("Slice", iota_float(shape),
                       {Tensor::from_vector<int64_t>({n}, starts), Tensor::from_vector<int64_t>({n}, ends),
                        Tensor::from_vector<int64_t>({n}, axes), Tensor::from_vector<int64_t>({n}, steps)});
    bool prefix = y.numel() > 0;
    for (int64_t i = 0; i < y.numel(); ++i) prefix = prefix && y.data<float>()[i] == static_cast<float>(i);
    ir::Node node;
    node.name = "slice";
    const bool leading = ir::slice_reads_leading_elements(
        shape, ir::slice_params(node, ir::dims_of(shape), starts, ends, axes, steps));
    auto list = [](const std::vector<int64_t>& v) {
      std::string out;
      for (int64_t x : v) out += std::to_string(x) + " ";
      return out;
    };
    EXPECT_EQ(leading, prefix) << "shape " << list(shape) << "starts " << list(starts) << "ends " << list(ends) << "axes "
                               << list(axes) << "steps " << list(steps);
    (leading ? views : copies)++;
  }
  EXPECT_GT(views, 50);  // both answers well represented
  EXPECT_GT(copies, 50);
}

TEST(ShapeOps, GatherTakesNegativeIndicesAndRefusesOutOfRange) {
  Tensor x = iota_float({3, 4});
  Tensor y = run_one("Gather", x, {Tensor::from_vector<int64_t>({2}, {-1, 1})}, attrs({{"axis", int64_t{1}}}));
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{3, 1, 7, 5, 11, 9}));
  Tensor r = run_one("Gather", x, {Tensor::from_vector<int32_t>({1, 1}, {2})});
  EXPECT_EQ(r.shape(), (std::vector<int64_t>{1, 1, 4}));
  EXPECT_EQ(values<float>(r), (std::vector<float>{8, 9, 10, 11}));
  // A constant index out of range is caught at build time, with the node named.
  try {
    run_one("Gather", x, {Tensor::from_vector<int64_t>({1}, {3})});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.op_type(), "Gather");
  }
  // A runtime index out of range is the caller's error, not a crash.
  Builder b;
  std::string out = b.one("Gather", {b.constant(x), b.input("i", DType::kInt64, {1})});
  EXPECT_THROW(run(b.g, {out}, {{"i", Tensor::from_vector<int64_t>({1}, {-4})}}), Error);
}

TEST(ShapeOps, ConcatSplitRoundTripOnBytes) {
  std::mt19937 rng(3);
  Tensor a(DType::kInt64, {2, 3, 5}), c(DType::kInt64, {2, 4, 5});
  for (int64_t i = 0; i < a.numel(); ++i) a.data<int64_t>()[i] = rng();
  for (int64_t i = 0; i < c.numel(); ++i) c.data<int64_t>()[i] = rng();
  Builder b;
  std::string cat = b.one("Concat", {b.input("a", DType::kInt64, {2, 3, 5}), b.input("c", DType::kInt64, {2, 4, 5})},
                          attrs({{"axis", int64_t{-2}}}));
  std::vector<std::string> parts = b.node("Split", {cat, b.ints({3, 4})}, attrs({{"axis", int64_t{1}}}), 2);
  auto out = run(b.g, {cat, parts[0], parts[1]}, {{"a", a}, {"c", c}});
  EXPECT_EQ(out[cat].shape(), (std::vector<int64_t>{2, 7, 5}));
  EXPECT_EQ(out[cat].data<int64_t>()[15], c.data<int64_t>()[0]);  // row 3 of batch 0 is c's first row
  EXPECT_EQ(values<int64_t>(out[parts[0]]), values<int64_t>(a));
  EXPECT_EQ(values<int64_t>(out[parts[1]]), values<int64_t>(c));
  // Split into uneven parts by num_outputs (opset 18): 5 -> 2, 2, 1.
  Tensor y = iota_float({5});
  Builder s;
  std::vector<std::string> u = s.node("Split", {s.input("x", DType::kFloat32, {5})}, attrs({{"num_outputs", int64_t{3}}}), 3);
  auto r = run(s.g, u, {{"x", y}});
  EXPECT_EQ(values<float>(r[u[2]]), (std::vector<float>{4}));
  // Uneven without num_outputs is an error.
  Builder bad;
  bad.node("Split", {bad.input("x", DType::kFloat32, {5})}, {}, 2);
  EXPECT_THROW(ir::infer_shapes(bad.g), Error);
}

TEST(ShapeOps, SqueezeUnsqueezeAndTheirErrors) {
  Tensor x = iota_float({1, 3, 1});
  EXPECT_EQ(run_one("Squeeze", x).shape(), (std::vector<int64_t>{3}));
  EXPECT_EQ(run_one("Squeeze", x, {Tensor::from_vector<int64_t>({1}, {-1})}).shape(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(run_one("Unsqueeze", x, {Tensor::from_vector<int64_t>({2}, {0, -1})}).shape(),
            (std::vector<int64_t>{1, 1, 3, 1, 1}));
  EXPECT_THROW(run_one("Squeeze", x, {Tensor::from_vector<int64_t>({1}, {1})}), Error);  // size 3
  EXPECT_THROW(run_one("Unsqueeze", x, {Tensor::from_vector<int64_t>({2}, {0, 0})}), Error);
}

TEST(ShapeOps, ExpandTileAndRange) {
  Tensor x = Tensor::from_vector<float>({3, 1}, {1, 2, 3});
  Tensor e = run_one("Expand", x, {Tensor::from_vector<int64_t>({3}, {2, 1, 2})});
  EXPECT_EQ(e.shape(), (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(values<float>(e), (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  EXPECT_THROW(run_one("Expand", x, {Tensor::from_vector<int64_t>({2}, {2, 2})}), Error);  // 3 vs 2
  Tensor t = run_one("Tile", Tensor::from_vector<uint8_t>({2, 2}, {1, 2, 3, 4}), {Tensor::from_vector<int64_t>({2}, {2, 2})});
  EXPECT_EQ(values<uint8_t>(t), (std::vector<uint8_t>{1, 2, 1, 2, 3, 4, 3, 4, 1, 2, 1, 2, 3, 4, 3, 4}));
  Tensor r = run_one("Range", Tensor::scalar<float>(1.f), {Tensor::scalar<float>(2.f), Tensor::scalar<float>(0.25f)});
  EXPECT_EQ(values<float>(r), (std::vector<float>{1, 1.25f, 1.5f, 1.75f}));
  Tensor rn = run_one("Range", Tensor::scalar<int32_t>(10), {Tensor::scalar<int32_t>(4), Tensor::scalar<int32_t>(-3)});
  EXPECT_EQ(values<int32_t>(rn), (std::vector<int32_t>{10, 7}));
}

TEST(ShapeOps, PadModes) {
  Tensor x = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor pads = Tensor::from_vector<int64_t>({4}, {0, 2, 1, 1});
  Tensor c = run_one("Pad", x, {pads, Tensor::scalar<float>(9.f)});
  EXPECT_EQ(c.shape(), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(values<float>(c), (std::vector<float>{9, 9, 1, 2, 3, 9, 9, 9, 4, 5, 6, 9, 9, 9, 9, 9, 9, 9}));
  Tensor r = run_one("Pad", x, {pads}, attrs({{"mode", std::string("reflect")}}));
  EXPECT_EQ(values<float>(r), (std::vector<float>{3, 2, 1, 2, 3, 2, 6, 5, 4, 5, 6, 5, 3, 2, 1, 2, 3, 2}));
  Tensor e = run_one("Pad", x, {pads}, attrs({{"mode", std::string("edge")}}));
  EXPECT_EQ(values<float>(e), (std::vector<float>{1, 1, 1, 2, 3, 3, 4, 4, 4, 5, 6, 6, 4, 4, 4, 5, 6, 6}));
  // Negative pads crop.
  Tensor n = run_one("Pad", x, {Tensor::from_vector<int64_t>({4}, {0, -1, 0, 0})});
  EXPECT_EQ(values<float>(n), (std::vector<float>{2, 3, 5, 6}));
  EXPECT_THROW(run_one("Pad", x, {Tensor::from_vector<int64_t>({4}, {0, 3, 0, 0})}, attrs({{"mode", std::string("reflect")}})),
               Error);
}

TEST(ShapeOps, ResizeNearestAndLinear) {
  Tensor x = Tensor::from_vector<float>({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor scales = Tensor::from_vector<float>({4}, {1, 1, 2, 2});
  Tensor n = run_one("Resize", x, {Tensor(), scales}, attrs({{"mode", std::string("nearest")}}));
  EXPECT_EQ(n.shape(), (std::vector<int64_t>{1, 1, 4, 4}));
  EXPECT_EQ(values<float>(n), (std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  // half_pixel linear: out 0 -> in -0.25 (clamped to 0), out 1 -> 0.25, out 2 -> 0.75, out 3 -> 1.25 (clamped to 1).
  Tensor l = run_one("Resize", x, {Tensor(), scales}, attrs({{"mode", std::string("linear")}}));
  std::vector<float> row0 = {1, 1.25f, 1.75f, 2};
  for (int j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(l.data<float>()[j], row0[static_cast<size_t>(j)]);
  EXPECT_FLOAT_EQ(l.data<float>()[5], 1.25f + 0.25f * 2.f);  // (0.25, 0.25): 1 + 0.25 + 0.5
  // align_corners with sizes: the corners are kept exactly.
  Tensor a = run_one("Resize", x, {Tensor(), Tensor(), Tensor::from_vector<int64_t>({4}, {1, 1, 3, 3})},
                     attrs({{"mode", std::string("linear")}, {"coordinate_transformation_mode", std::string("align_corners")}}));
  EXPECT_EQ(values<float>(a), (std::vector<float>{1, 1.5f, 2, 2, 2.5f, 3, 3, 3.5f, 4}));
  // Nearest works on any dtype (bytes).
  Tensor u = run_one("Resize", Tensor::from_vector<uint8_t>({1, 2}, {7, 9}), {Tensor(), Tensor::from_vector<float>({2}, {1, 2})},
                     attrs({{"coordinate_transformation_mode", std::string("asymmetric")}, {"nearest_mode", std::string("floor")}}));
  EXPECT_EQ(values<uint8_t>(u), (std::vector<uint8_t>{7, 7, 9, 9}));
}

TEST(ShapeOps, ResizeKeepsSymbolicBatch) {
  Builder b;
  std::string x = b.input("x", DType::kFloat32, {Dim::named("N"), 3, 8, 8});
  std::string y = b.one("Resize", {x, "", b.constant(Tensor::from_vector<float>({4}, {1, 1, 2, 0.5f}))});
  ir::infer_shapes(b.g);
  EXPECT_EQ(dims(b.type(y)), "Nx3x16x4");
}

TEST(ShapeOps, DepthToSpaceAndBack) {
  Tensor x = iota_float({1, 8, 2, 3});
  Tensor d = run_one("DepthToSpace", x, {}, attrs({{"blocksize", int64_t{2}}, {"mode", std::string("CRD")}}));
  EXPECT_EQ(d.shape(), (std::vector<int64_t>{1, 2, 4, 6}));
  // CRD: out[0, c, h*2+i, w*2+j] = in[0, c*4 + i*2 + j, h, w]; check (c=1, h=1, i=1, w=2, j=0).
  EXPECT_EQ(d.data<float>()[(1 * 4 + 3) * 6 + 4], x.data<float>()[((1 * 4 + 2) * 2 + 1) * 3 + 2]);
  Tensor dcr = run_one("DepthToSpace", x, {}, attrs({{"blocksize", int64_t{2}}}));
  Tensor back = run_one("SpaceToDepth", dcr, {}, attrs({{"blocksize", int64_t{2}}}));
  EXPECT_EQ(values<float>(back), values<float>(x));
}

TEST(ShapeOps, GatherElementsAndScatterElements) {
  Tensor x = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
  Tensor g = run_one("GatherElements", x, {Tensor::from_vector<int64_t>({2, 2}, {0, 0, 1, 0})}, attrs({{"axis", int64_t{1}}}));
  EXPECT_EQ(values<float>(g), (std::vector<float>{1, 1, 4, 3}));
  Tensor s = run_one("ScatterElements", x, {Tensor::from_vector<int64_t>({1, 2}, {1, -1}), Tensor::from_vector<float>({1, 2}, {10, 20})},
                     attrs({{"axis", int64_t{0}}, {"reduction", std::string("add")}}));
  EXPECT_EQ(values<float>(s), (std::vector<float>{1, 2, 13, 24}));
}

// The kernels walk indices a row at a time; ONNX's definition walks every coordinate. Random
// shapes with indices smaller than the data off the axis, every axis, negative indices, int32 and
// int64 indices, and scatter's reductions in index order (repeated targets included).
TEST(ShapeOps, GatherElementsAndScatterElementsMatchTheirDefinitionOnRandomShapes) {
  std::mt19937 rng(11);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int trial = 0; trial < 60; ++trial) {
    const size_t rank = static_cast<size_t>(pick(1, 4));
    std::vector<int64_t> data_shape(rank), idx_shape(rank);
    for (size_t d = 0; d < rank; ++d) data_shape[d] = pick(1, 5);
    const size_t axis = static_cast<size_t>(pick(0, static_cast<int64_t>(rank) - 1));
    for (size_t d = 0; d < rank; ++d) idx_shape[d] = d == axis ? pick(1, 6) : pick(1, data_shape[d]);
    const DType index_type = trial % 2 ? DType::kInt32 : DType::kInt64;
    Tensor idx(index_type, idx_shape), upd(DType::kFloat32, idx_shape);
    std::vector<int64_t> chosen(static_cast<size_t>(idx.numel()));
    for (int64_t i = 0; i < idx.numel(); ++i) {
      const int64_t v = pick(-data_shape[axis], data_shape[axis] - 1);
      chosen[static_cast<size_t>(i)] = v < 0 ? v + data_shape[axis] : v;
      if (index_type == DType::kInt32) idx.data<int32_t>()[i] = static_cast<int32_t>(v);
      else idx.data<int64_t>()[i] = v;
      upd.data<float>()[i] = static_cast<float>(pick(-50, 50));
    }
    Tensor x = iota_float(data_shape);
    // Linear offset in data of idx element i: its coordinates, the axis' one replaced.
    auto offset = [&](int64_t i) {
      int64_t off = 0, stride = 1, rest = i;
      std::vector<int64_t> c(rank);
      for (size_t d = rank; d-- > 0;) {
        c[d] = rest % idx_shape[d];
        rest /= idx_shape[d];
      }
      for (size_t d = rank; d-- > 0;) {
        off += (d == axis ? chosen[static_cast<size_t>(i)] : c[d]) * stride;
        stride *= data_shape[d];
      }
      return off;
    };
    const ir::Attributes on_axis = attrs({{"axis", static_cast<int64_t>(axis)}});
    Tensor g = run_one("GatherElements", x, {idx}, on_axis);
    ASSERT_EQ(g.shape(), idx_shape);
    for (int64_t i = 0; i < idx.numel(); ++i) ASSERT_EQ(g.data<float>()[i], x.data<float>()[offset(i)]) << "trial " << trial;
    for (const char* reduction : {"none", "add", "max"}) {
      std::vector<float> want = values<float>(x);
      for (int64_t i = 0; i < idx.numel(); ++i) {
        float& y = want[static_cast<size_t>(offset(i))];
        const float u = upd.data<float>()[i];
        y = std::string(reduction) == "none" ? u : std::string(reduction) == "add" ? y + u : std::max(y, u);
      }
      Tensor s = run_one("ScatterElements", x, {idx, upd},
                         attrs({{"axis", static_cast<int64_t>(axis)}, {"reduction", std::string(reduction)}}));
      ASSERT_EQ(values<float>(s), want) << "trial " << trial << ", reduction " << reduction;
    }
  }
}

// Indices that hold one value per row along axis 0 (an index broadcast over whole rows by
// Expand, as torchvision's MultiScaleRoIAlign writes it) take the kernel's row-copy path; a row
// with one index off falls back to the element walk. Both against the definition, with repeated
// rows (the later update wins) and negative indices.
TEST(ShapeOps, ScatterElementsOfWholeRowsMatchesItsDefinition) {
  std::mt19937 rng(5);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int trial = 0; trial < 40; ++trial) {
    const size_t rank = static_cast<size_t>(pick(2, 4));
    std::vector<int64_t> data_shape(rank);
    for (size_t d = 0; d < rank; ++d) data_shape[d] = pick(1, 5);
    std::vector<int64_t> idx_shape = data_shape;
    idx_shape[0] = pick(1, 7);
    Tensor idx(DType::kInt64, idx_shape), upd(DType::kFloat32, idx_shape);
    const int64_t rows = idx_shape[0], width = idx.numel() / rows;
    const bool one_off = trial % 4 == 3 && width > 1;
    std::vector<float> want = values<float>(iota_float(data_shape));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t v = pick(-data_shape[0], data_shape[0] - 1);
      for (int64_t j = 0; j < width; ++j) {
        int64_t at = v;
        if (one_off && r == rows - 1 && j == width - 1) at = (v + data_shape[0] + 1) % data_shape[0];
        idx.data<int64_t>()[r * width + j] = at;
        const float u = static_cast<float>(pick(-50, 50));
        upd.data<float>()[r * width + j] = u;
        want[static_cast<size_t>(((at % data_shape[0] + data_shape[0]) % data_shape[0]) * width + j)] = u;
      }
    }
    Tensor s = run_one("ScatterElements", iota_float(data_shape), {idx, upd}, attrs({{"axis", int64_t{0}}}));
    ASSERT_EQ(values<float>(s), want) << "trial " << trial << (one_off ? " (one index off its row)" : "");
  }
  // An index out of range is the error, with nothing written first.
  Tensor idx = Tensor::from_vector<int64_t>({2, 2}, {0, 0, 5, 5});
  EXPECT_THROW(run_one("ScatterElements", iota_float({2, 2}), {idx, iota_float({2, 2})}, attrs({{"axis", int64_t{0}}})), Error);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(ShapeOps, ScalarInputsHaveNoAxisToSplitConcatOrSqueeze) {
  Tensor s = Tensor::scalar<float>(1.f);
  EXPECT_THROW(run_one("Split", s), Error);
  EXPECT_THROW(run_one("Concat", s, {}, attrs({{"axis", int64_t{0}}})), Error);
  EXPECT_THROW(run_one("Squeeze", s, {Tensor::from_vector<int64_t>({1}, {0})}), Error);
  EXPECT_THROW(run_one("TopK", s, {Tensor::from_vector<int64_t>({1}, {1})}), Error);
}

TEST(ShapeOps, TopKNonZeroCumSumTrilu) {
  Builder b;
  std::string x = b.input("x", DType::kFloat32, {2, 4});
  std::vector<std::string> tk = b.node("TopK", {x, b.ints({2})}, attrs({{"axis", int64_t{1}}}), 2);
  std::string nz = b.one("NonZero", {x});
  ir::infer_shapes(b.g);
  EXPECT_EQ(dims(b.type(nz)), "2x?");  // data-dependent length
  Tensor in = Tensor::from_vector<float>({2, 4}, {3, 1, 3, 2, 0, -1, 0, 5});
  auto out = run(b.g, {tk[0], tk[1], nz}, {{"x", in}});
  EXPECT_EQ(values<float>(out[tk[0]]), (std::vector<float>{3, 3, 5, 0}));
  EXPECT_EQ(values<int64_t>(out[tk[1]]), (std::vector<int64_t>{0, 2, 3, 0}));  // ties: lower index first
  EXPECT_EQ(values<int64_t>(out[nz]), (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 0, 1, 2, 3, 1, 3}));
  Tensor c = run_one("CumSum", Tensor::from_vector<int32_t>({4}, {1, 2, 3, 4}), {Tensor::scalar<int64_t>(0)},
                     attrs({{"exclusive", int64_t{1}}, {"reverse", int64_t{1}}}));
  EXPECT_EQ(values<int32_t>(c), (std::vector<int32_t>{9, 7, 4, 0}));
  Tensor t = run_one("Trilu", iota_float({2, 3}), {Tensor::scalar<int64_t>(1)}, attrs({{"upper", int64_t{0}}}));
  EXPECT_EQ(values<float>(t), (std::vector<float>{0, 1, 0, 3, 4, 5}));
}

// NonZero's test in each dtype's own type (ops/non_zero.h) against the value each element holds:
// random bytes, half the elements zero, -0.0 and NaN among the floats' (so zero is tested by value,
// not by bytes); then the op itself on a float32 tensor of three dimensions.
TEST(ShapeOps, NonZeroOfEveryDtypeFollowsTheValues) {
  std::mt19937 rng(7);
  for (DType dtype : {DType::kBool, DType::kUInt8, DType::kInt8, DType::kUInt16, DType::kInt16, DType::kUInt32,
                      DType::kInt32, DType::kUInt64, DType::kInt64, DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                      DType::kFloat64, DType::kFloat8E4M3FN, DType::kFloat8E4M3FNUZ, DType::kFloat8E5M2,
                      DType::kFloat8E5M2FNUZ, DType::kUInt4, DType::kInt4, DType::kFloat4E2M1}) {
    Tensor t(dtype, {301});
    const size_t es = element_size(dtype);
    auto* bytes = static_cast<unsigned char*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i) {
      unsigned char* e = bytes + static_cast<size_t>(i) * es;
      const unsigned kind = rng() % 4;
      for (size_t b = 0; b < es; ++b) e[b] = kind < 2 ? 0 : static_cast<unsigned char>(rng());
      if (kind == 1) e[es - 1] = 0x80;  // a float's -0.0 (the sign bit alone); other types' a nonzero
      if (dtype == DType::kBool || dtype == DType::kUInt4 || dtype == DType::kInt4 || dtype == DType::kFloat4E2M1)
        e[0] &= dtype == DType::kBool ? 1 : 0x0f;
    }
    std::vector<int64_t> want;
    for (int64_t i = 0; i < t.numel(); ++i)
      if (t.value_as_double(i) != 0.0) want.push_back(i);  // (NaN != 0.0: nonzero)
    std::vector<int64_t> got(want.size() + 1, -1);  // one more than it should write
    EXPECT_EQ(ir::nonzero_flat_indices(t, got.data(), static_cast<int64_t>(got.size())),
              static_cast<int64_t>(want.size())) << to_string(dtype);
    got.pop_back();
    EXPECT_EQ(got, want) << to_string(dtype);
    std::vector<int64_t> first(5, -1);  // room for five: the first five, and no more
    EXPECT_EQ(ir::nonzero_flat_indices(t, first.data(), 5), 5) << to_string(dtype);
    EXPECT_EQ(first, std::vector<int64_t>(want.begin(), want.begin() + 5)) << to_string(dtype);
    EXPECT_EQ(ir::count_nonzero(t), static_cast<int64_t>(want.size())) << to_string(dtype);
    EXPECT_GT(want.size(), 0u) << to_string(dtype);
    EXPECT_LT(want.size(), 301u) << to_string(dtype);
  }

  Builder b;
  std::string x = b.input("x", DType::kFloat32, {3, 5, 7});
  std::string nz = b.one("NonZero", {x});
  ir::infer_shapes(b.g);
  Tensor in(DType::kFloat32, {3, 5, 7});
  std::vector<int64_t> want[3];
  const float choices[] = {0.0f, -0.0f, std::nanf(""), 1.5f, -2.0f};
  for (int64_t i = 0; i < in.numel(); ++i) {
    in.data<float>()[i] = choices[rng() % 5];
    if (in.data<float>()[i] != 0.0f) {
      want[0].push_back(i / 35);
      want[1].push_back(i / 7 % 5);
      want[2].push_back(i % 7);
    }
  }
  const Tensor y = run(b.g, {nz}, {{"x", in}})[nz];
  std::vector<int64_t> flat = want[0];
  flat.insert(flat.end(), want[1].begin(), want[1].end());
  flat.insert(flat.end(), want[2].begin(), want[2].end());
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{3, static_cast<int64_t>(want[0].size())}));
  EXPECT_EQ(values<int64_t>(y), flat);

  // One dimension (a detection model's score test): the coordinates are the flat indices.
  Builder b1;
  std::string mask = b1.input("mask", DType::kBool, {1000});
  std::string nz1 = b1.one("NonZero", {mask});
  ir::infer_shapes(b1.g);
  Tensor m(DType::kBool, {1000});
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < m.numel(); ++i) {
    m.data<bool>()[i] = rng() % 7 == 0;
    if (m.data<bool>()[i]) kept.push_back(i);
  }
  const Tensor y1 = run(b1.g, {nz1}, {{"mask", m}})[nz1];
  ASSERT_EQ(y1.shape(), (std::vector<int64_t>{1, static_cast<int64_t>(kept.size())}));
  EXPECT_EQ(values<int64_t>(y1), kept);
}

}  // namespace
}  // namespace kiln
