// The generated kernels of FusedElementwise groups (cuda/layers/fused_elementwise_source.h):
// their sources compile with NVRTC for Hopper (no GPU is needed to compile), and what carries a
// cubin through a timing cache or an engine file (base64, the source's hash) round-trips. The
// GPU suite (tests/gpu/test_gpu_fused_elementwise.py) runs the kernels against the CPU engine.
#include <gtest/gtest.h>

#if KILN_WITH_CUDA
#include <cstring>
#include <random>

#include "cuda/layers/fused_elementwise_source.h"
#include "cuda/runtime/runtime_compiler.h"

namespace kiln::cuda {
namespace {

using Access = GeneratedOperand::Access;

cudaDeviceProp hopper() {
  cudaDeviceProp p;
  std::memset(&p, 0, sizeof p);
  p.major = 9;
  p.minor = 0;
  return p;
}

ir::ElementwiseStep binary(ir::ElementwiseBinary op, int a, int b) {
  ir::ElementwiseStep s;
  s.binary = true;
  s.binary_op = op;
  s.a = a;
  s.b = b;
  return s;
}

ir::ElementwiseStep unary(ir::UnaryOp op, int a, float alpha = 0.f, float beta = 0.f) {
  ir::ElementwiseStep s;
  s.unary_op = op;
  s.a = a;
  s.params = {alpha, beta};
  return s;
}

GeneratedOperand operand(Access access, int slot, bool float32 = false) {
  GeneratedOperand o;
  o.access = access;
  o.slot = slot;
  o.float32 = float32;
  return o;
}

// A cubin is an ELF file.
void expect_compiles(const std::string& source, const std::string& name) {
  std::string cubin;
  ASSERT_NO_THROW(cubin = compile_to_cubin(source, name, hopper())) << source;
  ASSERT_GT(cubin.size(), 4u);
  EXPECT_EQ(cubin.substr(0, 4), "\x7f" "ELF");
}

// DenseNet's pre-activation in NHWC: Concat of three parts along the channels (the row), a
// per-channel scale and shift (float32 constants), Relu.
TEST(GeneratedElementwise, ConcatScaleShiftReluCompiles) {
  ir::ElementwiseProgram p;
  p.inputs = 3;
  p.concat_parts = 3;
  p.steps = {binary(ir::ElementwiseBinary::kMul, 0, 1), binary(ir::ElementwiseBinary::kAdd, 3, 2), unary(ir::UnaryOp::kRelu, 4)};
  GeneratedElementwise g;
  g.half = true;
  g.n = 128 * 56 * 56 * 96;
  g.slots = 5;
  g.operands = {operand(Access::kConcat, 0), operand(Access::kBlock, 3, true), operand(Access::kBlock, 4, true)};
  g.operands[1].count = g.operands[2].count = 96;
  g.concat.row = 96;
  g.concat.width = {64, 16, 16};
  std::optional<std::string> source = fused_elementwise_source(p, g);
  ASSERT_TRUE(source);
  // The row splits in units of 16 channels: 6 units, the first four the first part's.
  EXPECT_NE(source->find("kUnitPart[kUnits] = {0, 0, 0, 0, 1, 2}"), std::string::npos) << *source;
  for (int u : kGeneratedUnrolls) EXPECT_NE(source->find(generated_kernel_name(u)), std::string::npos);
  expect_compiles(*source, "concat_scale_shift_relu");
}

// Every unary op with float math, with parameters, in a float32 group over a full input, a
// strided (transposed) one, a runtime scalar and a constant scalar written into the code.
TEST(GeneratedElementwise, EveryUnaryOpAndAccessCompiles) {
  ir::ElementwiseProgram p;
  p.inputs = 4;
  std::vector<ir::UnaryOp> ops;
#define KILN_TEST_UNARY(k) ops.push_back(ir::UnaryOp::k);
  KILN_FLOAT_UNARY_OPS(KILN_TEST_UNARY)
#undef KILN_TEST_UNARY
  p.steps.push_back(binary(ir::ElementwiseBinary::kSub, 0, 1));
  for (ir::UnaryOp op : ops) p.steps.push_back(unary(op, p.registers() - 1, 0.25f, 1.5f));
  p.steps.push_back(binary(ir::ElementwiseBinary::kDiv, p.registers() - 1, 2));
  p.steps.push_back(binary(ir::ElementwiseBinary::kMax, 3, p.registers() - 1));
  p.steps.push_back(binary(ir::ElementwiseBinary::kMin, p.registers() - 1, 4));
  GeneratedElementwise g;
  g.n = 2 * 8 * 12;
  g.slots = 4;
  g.operands = {operand(Access::kFull, 0), operand(Access::kStrided, 1), operand(Access::kScalar, 2),
                operand(Access::kScalar, 3, true)};
  g.operands[1].dims = {{2, 96}, {8, 1}, {12, 8}};
  g.operands[3].value = 0.125f;
  std::optional<std::string> source = fused_elementwise_source(p, g);
  ASSERT_TRUE(source);
  EXPECT_NE(source->find("__uint_as_float(0x3e000000u)"), std::string::npos);  // 0.125f
  EXPECT_NE(source->find("UnaryOp::kGeluTanh"), std::string::npos);
  expect_compiles(*source, "every_unary_op");
}

// A group of 2^31 elements or more indexes in 64 bits.
TEST(GeneratedElementwise, LargeGroupIndexesInSixtyFourBits) {
  ir::ElementwiseProgram p;
  p.inputs = 2;
  p.steps = {binary(ir::ElementwiseBinary::kAdd, 0, 1), unary(ir::UnaryOp::kSigmoid, 2)};
  GeneratedElementwise g;
  g.half = true;
  g.n = int64_t{3} << 30;
  g.slots = 2;
  g.operands = {operand(Access::kFull, 0), operand(Access::kBlock, 1)};
  g.operands[1].repeat = 1024;
  g.operands[1].count = 512;
  std::optional<std::string> source = fused_elementwise_source(p, g);
  ASSERT_TRUE(source);
  EXPECT_NE(source->find("using Index = unsigned long long"), std::string::npos);
  expect_compiles(*source, "large_group");
}

// A concatenation whose parts share no large divisor would need a table of more units than
// shared memory should hold: no generated kernel (the interpreter runs the group).
TEST(GeneratedElementwise, FinelySplitConcatenationHasNoKernel) {
  ir::ElementwiseProgram p;
  p.inputs = 1;
  p.concat_parts = 2;
  p.steps = {unary(ir::UnaryOp::kRelu, 0)};
  GeneratedElementwise g;
  g.half = true;
  g.n = 8 * 2 * (kMaxConcatUnits + 1) * 8;
  g.slots = 2;
  g.operands = {operand(Access::kConcat, 0)};
  g.concat.row = (kMaxConcatUnits + 1) * 8;
  g.concat.width = {8, kMaxConcatUnits * 8};
  EXPECT_FALSE(fused_elementwise_source(p, g));
}

TEST(GeneratedElementwise, CompileErrorsNameTheKernelAndQuoteTheLog) {
  try {
    compile_to_cubin("extern \"C\" __global__ void k() { undeclared_thing(); }", "broken_group", hopper());
    FAIL() << "compiled";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("broken_group"), std::string::npos) << what;
    EXPECT_NE(what.find("undeclared_thing"), std::string::npos) << what;
  }
}

// Compiles on worker threads give each submission its own cubin, the same as a compile on the
// caller's thread, or its own error; a queue destroyed with work waiting returns.
TEST(GeneratedElementwise, CompileQueueCompilesInParallelAndCarriesErrors) {
  auto kernel = [](int k) {
    return "extern \"C\" __global__ void k" + std::to_string(k) + "(float* x) { x[threadIdx.x] *= " + std::to_string(k) +
           ".5f; }";
  };
  std::vector<std::shared_future<std::string>> results;
  {
    CompileQueue queue(hopper(), 3);
    for (int k = 0; k < 6; ++k) results.push_back(queue.submit(kernel(k), "group" + std::to_string(k)));
    std::shared_future<std::string> broken = queue.submit("extern \"C\" __global__ void k() { nope(); }", "broken_group");
    for (int k = 0; k < 6; ++k) EXPECT_EQ(results[static_cast<size_t>(k)].get(), compile_to_cubin(kernel(k), "serial", hopper())) << k;
    try {
      broken.get();
      FAIL() << "compiled";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("broken_group"), std::string::npos) << e.what();
    }
  }
  CompileQueue abandoned(hopper(), 1);
  for (int k = 0; k < 4; ++k) abandoned.submit(kernel(k), "abandoned");
}

TEST(GeneratedElementwise, Base64RoundTripsAnyBytesAndRefusesOthers) {
  std::mt19937 rng(7);
  for (size_t n = 0; n < 40; ++n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
    const std::string text = base64_encode(bytes);
    EXPECT_EQ(text.size() % 4, 0u);
    EXPECT_EQ(base64_decode(text), bytes);
  }
  EXPECT_EQ(base64_encode("kiln"), "a2lsbg==");
  for (const char* bad : {"a2lsbg=", "a2l$bg==", "a2=sbg==", "=2lsbg==", "a2lsbg=a"})
    EXPECT_THROW(base64_decode(bad), Error) << bad;
}

TEST(GeneratedElementwise, SourceHashIsStableAndTellsSourcesApart) {
  EXPECT_EQ(source_hash(""), "14650fb0739d0383");  // kiln's FNV-1a offset basis (ir/hash.h)
  EXPECT_EQ(source_hash("a"), source_hash("a"));
  EXPECT_NE(source_hash("a"), source_hash("b"));
}

}  // namespace
}  // namespace kiln::cuda
#endif
