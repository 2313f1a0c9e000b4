// The per-layer quantized-or-fp16 choice of GPU --int8 and --fp8 builds (src/compiler/where_faster.h),
// on made-up layer times: what each quantized layer is charged for (its quantize layer shared by
// its readers, reformats of its values) and which layers stay quantized. No GPU needed.
#include <gtest/gtest.h>

#include "compiler/where_faster.h"

#include <stdexcept>

namespace kiln {
namespace {

ir::Node node(const std::string& op, const std::string& domain, const std::string& name, std::vector<std::string> inputs,
              std::string output) {
  ir::Node n;
  n.op = op;
  n.domain = domain;
  n.name = name;
  n.inputs = std::move(inputs);
  n.outputs = {std::move(output)};
  return n;
}

// x -> QuantizeLinear q -> x_fp8, read by c1 and c2; c1 -> y1 (E4M3) -> c3.
ir::Graph fp8_graph() {
  ir::Graph g;
  g.nodes.push_back(node("QuantizeLinear", "", "q", {"x", "x_scale", "x_zero_point"}, "x_fp8"));
  g.nodes.push_back(node("QConv", "kiln", "c1", {"x_fp8", "w1"}, "y1"));
  g.nodes.push_back(node("QConv", "kiln", "c2", {"x_fp8", "w2"}, "y2"));
  g.nodes.push_back(node("QConv", "kiln", "c3", {"y1", "w3"}, "y3"));
  return g;
}

const compiler::QuantizedLayerCost& cost_of(const std::vector<compiler::QuantizedLayerCost>& costs, const std::string& layer) {
  for (const compiler::QuantizedLayerCost& c : costs)
    if (c.layer == layer) return c;
  throw std::runtime_error("no cost for " + layer);
}

TEST(WhereFaster, ChargesTheSharedQuantizeAndReformatsToTheReaders) {
  const std::map<std::string, double> fp8 = {
      {"q", 0.04}, {"reformat(x)", 0.01}, {"c1", 0.10}, {"c2", 0.05}, {"c3", 0.02}, {"reformat(y3)", 0.03}};
  const std::map<std::string, double> fp16 = {{"reformat(x)", 0.01}, {"c1", 0.11}, {"c2", 0.20}, {"c3", 0.01}};
  const auto costs = compiler::compare_quantized_layers(fp8_graph(), fp8, fp16);
  ASSERT_EQ(costs.size(), 3u);
  // c1 and c2 share the quantize layer and the reformat of its float input: half each.
  const compiler::QuantizedLayerCost& c1 = cost_of(costs, "c1");
  EXPECT_DOUBLE_EQ(c1.quantized_ms, 0.10);
  EXPECT_DOUBLE_EQ(c1.added_ms, 0.025);
  EXPECT_DOUBLE_EQ(c1.fp16_ms, 0.12);  // its fp16 form reads x, with x's reformat
  EXPECT_FALSE(c1.keep_quantized());         // 0.125 > 0.12
  EXPECT_TRUE(cost_of(costs, "c2").keep_quantized());
  // c3 reads E4M3 directly (no quantize), and pays for the reformat of its output.
  const compiler::QuantizedLayerCost& c3 = cost_of(costs, "c3");
  EXPECT_DOUBLE_EQ(c3.added_ms, 0.03);
  EXPECT_DOUBLE_EQ(c3.fp16_ms, 0.01);
  EXPECT_FALSE(c3.keep_quantized());
}

TEST(WhereFaster, AnAttentionWritingInt8ChargesWhatItAddsToTheProductReadingIt) {
  // attention (int8 output, fuse_attention_quantize) -> Reshape -> c1; its fp16 form writes float.
  ir::Graph g;
  g.nodes.push_back(node("StridedAttention", "kiln", "attention", {"qkv", "qkv", "qkv", "", "y_scale", "y_zero"}, "y_int8"));
  g.nodes.push_back(node("Reshape", "", "as_image", {"y_int8", "shape"}, "y_image"));
  g.nodes.push_back(node("QConv", "kiln", "c1", {"y_image", "w1"}, "out"));
  const std::map<std::string, double> int8 = {{"attention", 0.09}, {"c1", 0.04}};
  const std::map<std::string, double> fp16 = {{"attention", 0.08}, {"c1", 0.06}};
  const compiler::QuantizedLayerCost& c1 = cost_of(compiler::compare_quantized_layers(g, int8, fp16), "c1");
  EXPECT_NEAR(c1.added_ms, 0.01, 1e-12);
  EXPECT_TRUE(c1.keep_quantized());  // 0.05 < 0.06
  // An int8 output that costs more than the product saves: the product stays float.
  const std::map<std::string, double> slow = {{"attention", 0.12}, {"c1", 0.04}};
  EXPECT_FALSE(cost_of(compiler::compare_quantized_layers(g, slow, fp16), "c1").keep_quantized());
}

TEST(WhereFaster, LayersWithoutAnFp16TimeAreLeftOut) {
  const auto costs = compiler::compare_quantized_layers(fp8_graph(), {{"c1", 0.1}, {"c2", 0.1}, {"c3", 0.1}}, {{"c2", 0.3}});
  ASSERT_EQ(costs.size(), 1u);
  EXPECT_EQ(costs[0].layer, "c2");
  EXPECT_TRUE(costs[0].keep_quantized());
}

TEST(WhereFaster, MedianOverRunsSumsRepeatedNamesWithinARun) {
  std::vector<std::vector<LayerTiming>> runs = {
      {{"a", "Conv", "t", 1.0f}, {"r", "Reformat", "t", 0.5f}, {"r", "Reformat", "t", 0.25f}},
      {{"a", "Conv", "t", 3.0f}, {"r", "Reformat", "t", 1.0f}},
      {{"a", "Conv", "t", 2.0f}, {"r", "Reformat", "t", 0.5f}},
      {{"a", "Conv", "t", 9.0f}, {"r", "Reformat", "t", 0.5f}}};
  const auto ms = compiler::median_layer_ms(runs);
  EXPECT_DOUBLE_EQ(ms.at("a"), 2.5);   // of 1, 2, 3, 9
  EXPECT_DOUBLE_EQ(ms.at("r"), 0.625);  // of 0.5, 0.5, 0.75, 1
}

TEST(WhereFaster, QuantizedLayersInGraphOrder) {
  EXPECT_EQ(compiler::quantized_layers_in_order(fp8_graph()), (std::vector<std::string>{"c1", "c2", "c3"}));
}

TEST(WhereFaster, LeadingRegionsEndBeforeTheFirstSlowerLayer) {
  const std::vector<std::string> order = {"stem", "a", "b", "c", "d"};
  // The stem alone, and the two layers before b, the first slower one.
  EXPECT_EQ(compiler::leading_region_lengths(order, {"b", "d"}), (std::vector<size_t>{1, 2}));
  EXPECT_EQ(compiler::leading_region_lengths(order, {"d"}), (std::vector<size_t>{1, 4}));
  // The stem slower: the stem alone is still timed (its quantize may cost what it saves).
  EXPECT_EQ(compiler::leading_region_lengths(order, {"stem", "a"}), (std::vector<size_t>{1}));
  // Only the stem before the first slower layer: one candidate, not two.
  EXPECT_EQ(compiler::leading_region_lengths(order, {"a"}), (std::vector<size_t>{1}));
  // No slower layer: the whole network is the all-quantized engine, already a candidate.
  EXPECT_EQ(compiler::leading_region_lengths(order, {}), (std::vector<size_t>{1}));
  // A single layer leaves nothing on the other side.
  EXPECT_TRUE(compiler::leading_region_lengths({"stem"}, {}).empty());
}

}  // namespace
}  // namespace kiln
