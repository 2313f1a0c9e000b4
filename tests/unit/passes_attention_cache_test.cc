// Tests of split_attention_cache: an Attention with a key/value cache becomes Concats making the
// present key and value and an Attention without a cache, its causal and window masking a
// constant mask, and computes what the cached form computes (the CPU engine's kernel, which takes
// the cache itself, is the reference); nodes it cannot write out that way stay.
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "passes/passes.h"

namespace kiln::testing {
namespace {

struct CacheCase {
  bool three_d = false;
  int64_t batch = 2, q_heads = 3, kv_heads = 3, q_seq = 4, kv_seq = 4, past_seq = 3, head = 8, v_head = 8;
  std::vector<std::pair<std::string, ir::AttrValue>> attrs;
  std::string mask;  // "", "bool" or "float": a constant [q_seq, past + kv]
};

// Attention(Q, K, V, mask?, past_key, past_value) -> Y, present_key, present_value, all three
// outputs of the graph.
ir::Graph cached_attention(const CacheCase& c) {
  GraphBuilder b;
  const int64_t total = c.past_seq + c.kv_seq;
  if (c.three_d) {
    b.input("q", {c.batch, c.q_seq, c.q_heads * c.head});
    b.input("k", {c.batch, c.kv_seq, c.kv_heads * c.head});
    b.input("v", {c.batch, c.kv_seq, c.kv_heads * c.v_head});
  } else {
    b.input("q", {c.batch, c.q_heads, c.q_seq, c.head});
    b.input("k", {c.batch, c.kv_heads, c.kv_seq, c.head});
    b.input("v", {c.batch, c.kv_heads, c.kv_seq, c.v_head});
  }
  b.input("past_k", {c.batch, c.kv_heads, c.past_seq, c.head});
  b.input("past_v", {c.batch, c.kv_heads, c.past_seq, c.v_head});
  std::string mask;
  if (c.mask == "float") mask = b.random("mask", {c.q_seq, total});
  if (c.mask == "bool") {
    Tensor m(DType::kBool, {c.q_seq, total});
    for (int64_t i = 0; i < m.numel(); ++i) m.data<bool>()[i] = (i * 7) % 5 != 0;  // every row sees some keys
    mask = b.constant("mask", m);
  }
  auto attrs = c.attrs;
  if (c.three_d) {
    attrs.emplace_back("q_num_heads", c.q_heads);
    attrs.emplace_back("kv_num_heads", c.kv_heads);
  }
  b.node("Attention", {"q", "k", "v", mask, "past_k", "past_v"}, "y", attrs);
  b.last().outputs = {"y", "present_k", "present_v"};
  for (const char* o : {"y", "present_k", "present_v"}) b.output(o);
  return b.build();
}

int count_cached(const ir::Graph& g) {
  int n = 0;
  for (const ir::Node& node : g.nodes)
    if (node.op == "Attention" && node.inputs.size() > 4) ++n;
  return n;
}

void expect_split_and_same(const CacheCase& c) {
  const ir::Graph before = cached_attention(c);
  ir::Graph after = before;
  ASSERT_EQ(passes::split_attention_cache(after), 1);
  ir::infer_shapes(after);
  EXPECT_EQ(count_cached(after), 0);
  EXPECT_EQ(count_ops(after, "Concat"), 2);
  for (const ir::Node& n : after.nodes)
    if (n.op == "Attention") {
      EXPECT_FALSE(n.attrs.has("is_causal"));
      EXPECT_FALSE(n.attrs.has("left_window_size"));
    }
  expect_same_outputs(before, after);
}

TEST(SplitAttentionCache, FourDimensionalWithoutMask) { expect_split_and_same({}); }

TEST(SplitAttentionCache, CausalQueriesSitAfterThePast) {
  CacheCase c;
  c.attrs = {{"is_causal", int64_t{1}}};
  expect_split_and_same(c);
  c.q_seq = 1;  // one decoding step: the query sees every key
  c.kv_seq = 1;
  expect_split_and_same(c);
}

TEST(SplitAttentionCache, ThreeDimensionalGroupedHeadsWithAFloatMask) {
  CacheCase c;
  c.three_d = true;
  c.q_heads = 6;
  c.kv_heads = 2;
  c.v_head = 5;
  c.kv_seq = 6;
  c.past_seq = 12;
  c.mask = "float";
  c.attrs = {{"is_causal", int64_t{1}}, {"scale", 0.3f}};
  expect_split_and_same(c);
}

TEST(SplitAttentionCache, WindowsAndABooleanMask) {
  CacheCase c;
  c.mask = "bool";
  c.kv_seq = 2;
  c.past_seq = 8;
  c.attrs = {{"is_causal", int64_t{1}}, {"left_window_size", int64_t{2}}};
  expect_split_and_same(c);
  c.attrs = {{"left_window_size", int64_t{3}}, {"right_window_size", int64_t{1}}};
  expect_split_and_same(c);
}

TEST(SplitAttentionCache, LeavesWhatItCannotWriteOut) {
  // The logits as an output, and dims not known: the node stays as it is.
  ir::Graph g = cached_attention({});
  for (ir::Node& n : g.nodes)
    if (n.op == "Attention") n.outputs.push_back("logits");
  ir::infer_shapes(g);
  EXPECT_EQ(passes::split_attention_cache(g), 0);

  GraphBuilder b;
  b.input("q", {ir::Dim::named("B"), 3, 4, 8});
  b.input("k", {ir::Dim::named("B"), 3, 4, 8});
  b.input("v", {ir::Dim::named("B"), 3, 4, 8});
  b.input("past_k", {ir::Dim::named("B"), 3, ir::Dim::named("P"), 8});
  b.input("past_v", {ir::Dim::named("B"), 3, ir::Dim::named("P"), 8});
  b.node("Attention", {"q", "k", "v", "", "past_k", "past_v"}, "y", {{"is_causal", int64_t{1}}});
  b.last().outputs = {"y", "present_k", "present_v"};
  b.output("y");
  ir::Graph dynamic = b.build();
  EXPECT_EQ(passes::split_attention_cache(dynamic), 0);
  EXPECT_EQ(count_cached(dynamic), 1);
}

}  // namespace
}  // namespace kiln::testing
