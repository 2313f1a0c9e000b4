// Size arithmetic on numbers from files and shapes: every overflow is a kiln::Error, and a
// run never allocates past its memory limit.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "cpu/engine.h"
#include "graph_builder.h"
#include "ir/op_schema.h"
#include "ir/sizes.h"
#include "kiln/tensor.h"

namespace kiln::testing {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(Sizes, CheckedArithmeticThrowsOnOverflow) {
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "x"), int64_t{1} << 62);
  EXPECT_THROW(checked_mul(int64_t{1} << 32, int64_t{1} << 31, "x"), Error);
  EXPECT_THROW(checked_add(kMax, 1, "x"), Error);
  EXPECT_THROW(checked_sub(-kMax - 1, 1, "x"), Error);
  try {
    checked_mul(kMax, 2, "the pads of axis 3");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
    EXPECT_NE(e.message().find("the pads of axis 3"), std::string::npos) << e.message();
  }
}

TEST(Sizes, ShapeNumelBoundsTheProductOfNonZeroDims) {
  EXPECT_EQ(shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(shape_numel({0, 1000}), 0);
  EXPECT_EQ(shape_numel({}), 1);
  // 2^64 elements wrapped to 0 before; a 0 beside huge dims still multiplies in strides.
  EXPECT_THROW(shape_numel({int64_t{1} << 32, int64_t{1} << 32}), Error);
  EXPECT_THROW(shape_numel({0, int64_t{1} << 62, int64_t{1} << 62}), Error);
  EXPECT_THROW(shape_numel({kMaxTensorBytes + 1}), Error);
  EXPECT_THROW(shape_numel({-1, 2}), Error);
  EXPECT_EQ(shape_numel({kMaxTensorBytes}), kMaxTensorBytes);
}

TEST(Sizes, ShapeBytesCountsTheElementSize) {
  EXPECT_EQ(shape_bytes({2, 3}, DType::kFloat32), 24u);
  EXPECT_EQ(shape_bytes({kMaxTensorBytes / 8}, DType::kInt64), static_cast<size_t>(kMaxTensorBytes));
  EXPECT_THROW(shape_bytes({kMaxTensorBytes / 4 + 1}, DType::kFloat32), Error);
  // 2^62 float32 elements are 2^64 bytes: the product that wrapped to 0.
  EXPECT_THROW(shape_bytes({int64_t{1} << 31, int64_t{1} << 31}, DType::kFloat32), Error);
  EXPECT_THROW(Tensor(DType::kFloat32, {int64_t{1} << 31, int64_t{1} << 31}), Error);
}

TEST(Sizes, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512.0 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(double(int64_t{3} << 40)), "3.0 TiB");
}

TEST(Sizes, ShapeInferenceRefusesAnOversizedOutputNamingTheNode) {
  GraphBuilder b;
  b.input("x", {1, 4});
  b.constant("s", Tensor::from_vector<int64_t>({2}, {int64_t{1} << 31, int64_t{1} << 31}));
  b.node("ConstantOfShape", {"s"}, "y");
  b.output("y");
  try {
    ir::Graph g = b.build();
    FAIL() << "an output of 2^64 bytes was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
    EXPECT_EQ(e.op_type(), "ConstantOfShape");
    EXPECT_NE(e.message().find("larger than kiln allows"), std::string::npos) << e.message();
  }
}

TEST(Sizes, RangeOfExtremeIntegersIsRefusedNotWrapped) {
  auto range = [](int64_t start, int64_t limit, int64_t delta) {
    GraphBuilder b;
    b.input("x", {1});
    b.constant("a", Tensor::scalar<int64_t>(start));
    b.constant("l", Tensor::scalar<int64_t>(limit));
    b.constant("d", Tensor::scalar<int64_t>(delta));
    b.node("Range", {"a", "l", "d"}, "y");
    b.output("y");
    return b.build().value("y").type.shape->at(0).value;
  };
  EXPECT_EQ(range(0, 10, 3), 4);
  EXPECT_EQ(range(10, 0, -3), 4);
  EXPECT_EQ(range(0, 10, -1), 0);
  EXPECT_EQ(range(5, 5, 1), 0);
  EXPECT_EQ(range(-kMax - 1, -kMax + 99, 1), 100);  // no overflow near the end of the range
  EXPECT_EQ(range(kMax, kMax - 100, -kMax - 1), 1);
  // limit - start needs 65 bits: the length came out 0 before.
  EXPECT_THROW(range(-kMax - 1, kMax, 1), Error);
  EXPECT_THROW(range(kMax, -kMax - 1, -1), Error);
}

TEST(Sizes, BufferPoolRefusesToAllocatePastItsLimit) {
  cpu::BufferPool pool(1 << 20);
  auto a = pool.take(600 << 10);
  EXPECT_THROW(pool.take(600 << 10), Error);  // 1.2 MiB in all
  a.reset();                                  // freed: its bytes no longer count
  auto b = pool.take(900 << 10);
  EXPECT_NE(b, nullptr);
  EXPECT_THROW(pool.take(size_t{1} << 40), Error);
}

TEST(Sizes, BufferPoolLetsFreeBuffersGoBeforeRefusing) {
  cpu::BufferPool pool(1 << 20);
  Tensor t = Tensor::over_storage(DType::kUInt8, {600 << 10}, pool.take(600 << 10));
  pool.give(t);  // kept free for reuse, still held
  t = Tensor();
  auto big = pool.take(900 << 10);  // too big to reuse it: the free one goes, then it fits
  EXPECT_NE(big, nullptr);
}

TEST(Sizes, BufferPoolReusesOnlyBuffersNothingElseHolds) {
  // (The Python binding keeps a CPU engine's input copies in a BufferPool: a buffer an output or
  // another run still holds must not be handed out again.)
  cpu::BufferPool pool(0);
  Tensor first = Tensor::over_storage(DType::kFloat32, {1 << 18}, pool.take(1 << 20));
  const unsigned char* address = first.storage().get();
  Tensor alias = first;  // an output over the input's memory
  pool.give(first);      // held twice: not taken back
  first = Tensor();
  auto other = pool.take(1 << 20);
  EXPECT_NE(other.get(), address);
  pool.give(alias);  // now the only holder: taken back, and handed out next
  alias = Tensor();
  EXPECT_EQ(pool.take(1 << 20).get(), address);
  Tensor foreign(DType::kFloat32, {1 << 18});  // memory the pool did not make is never taken
  pool.give(foreign);
  EXPECT_NE(pool.take(1 << 20).get(), foreign.storage().get());
}

TEST(Sizes, CpuEngineRefusesARunPastItsMemoryLimitNamingTheTensorAndNode) {
  GraphBuilder b;
  b.input("x", {ir::Dim::named("N"), 1024});
  b.node("Relu", {"x"}, "r");
  b.node("Neg", {"r"}, "y");
  b.output("y");
  cpu::CpuEngine engine(b.build(), 1 << 20);
  EXPECT_NO_THROW(engine.run({{"x", Tensor(DType::kFloat32, {16, 1024})}}));
  try {
    engine.run({{"x", Tensor(DType::kFloat32, {320, 1024})}});  // 1.25 MiB per intermediate
    FAIL() << "a run past the limit was allowed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(e.op_type(), "Relu");
    EXPECT_NE(e.message().find("'r'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("memory limit of 1.0 MiB"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace kiln::testing
