// Packed weights (cpu/packed_weights.h): every layout unpacks to its constant (float32 exactly,
// bfloat16 as the rounded values) and refuses sizes, names and shapes that do not fit; a CPU
// engine keeps a constant only as its kernel's pack where that kernel is its one reader and never
// reads it at run (MatMul, Gemm, channels-last and channels-first convolutions, Winograd's
// included, in float32 and bfloat16), and keeps the values elsewhere (shared weights, a Gemm whose C varies by row); an
// engine graph written and read back hands the packs to the kernels as they are (the kernel holds
// the very bytes the graph does) and computes bit for bit what the first engine did; a forged
// graph's packs become values again where no packing kernel reads them, and are refused where
// they do not fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compute_test_util.h"
#include "cpu/packed_weights.h"
#include "ir/op_schema.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace kiln {
namespace {

using testing::bf16_value;
using testing::NodeInput;
using testing::random_tensor;
using testing::single_node_graph;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::map<std::string, Tensor> feed_of(const std::vector<NodeInput>& inputs) {
  std::map<std::string, Tensor> feed;
  for (const NodeInput& in : inputs)
    if (!in.constant) feed[in.name] = in.data;
  return feed;
}

const bool kHasBf16 = cpu::bf16_gemm_best_isa() != cpu::Bf16GemmIsa::kNone;

TEST(PackedWeights, EveryLayoutUnpacksToItsConstant) {
  struct Case {
    cpu::PackView view;
    std::vector<int64_t> shape;
  };
  // Columns off the 32-column panels, K off bfloat16's 32 steps and odd (pairs of K).
  const std::vector<Case> cases = {{cpu::PackView::kRows, {37, 45}},
                                   {cpu::PackView::kRows, {1, 1}},
                                   {cpu::PackView::kTransposed, {45, 3, 2, 5}},
                                   {cpu::PackView::kTransposed, {64, 33}},
                                   {cpu::PackView::kConvTaps, {40, 3, 3, 3}},
                                   {cpu::PackView::kConvTaps, {7, 65, 1, 1}}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_to_string(c.shape));
    const Tensor w = random_tensor(c.shape, seed++);
    int64_t k = 0, n = 0;
    ASSERT_TRUE(cpu::pack_matrix_dims(c.view, c.shape, k, n));
    const std::vector<float> matrix = cpu::pack_matrix(c.view, w.data<float>(), c.shape);
    cpu::PackedColumns columns;
    columns.pack(matrix.data(), k, n, n);
    const ir::PackedConstant pack = cpu::packed_constant(columns, c.view);
    EXPECT_NO_THROW(cpu::check_packed_constant("W", pack, DType::kFloat32, c.shape));
    EXPECT_TRUE(bitwise_equal(cpu::unpack_constant(pack, c.shape), w)) << pack.layout;
    if (!kHasBf16) continue;
    cpu::Bf16PackedColumns rounded;
    rounded.pack(cpu::bf16_gemm_best_isa(), matrix.data(), k, n, n);
    const ir::PackedConstant bf16_pack = cpu::packed_constant(rounded, c.view);
    EXPECT_NO_THROW(cpu::check_packed_constant("W", bf16_pack, DType::kFloat32, c.shape));
    const Tensor back = cpu::unpack_constant(bf16_pack, c.shape);
    for (int64_t i = 0; i < w.numel(); ++i)
      ASSERT_EQ(back.data<float>()[i], bf16_value(w.data<float>()[i])) << bf16_pack.layout << " element " << i;
  }
}

// The channels-first convolution's rows: each group's rows in the micro-kernel's panels, the
// groups one after another.
TEST(PackedWeights, RowPanelsOfEveryGroupUnpackToTheirConstant) {
  uint32_t seed = 50;
  for (int64_t groups : {1, 3})
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{24, 5, 3, 3}, std::vector<int64_t>{9, 4, 2, 2}}) {
      SCOPED_TRACE(shape_to_string(shape) + " in " + std::to_string(groups) + " groups");
      const Tensor w = random_tensor(shape, seed++);
      const int64_t mg = shape[0] / groups, k = w.numel() / shape[0];
      std::vector<cpu::PackedA> panels(static_cast<size_t>(groups));
      for (int64_t g = 0; g < groups; ++g) panels[static_cast<size_t>(g)].pack(w.data<float>() + g * mg * k, mg, k, k);
      cpu::share_one_buffer(panels);
      const ir::PackedConstant pack = cpu::packed_constant(panels);
      EXPECT_EQ(pack.layout, "f32.rows" + std::to_string(panels[0].mr()) + ".g" + std::to_string(groups));
      EXPECT_NO_THROW(cpu::check_packed_constant("W", pack, DType::kFloat32, shape));
      EXPECT_TRUE(bitwise_equal(cpu::unpack_constant(pack, shape), w));
      std::vector<cpu::PackedA> taken;
      ASSERT_TRUE(cpu::adopt_packed(pack, shape, groups, taken));
      for (int64_t g = 0; g < groups; ++g)
        EXPECT_EQ(std::memcmp(taken[static_cast<size_t>(g)].panel(0), panels[static_cast<size_t>(g)].panel(0),
                              static_cast<size_t>(cpu::PackedA::floats_for(mg, k, panels[0].mr())) * sizeof(float)),
                  0);
      EXPECT_FALSE(cpu::adopt_packed(pack, shape, groups == 1 ? 3 : 1, taken)) << "taken for another group count";
    }
}

// INT8 filters in the int8 GEMM's panels (AVX2's, AVX-VNNI's, VNNI's and AMX's, where the CPU
// has them): their values back, and the row sums the GEMM subtracts summed again from the
// panels. AVX2 and AVX-VNNI read VNNI's panels: a file packed for one is taken by the others,
// never by AMX.
TEST(PackedWeights, Int8PanelsUnpackToTheirConstant) {
  std::vector<cpu::Int8GemmIsa> isas;
  for (cpu::Int8GemmIsa isa : {cpu::Int8GemmIsa::kAvx2, cpu::Int8GemmIsa::kAvxVnni, cpu::Int8GemmIsa::kAvx512Vnni, cpu::Int8GemmIsa::kAmx})
    if (static_cast<int>(isa) <= static_cast<int>(cpu::int8_gemm_best_isa())) isas.push_back(isa);
  if (isas.empty()) GTEST_SKIP() << "no int8 GEMM on this CPU";
  std::mt19937 rng(60);
  std::uniform_int_distribution<int> value(-128, 127);
  for (cpu::Int8GemmIsa isa : isas)
    for (int64_t groups : {1, 2})
      for (const std::vector<int64_t>& shape : {std::vector<int64_t>{32, 8, 3, 3}, std::vector<int64_t>{18, 70, 1, 1}}) {
        SCOPED_TRACE(std::string(cpu::int8_gemm_isa_name(isa)) + " " + shape_to_string(shape) + " in " + std::to_string(groups));
        Tensor w(DType::kInt8, shape);
        for (int64_t i = 0; i < w.numel(); ++i) w.data<int8_t>()[i] = static_cast<int8_t>(value(rng));
        const int64_t mg = shape[0] / groups, k = w.numel() / shape[0];
        std::vector<cpu::Int8PackedA> panels;
        for (int64_t g = 0; g < groups; ++g) panels.push_back(cpu::int8_pack_a(isa, w.data<int8_t>() + g * mg * k, mg, k, k));
        cpu::share_one_buffer(panels);
        const ir::PackedConstant pack = cpu::packed_constant(panels);
        EXPECT_NO_THROW(cpu::check_packed_constant("W", pack, DType::kInt8, shape));
        EXPECT_THROW(cpu::check_packed_constant("W", pack, DType::kFloat32, shape), Error);
        EXPECT_TRUE(bitwise_equal(cpu::unpack_constant(pack, shape), w));
        std::vector<cpu::Int8PackedA> taken;
        for (cpu::Int8GemmIsa other : isas)
          EXPECT_EQ(cpu::adopt_packed(pack, shape, groups, other, taken), cpu::int8_panels_of(other) == cpu::int8_panels_of(isa))
              << "packed for " << cpu::int8_gemm_isa_name(isa) << ", taken by " << cpu::int8_gemm_isa_name(other);
        ASSERT_TRUE(cpu::adopt_packed(pack, shape, groups, isa, taken));
        for (int64_t g = 0; g < groups; ++g) {
          const cpu::Int8PackedA& a = panels[static_cast<size_t>(g)];
          const cpu::Int8PackedA& b = taken[static_cast<size_t>(g)];
          EXPECT_EQ(std::memcmp(a.panels, b.panels, static_cast<size_t>(cpu::Int8PackedA::bytes_for(isa, mg, k))), 0);
          EXPECT_EQ(std::vector<int32_t>(a.shift.begin(), a.shift.end()), std::vector<int32_t>(b.shift.begin(), b.shift.end()));
        }
      }
}

// A product's int8 or uint8 B [K, N] as the panels of its transpose (uint8 values less 128), and
// MatMulInteger's engine keeping only them, loaded back bit for bit.
TEST(PackedWeights, TransposedInt8WeightsOfIntegerProducts) {
  const cpu::Int8GemmIsa isa = cpu::int8_gemm_best_isa();
  if (isa == cpu::Int8GemmIsa::kNone) GTEST_SKIP() << "no int8 GEMM on this CPU";
  std::mt19937 rng(70);
  for (DType dtype : {DType::kInt8, DType::kUInt8}) {
    SCOPED_TRACE(to_string(dtype));
    const int64_t k = 70, n = 40;
    Tensor b(dtype, {k, n}), a(dtype, {5, k});
    for (Tensor* t : {&b, &a})
      for (int64_t i = 0; i < t->numel(); ++i) static_cast<uint8_t*>(t->raw())[i] = static_cast<uint8_t>(rng());
    std::vector<int8_t> transposed(static_cast<size_t>(n * k));
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t c = 0; c < n; ++c)
        transposed[static_cast<size_t>(c * k + kk)] = static_cast<int8_t>(b.value_as_int(kk * n + c) - (dtype == DType::kUInt8 ? 128 : 0));
    const cpu::Int8PackedA panels = cpu::int8_pack_a(isa, transposed.data(), n, k, k);
    const ir::PackedConstant pack = cpu::packed_constant_transposed(panels, dtype == DType::kUInt8);
    EXPECT_NO_THROW(cpu::check_packed_constant("B", pack, dtype, b.shape()));
    EXPECT_THROW(cpu::check_packed_constant("B", pack, dtype == DType::kInt8 ? DType::kUInt8 : DType::kInt8, b.shape()), Error);
    EXPECT_TRUE(bitwise_equal(cpu::unpack_constant(pack, b.shape()), b));

    ir::Node product;
    product.op = "MatMulInteger";
    const std::vector<NodeInput> inputs = {{"A", a}, {"W", b, true}};
    cpu::CpuEngine built(single_node_graph(product, inputs));
    ASSERT_TRUE(built.graph().value("W").packed);
    EXPECT_EQ(built.graph().value("W").packed->layout, pack.layout);
    const Tensor want = built.run(feed_of(inputs)).at("Y");
    std::string weights;
    const std::string bytes = onnx_export::export_engine_graph(built.graph(), weights);
    cpu::CpuEngine loaded(onnx_import::import_engine_graph(bytes, weights, "integer.engine"));
    EXPECT_GT(loaded.graph().value("W").packed->data.storage().use_count(), 1);
    EXPECT_TRUE(bitwise_equal(loaded.run(feed_of(inputs)).at("Y"), want));
    EXPECT_TRUE(bitwise_equal(want, testing::run_single_node(product, {{"A", a}, {"W", b}})));  // B as an input: the reference loops
  }
}

TEST(PackedWeights, RefusesPacksThatDoNotFitTheirConstant) {
  const std::vector<int64_t> shape = {33, 40};
  const Tensor w = random_tensor(shape, 7);
  cpu::PackedColumns columns;
  columns.pack(w.data<float>(), 33, 40, 40);
  const ir::PackedConstant good = cpu::packed_constant(columns, cpu::PackView::kRows);
  auto refused = [&](const ir::PackedConstant& pack, DType dtype, const std::vector<int64_t>& s, const char* why) {
    try {
      cpu::check_packed_constant("layer.weight", pack, dtype, s);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel) << why;
      EXPECT_NE(std::string(e.what()).find("layer.weight"), std::string::npos) << e.what();
    }
  };
  ir::PackedConstant unknown = good;
  unknown.layout = "f32.cols16.kn";
  refused(unknown, DType::kFloat32, shape, "an unknown layout");
  ir::PackedConstant short_pack = good;
  short_pack.data = Tensor(DType::kUInt8, {static_cast<int64_t>(good.data.nbytes()) - 4});
  refused(short_pack, DType::kFloat32, shape, "4 bytes short");
  refused(good, DType::kFloat32, {34, 40}, "another K");
  refused(good, DType::kInt64, shape, "an int64 constant");
  ir::PackedConstant taps = good;
  taps.layout = "f32.cols32.taps";
  refused(taps, DType::kFloat32, shape, "filters' view of a matrix");
  for (const char* name : {"f32.rows5.g1", "f32.rows8.g0", "f32.rows8.g07", "f32.rows8.g", "f32.rows8.g1x", "f32.rows88.g1"}) {
    ir::PackedConstant rows = good;
    rows.layout = name;
    refused(rows, DType::kFloat32, shape, name);
  }
  ir::PackedConstant groups = good;
  groups.layout = "f32.rows8.g2";
  refused(groups, DType::kFloat32, {33, 40}, "33 rows in 2 groups");
  groups.layout = "i8.amx.g999999999999";
  groups.data = Tensor(DType::kUInt8, {0});
  refused(groups, DType::kInt8, {0, 40}, "more groups than rows");
}

ir::Node channels_last_conv(const std::vector<int64_t>& strides, const std::vector<int64_t>& pads) {
  ir::Node conv;
  conv.op = "ChannelsLastConv";
  conv.domain = "kiln";
  conv.attrs.set("strides", strides);
  conv.attrs.set("pads", pads);
  conv.attrs.set("group", int64_t{1});
  return conv;
}

struct Layer {
  const char* name;
  ir::Node node;
  std::vector<NodeInput> inputs;
  std::vector<std::string> packed = {"W"};  // the constants its kernel holds packed
  bool bf16_form = true;                    // packed in bfloat16 in an engine of bfloat16 products
};

std::vector<Layer> packing_layers() {
  std::vector<Layer> layers;
  ir::Node matmul;
  matmul.op = "MatMul";
  layers.push_back({"MatMul", matmul, {{"X", random_tensor({3, 5, 70}, 11)}, {"W", random_tensor({70, 45}, 12), true}}});
  ir::Node gemm;
  gemm.op = "Gemm";
  gemm.attrs.set("transB", int64_t{1});
  layers.push_back({"Gemm transB, C per column",
                    gemm,
                    {{"X", random_tensor({4, 33}, 13)}, {"W", random_tensor({50, 33}, 14), true}, {"C", random_tensor({50}, 15), true}}});
  layers.push_back({"ChannelsLastConv 1x1",
                    channels_last_conv({1, 1}, {0, 0, 0, 0}),
                    {{"X", random_tensor({2, 6, 5, 40}, 16)}, {"W", random_tensor({70, 40, 1, 1}, 17), true}}});
  // Winograd's 3x3 of stride 1, its transformed filters made from the panels: at 16 x 16 (64
  // tiles) the run takes them, at 4 x 4 the direct product.
  layers.push_back({"ChannelsLastConv 3x3 stride 1, Winograd",
                    channels_last_conv({1, 1}, {1, 1, 1, 1}),
                    {{"X", random_tensor({1, 16, 16, 24}, 29)}, {"W", random_tensor({40, 24, 3, 3}, 30), true}}});
  layers.push_back({"ChannelsLastConv 3x3 stride 1, too few tiles for Winograd",
                    channels_last_conv({1, 1}, {1, 1, 1, 1}),
                    {{"X", random_tensor({1, 4, 4, 24}, 31)}, {"W", random_tensor({40, 24, 3, 3}, 32), true}}});
  layers.push_back({"ChannelsLastConv 3x3 stride 2",
                    channels_last_conv({2, 2}, {1, 1, 1, 1}),
                    {{"X", random_tensor({1, 9, 8, 24}, 18)}, {"W", random_tensor({20, 24, 3, 3}, 19), true}}});
  ir::Node first = channels_last_conv({2, 2}, {3, 3, 3, 3});
  first.attrs.set("input_channels_first", int64_t{1});
  // The channels-first convolution (ONNX's Conv): one group, three, and 3x3 of stride 1, whose
  // Winograd filters are made from the panels at 16 x 16 and not needed at 4 x 4. No bfloat16 form.
  ir::Node conv;
  conv.op = "Conv";
  conv.attrs.set("strides", std::vector<int64_t>{2, 2});
  conv.attrs.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  layers.push_back({"Conv 3x3 stride 2", conv,
                    {{"X", random_tensor({2, 12, 9, 8}, 33)}, {"W", random_tensor({20, 12, 3, 3}, 34), true}}, {"W"}, false});
  ir::Node grouped = conv;
  grouped.attrs.set("group", int64_t{3});
  layers.push_back({"Conv 3x3 stride 2, 3 groups", grouped,
                    {{"X", random_tensor({1, 12, 9, 8}, 35)}, {"W", random_tensor({21, 4, 3, 3}, 36), true}}, {"W"}, false});
  ir::Node winograd = conv;
  winograd.attrs.set("strides", std::vector<int64_t>{1, 1});
  for (int64_t side : {16, 4})
    layers.push_back({side == 16 ? "Conv 3x3 stride 1, Winograd" : "Conv 3x3 stride 1, too few tiles for Winograd", winograd,
                      {{"X", random_tensor({1, 16, side, side}, 37)}, {"W", random_tensor({24, 16, 3, 3}, 38), true}}, {"W"},
                      false});
  // A channels-first input's convolution, and the separable block, have no bfloat16 form.
  layers.push_back({"ChannelsLastConv, channels-first input 7x7",
                    first,
                    {{"X", random_tensor({1, 3, 20, 18}, 20)}, {"W", random_tensor({8, 3, 7, 7}, 21), true}},
                    {"W"},
                    false});
  ir::Node separable = channels_last_conv({1, 1}, {1, 1, 1, 1});
  separable.op = "ChannelsLastSeparableConv";
  separable.attrs.set("group", int64_t{48});
  layers.push_back({"ChannelsLastSeparableConv",
                    separable,
                    {{"X", random_tensor({1, 6, 5, 16}, 22)},
                     {"We", random_tensor({48, 16, 1, 1}, 23), true},
                     {"Be", random_tensor({48}, 24), true},
                     {"Wd", random_tensor({48, 1, 3, 3}, 25), true},
                     {"Bd", random_tensor({48}, 26), true},
                     {"Wp", random_tensor({24, 48, 1, 1}, 27), true},
                     {"Bp", random_tensor({24}, 28), true}},
                    {"We", "Wp"},
                    false});
  return layers;
}

TEST(PackedWeights, EnginesKeepOnlyThePacksAndLoadThemAsTheyAre) {
  for (bool bf16 : {false, true}) {
    if (bf16 && !kHasBf16) continue;
    for (const Layer& layer : packing_layers()) {
      SCOPED_TRACE(std::string(layer.name) + (bf16 ? ", bfloat16 products" : ""));
      const ir::Graph graph = single_node_graph(layer.node, layer.inputs);
      cpu::CpuEngine built(graph, 0, false, bf16);
      for (const std::string& name : layer.packed) {
        const ir::Value& w = built.graph().value(name);
        ASSERT_TRUE(w.packed) << name << ": the kernel's pack was not kept";
        EXPECT_EQ(w.constant->raw(), nullptr) << name << ": the values were kept beside the pack";
        EXPECT_EQ(w.constant->shape(), graph.value(name).constant->shape());
        EXPECT_EQ(w.packed->layout.substr(0, 4), bf16 && layer.bf16_form ? "bf16" : "f32.");
      }
      const Tensor want = built.run(feed_of(layer.inputs)).at("Y");

      std::string weights;
      const std::string bytes = onnx_export::export_engine_graph(built.graph(), weights);
      ir::Graph read = onnx_import::import_engine_graph(bytes, weights, "packed.engine");
      for (const std::string& name : layer.packed) {
        ASSERT_TRUE(read.value(name).packed);
        EXPECT_EQ(read.value(name).packed->layout, built.graph().value(name).packed->layout);
      }
      std::string().swap(weights);
      cpu::CpuEngine loaded(std::move(read), 0, false, bf16);
      // The graph's pack and the kernel's panels are one buffer (held once more per group of a
      // grouped convolution), not a copy.
      for (const std::string& name : layer.packed)
        EXPECT_GT(loaded.graph().value(name).packed->data.storage().use_count(), 1) << name;
      EXPECT_TRUE(bitwise_equal(loaded.run(feed_of(layer.inputs)).at("Y"), want));
    }
  }
}

// An engine of bfloat16 products loaded where the CPU has none (forced here): its kernels take
// the rounded weights' values and compute in float32, as a float32 engine of those values does.
TEST(PackedWeights, BfloatPacksOnACpuWithoutBfloat16RunInFloat32) {
  if (!kHasBf16) GTEST_SKIP() << "no bfloat16 products on this CPU to build the engine with";
  for (const Layer& layer : packing_layers()) {
    SCOPED_TRACE(layer.name);
    const ir::Graph graph = single_node_graph(layer.node, layer.inputs);
    cpu::CpuEngine built(graph, 0, false, true);
    std::string weights;
    const std::string bytes = onnx_export::export_engine_graph(built.graph(), weights);
    std::vector<NodeInput> rounded_inputs = layer.inputs;
    for (NodeInput& in : rounded_inputs) {
      if (!layer.bf16_form || std::find(layer.packed.begin(), layer.packed.end(), in.name) == layer.packed.end()) continue;
      in.data = testing::bf16_rounded(in.data);
    }
    cpu::bf16_gemm_force_isa(cpu::Bf16GemmIsa::kNone);
    cpu::CpuEngine loaded(onnx_import::import_engine_graph(bytes, weights, "bf16.engine"), 0, false, true);
    cpu::CpuEngine float32(single_node_graph(layer.node, rounded_inputs));
    const Tensor got = loaded.run(feed_of(layer.inputs)).at("Y"), want = float32.run(feed_of(layer.inputs)).at("Y");
    cpu::bf16_gemm_reset_isa();
    for (const std::string& name : layer.packed)  // the file's packs, for saving the engine again
      EXPECT_TRUE(loaded.graph().value(name).packed) << name;
    EXPECT_TRUE(bitwise_equal(got, want));
  }
}

// An engine file whose rows were packed for another micro-kernel's height (an AVX2 build, forced
// here) loaded where the kernel packs its own: the rows are unpacked and packed again, and the
// engine computes what one built here does.
TEST(PackedWeights, RowsOfAnotherMicroKernelArePackedAgain) {
  if (cpu::sgemm_best_isa() == cpu::SgemmIsa::kAvx2) GTEST_SKIP() << "this CPU's micro-kernel is AVX2's";
  for (const Layer& layer : packing_layers()) {
    if (layer.node.op != "Conv") continue;
    SCOPED_TRACE(layer.name);
    const ir::Graph graph = single_node_graph(layer.node, layer.inputs);
    cpu::sgemm_force_isa(cpu::SgemmIsa::kAvx2);
    cpu::CpuEngine avx2(graph);
    cpu::sgemm_reset_isa();
    ASSERT_TRUE(avx2.graph().value("W").packed);
    EXPECT_EQ(avx2.graph().value("W").packed->layout.substr(0, 9), "f32.rows6");
    std::string weights;
    const std::string bytes = onnx_export::export_engine_graph(avx2.graph(), weights);
    cpu::CpuEngine loaded(onnx_import::import_engine_graph(bytes, weights, "avx2.engine"));
    cpu::CpuEngine here(graph);
    EXPECT_EQ(loaded.graph().value("W").packed->layout, avx2.graph().value("W").packed->layout);  // kept for saving
    EXPECT_TRUE(bitwise_equal(loaded.run(feed_of(layer.inputs)).at("Y"), here.run(feed_of(layer.inputs)).at("Y")));
  }
}

TEST(PackedWeights, ValuesStayWhereAKernelReadsThemAtRunOrAnotherNodeReadsThem) {
  // Two MatMuls sharing their weights.
  ir::Graph shared;
  shared.name = "shared";
  shared.opset = 21;
  const Tensor w = random_tensor({16, 24}, 30), x = random_tensor({3, 16}, 31);
  shared.set_value({"X", {DType::kFloat32, ir::dims_of(x.shape())}, std::nullopt, nullptr, std::nullopt});
  shared.set_value({"W", {DType::kFloat32, ir::dims_of(w.shape())}, w, nullptr, std::nullopt});
  shared.inputs = {"X"};
  for (const char* out : {"Y1", "Y2"}) {
    ir::Node n;
    n.name = out;
    n.op = "MatMul";
    n.inputs = {"X", "W"};
    n.outputs = {out};
    shared.nodes.push_back(n);
  }
  shared.outputs = {"Y1", "Y2"};
  ir::infer_shapes(shared);
  cpu::CpuEngine two_readers(shared);
  EXPECT_FALSE(two_readers.graph().value("W").packed);
  EXPECT_NE(two_readers.graph().value("W").constant->raw(), nullptr);

  // A Gemm whose C varies along the rows runs the general path, which reads B.
  ir::Node gemm;
  gemm.op = "Gemm";
  const std::vector<NodeInput> gemm_inputs = {
      {"X", random_tensor({4, 33}, 34)}, {"W", random_tensor({33, 50}, 35), true}, {"C", random_tensor({4, 50}, 36), true}};
  cpu::CpuEngine by_row(single_node_graph(gemm, gemm_inputs));
  EXPECT_FALSE(by_row.graph().value("W").packed);
  EXPECT_TRUE(testing::all_close(by_row.run(feed_of(gemm_inputs)).at("Y"), testing::run_single_node(gemm, gemm_inputs)));
}

TEST(PackedWeights, ForgedPacksBecomeValuesOrAreRefused) {
  const Tensor w = random_tensor({33, 40}, 40), x = random_tensor({33, 40}, 41);
  cpu::PackedColumns columns;
  columns.pack(w.data<float>(), 33, 40, 40);
  // An Add reads a packed constant: no kernel of Add takes packs, so the engine unpacks it.
  ir::Node add;
  add.op = "Add";
  ir::Graph graph = single_node_graph(add, {{"X", x}, {"W", w, true}});
  graph.value("W").packed = std::make_shared<const ir::PackedConstant>(cpu::packed_constant(columns, cpu::PackView::kRows));
  graph.value("W").constant = Tensor::over_storage(DType::kFloat32, {33, 40}, nullptr);
  cpu::CpuEngine unpacked(graph);
  EXPECT_FALSE(unpacked.graph().value("W").packed);
  const Tensor sum = unpacked.run({{"X", x}}).at("Y");
  for (int64_t i = 0; i < sum.numel(); ++i) ASSERT_EQ(sum.data<float>()[i], x.data<float>()[i] + w.data<float>()[i]);

  // A pack whose bytes do not match its constant's shape: refused, naming the constant.
  ir::Node matmul;
  matmul.op = "MatMul";
  ir::Graph wrong = single_node_graph(matmul, {{"X", random_tensor({2, 33}, 42)}, {"W", w, true}});
  wrong.value("W").packed = std::make_shared<const ir::PackedConstant>(cpu::packed_constant(columns, cpu::PackView::kTransposed));
  wrong.value("W").constant = Tensor::over_storage(DType::kFloat32, {33, 40}, nullptr);
  try {
    cpu::CpuEngine refused(wrong);
    ADD_FAILURE() << "a pack of another shape was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
    EXPECT_NE(std::string(e.what()).find("'W'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
