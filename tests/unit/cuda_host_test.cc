// Host-side parts of the CUDA backend that need no GPU: the activation arena planner, the
// timing cache file, optimization profiles (which shapes are timed, which are refused), and the
// names of kiln's INT8 kernel tactics (as timing caches and engine files hold them).
#include <gtest/gtest.h>

#if KILN_WITH_CUDA
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>

#include "cuda/kernels/int8_conv.h"
#include "cuda/runtime/engine.h"
#include "cuda/runtime/memory_plan.h"
#include "cuda/runtime/runtime_compiler.h"
#include "cuda/runtime/timing_cache.h"

namespace kiln::cuda {
namespace {

Buffer arena_buffer(int64_t elements, int first, int last) {
  Buffer b;
  b.spec = TensorSpec{{elements}, Format{DType::kFloat32, Layout::kLinear}};
  b.first_use = first;
  b.last_use = last;
  return b;
}

TEST(MemoryPlan, BuffersAliveTogetherNeverOverlapAndDeadOnesAreReused) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<Buffer> buffers;
    for (int i = 0; i < 40; ++i) {
      int first = static_cast<int>(rng() % 30);
      buffers.push_back(arena_buffer(1 + rng() % 5000, first, first + static_cast<int>(rng() % 6)));
    }
    Buffer weight = arena_buffer(100, 0, 0);
    weight.kind = BufferKind::kWeight;
    buffers.push_back(weight);
    size_t total = plan_arena(buffers);
    size_t sum = 0;
    for (size_t i = 0; i < buffers.size(); ++i) {
      const Buffer& a = buffers[i];
      if (a.kind != BufferKind::kArena) continue;
      sum += a.spec.bytes();
      EXPECT_EQ(a.offset % 256, 0u);
      EXPECT_LE(a.offset + a.spec.bytes(), total);
      for (size_t j = i + 1; j < buffers.size(); ++j) {
        const Buffer& b = buffers[j];
        if (b.kind != BufferKind::kArena) continue;
        bool live_together = !(a.last_use < b.first_use || b.last_use < a.first_use);
        bool overlap = a.offset < b.offset + b.spec.bytes() && b.offset < a.offset + a.spec.bytes();
        EXPECT_FALSE(live_together && overlap) << "buffers " << i << " and " << j;
      }
    }
    EXPECT_LT(total, sum) << "nothing was reused";
  }
}

TEST(MemoryPlan, AChainNeedsOnlyTwoBuffers) {
  std::vector<Buffer> chain;
  for (int i = 0; i < 10; ++i) chain.push_back(arena_buffer(1024, i, i + 1));  // layer i writes, i+1 reads
  EXPECT_EQ(plan_arena(chain), 2 * 4096u);
}

TEST(TimingCache, SavesLoadsAndIgnoresAnotherDevice) {
  std::string path = ::testing::TempDir() + "/kiln_timing_cache_test.txt";
  std::remove(path.c_str());
  TimingCache a("GPU A sm_90");
  EXPECT_NE(a.load(path).find("does not exist"), std::string::npos);
  a.set("conv|x1", "graph:3");
  a.set("gemm|m1", "2");
  a.save(path);
  TimingCache b("GPU A sm_90");
  b.load(path);
  EXPECT_EQ(b.find("conv|x1").value_or(""), "graph:3");
  EXPECT_EQ(b.size(), 2u);
  TimingCache other("GPU B sm_80");
  EXPECT_NE(other.load(path).find("ignored"), std::string::npos);
  EXPECT_EQ(other.size(), 0u);
  std::ofstream(path) << "something else\n";
  EXPECT_THROW(TimingCache("GPU A sm_90").load(path), Error);
}

// A generated kernel's cubin is an entry too (base64, tens of kilobytes on one line): it comes back
// from the file byte for byte.
TEST(TimingCache, KeepsGeneratedKernelsCode) {
  std::string path = ::testing::TempDir() + "/kiln_timing_cache_code_test.txt";
  std::remove(path.c_str());
  std::string cubin(96 * 1024, '\0');
  std::mt19937 rng(11);
  for (char& c : cubin) c = static_cast<char>(rng() & 0xff);
  const std::string key = "fused_elementwise_cubin|sm_90|nvrtc 13.0|" + source_hash("a kernel");
  TimingCache a("GPU A sm_90");
  a.set(key, base64_encode(cubin));
  a.set("fused_elementwise|float16|n64|v8(Relu)|0", "generated4");
  a.save(path);
  TimingCache b("GPU A sm_90");
  b.load(path);
  ASSERT_TRUE(b.find(key));
  EXPECT_EQ(base64_decode(*b.find(key)), cubin);
  EXPECT_EQ(b.find("fused_elementwise|float16|n64|v8(Relu)|0").value_or(""), "generated4");
}

// Two builds load the same cache, time different layers and save one after the other: the file
// keeps both builds' entries, and the later build's tactic for a key both timed.
TEST(TimingCache, BuildsSharingAFileKeepEachOthersEntries) {
  std::string path = ::testing::TempDir() + "/kiln_timing_cache_shared.txt";
  std::remove(path.c_str());
  TimingCache first("GPU A sm_90"), second("GPU A sm_90");
  first.load(path);
  second.load(path);
  first.set("conv|a", "graph:1");
  first.set("conv|both", "graph:2");
  second.set("gemm|b", "3");
  second.set("conv|both", "kernel:implicit-gemm:64");
  first.save(path);
  second.save(path);
  TimingCache read("GPU A sm_90");
  read.load(path);
  EXPECT_EQ(read.size(), 3u);
  EXPECT_EQ(read.find("conv|a").value_or(""), "graph:1");
  EXPECT_EQ(read.find("gemm|b").value_or(""), "3");
  EXPECT_EQ(read.find("conv|both").value_or(""), "kernel:implicit-gemm:64");
  // A cache file written for another device is replaced, not merged.
  TimingCache other("GPU B sm_80");
  other.set("conv|c", "graph:0");
  other.save(path);
  TimingCache b_read("GPU B sm_80");
  b_read.load(path);
  EXPECT_EQ(b_read.size(), 1u);
}

Profile batch_profile(int64_t min, int64_t opt, int64_t max) {
  Profile p;
  p.inputs["input"] = ShapeRange{{min, 3, 224, 224}, {opt, 3, 224, 224}, {max, 3, 224, 224}};
  return p;
}

std::vector<int64_t> batches(const std::vector<Shapes>& shapes) {
  std::vector<int64_t> out;
  for (const Shapes& s : shapes) out.push_back(s.at("input")[0]);
  return out;
}

TEST(Int8ConvTactic, NamesRoundTripAndSplitKIsOnlyForTilesOf64) {
  for (const std::string name : {"implicit-gemm:64", "implicit-gemm:128", "stream1x1:64", "stream1x1:128",
                                 "implicit-gemm:64/k2", "implicit-gemm:64/k4", "implicit-gemm:64/k8", "small-m:64",
                                 "small-m:64/k2", "small-m:64/k8"}) {
    Int8ConvTactic t;
    ASSERT_TRUE(Int8ConvTactic::parse(name, t)) << name;
    EXPECT_EQ(t.str(), name);
  }
  Int8ConvTactic t;
  ASSERT_TRUE(Int8ConvTactic::parse("implicit-gemm:64/k4", t));
  EXPECT_EQ(t.kernel, Int8ConvKernel::kImplicitGemm);
  EXPECT_EQ(t.tile_n, 64);
  EXPECT_EQ(t.k_splits, 4);
  ASSERT_TRUE(Int8ConvTactic::parse("implicit-gemm:128", t));
  EXPECT_EQ(t.k_splits, 1);  // an older cache's name: no split
  for (const std::string bad : {"implicit-gemm:128/k4", "stream1x1:64/k2", "implicit-gemm:64/k3", "implicit-gemm:64/k16",
                                "implicit-gemm:32", "winograd:64", "implicit-gemm", "small-m:128", "small-m:64/k16"})
    EXPECT_FALSE(Int8ConvTactic::parse(bad, t)) << bad;
}

std::vector<std::string> tactic_names(const Int8ConvGeometry& g) {
  std::vector<std::string> names;
  for (const Int8ConvTactic& t : int8_conv_tactics(g, DType::kInt8, DType::kUndefined, ir::Activation{ir::ActivationKind::kRelu})) names.push_back(t.str());
  return names;
}

TEST(Int8ConvTactic, SmallMKernelIsOfferedForLayersOfFewTilesWithSplitsThatHaveKToSplit) {
  // ResNet-50's layer4 3x3 at batch 1: 49 pixels, 512 channels (8 tiles of 64 x 64), K = 4608
  // (18 stages of 256 bytes): unsplit and split 2, 4, 8 ways.
  Int8ConvGeometry g;
  g.batch = 1, g.c = 512, g.h = g.w = 7, g.k = 512, g.oh = g.ow = 7, g.r = g.s = 3, g.pad_h = g.pad_w = 1;
  std::vector<std::string> names = tactic_names(g);
  for (const std::string want : {"small-m:64", "small-m:64/k2", "small-m:64/k4", "small-m:64/k8", "implicit-gemm:64"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  // A 1x1 over 64 channels (one stage of K): the small-M kernel, not split.
  g.c = 64, g.r = g.s = 1, g.pad_h = g.pad_w = 0;
  names = tactic_names(g);
  EXPECT_NE(std::find(names.begin(), names.end(), "small-m:64"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "small-m:64/k2"), names.end());
  // A classifier's FC at batch 1 (2048 -> 1000 features, run as 1008 channels): only the small-M
  // kernel, its last tile partial, split up to 8 ways (K = 2048: 8 stages).
  Int8ConvGeometry fc;
  fc.batch = 1, fc.c = 2048, fc.h = fc.w = 1, fc.k = 1008, fc.oh = fc.ow = 1;
  EXPECT_EQ(tactic_names(fc), (std::vector<std::string>{"small-m:64", "small-m:64/k2", "small-m:64/k4", "small-m:64/k8"}));
  fc.batch = 512;  // 8 x 16 tiles: 2 splits at most
  EXPECT_EQ(tactic_names(fc), (std::vector<std::string>{"small-m:64", "small-m:64/k2"}));
  fc.batch = 4096;  // too many tiles for the small-M kernel, and 1008 is not a multiple of 64
  EXPECT_TRUE(tactic_names(fc).empty());
  // Batch 128 has 98 x 8 tiles: the small-M kernel is not offered.
  g.batch = 128, g.c = 512, g.r = g.s = 3, g.pad_h = g.pad_w = 1;
  for (const std::string& name : tactic_names(g)) EXPECT_EQ(name.rfind("small-m", 0), std::string::npos) << name;
}

TEST(Profiles, TimedShapesAreOptMinMaxThenAGeometricLadderBetween) {
  // 1 -> 128 is 4.85 in log elements: four steps of a factor of about 3.4; 128 -> 256 needs none.
  EXPECT_EQ(batches(timed_shapes(batch_profile(1, 128, 256), 4.0)), (std::vector<int64_t>{128, 1, 256, 3, 11, 38}));
  EXPECT_EQ(batches(timed_shapes(batch_profile(1, 128, 256), 1.0)), (std::vector<int64_t>{128, 1, 256}));
  EXPECT_EQ(batches(timed_shapes(batch_profile(8, 8, 8), 4.0)), (std::vector<int64_t>{8}));  // a fixed shape
  EXPECT_EQ(batches(timed_shapes(batch_profile(1, 1, 64), 4.0)), (std::vector<int64_t>{1, 64, 4, 16}));
  // Several varying dimensions move together, each within its range; fixed ones stay.
  Profile p;
  p.inputs["input"] = ShapeRange{{1, 3, 32, 32}, {8, 3, 128, 128}, {8, 3, 128, 128}};
  p.inputs["mask"] = ShapeRange{{1, 16}, {1, 16}, {1, 16}};
  for (const Shapes& s : timed_shapes(p, 4.0)) {
    EXPECT_EQ(p.mismatch(s), "") << shapes_key(s);
    EXPECT_EQ(s.at("input")[1], 3);
    EXPECT_EQ(s.at("mask"), (std::vector<int64_t>{1, 16}));
  }
  EXPECT_GT(timed_shapes(p, 4.0).size(), 3u);
}

TEST(Profiles, MismatchNamesTheInputAndTheDimension) {
  const Profile p = batch_profile(1, 8, 16);
  EXPECT_EQ(p.mismatch({{"input", {16, 3, 224, 224}}}), "");
  EXPECT_NE(p.mismatch({{"input", {17, 3, 224, 224}}}).find("dimension 0 is 17, above the profile's max 16"), std::string::npos);
  EXPECT_NE(p.mismatch({{"input", {2, 3, 200, 224}}}).find("dimension 2 is 200, below the profile's min 224"), std::string::npos);
  EXPECT_NE(p.mismatch({{"input", {2, 3, 224}}}).find("rank 4, not 3"), std::string::npos);
  EXPECT_NE(p.mismatch({{"input", {2, 3, 224, 224}}, {"other", {1}}}).find("no input named 'other'"), std::string::npos);
  EXPECT_NE(p.mismatch({}).find("'input' has no shape"), std::string::npos);
}

}  // namespace
}  // namespace kiln::cuda
#endif
