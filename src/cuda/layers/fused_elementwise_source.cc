#include "cuda/layers/fused_elementwise_source.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

namespace kiln::cuda {

namespace {

// Helpers every generated kernel starts with. Float16 is converted by the PTX instructions
// __half2float and __float2half_rn compile to (NVRTC has no cuda_fp16.h).
constexpr const char* kPrelude = R"(
__device__ __forceinline__ float half_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned int halves(float lo, float hi) {
  unsigned short a, b;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(a) : "f"(lo));
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(hi));
  return static_cast<unsigned int>(a) | static_cast<unsigned int>(b) << 16;
}
__device__ __forceinline__ void unpack(const uint4 r, const bool half, float* v) {
  const unsigned int w[4] = {r.x, r.y, r.z, r.w};
  if (half) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = half_to_float(static_cast<unsigned short>(w[k] & 0xffffu));
      v[2 * k + 1] = half_to_float(static_cast<unsigned short>(w[k] >> 16));
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = __uint_as_float(w[k]);
  }
}
// 16 bytes from element `at` of a tensor of `half` or float elements.
__device__ __forceinline__ uint4 load16(const void* p, const bool half, Index at) {
  return __ldg(reinterpret_cast<const uint4*>(static_cast<const char*>(p) + static_cast<unsigned long long>(at) * (half ? 2 : 4)));
}
// kV elements from element `at`.
__device__ __forceinline__ void load_vector(const void* p, const bool half, Index at, float (&v)[kV]) {
  constexpr int per = 16 / 4;
  if (half) {
#pragma unroll
    for (int q = 0; q < kV / 8; ++q) unpack(load16(p, true, at + 8 * q), true, v + 8 * q);
  } else {
#pragma unroll
    for (int q = 0; q < kV / per; ++q) unpack(load16(p, false, at + per * q), false, v + per * q);
  }
}
__device__ __forceinline__ float load_one(const void* p, const bool half, Index at) {
  if (half) return half_to_float(__ldg(static_cast<const unsigned short*>(p) + at));
  return __ldg(static_cast<const float*>(p) + at);
}
__device__ __forceinline__ void store_vector(void* p, const bool half, Index at, const float (&v)[kV]) {
  if (half) {
#pragma unroll
    for (int q = 0; q < kV / 8; ++q)
      reinterpret_cast<uint4*>(static_cast<unsigned short*>(p) + at)[q] =
          make_uint4(halves(v[8 * q], v[8 * q + 1]), halves(v[8 * q + 2], v[8 * q + 3]),
                     halves(v[8 * q + 4], v[8 * q + 5]), halves(v[8 * q + 6], v[8 * q + 7]));
  } else {
#pragma unroll
    for (int q = 0; q < kV / 4; ++q)
      reinterpret_cast<float4*>(static_cast<float*>(p) + at)[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
  }
}
)";

std::string float_literal(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  std::ostringstream s;
  s << "__uint_as_float(0x" << std::hex << bits << "u)";
  return s.str();
}

const char* binary_name(ir::ElementwiseBinary op) {
  switch (op) {
    case ir::ElementwiseBinary::kAdd: return "kAdd";
    case ir::ElementwiseBinary::kSub: return "kSub";
    case ir::ElementwiseBinary::kMul: return "kMul";
    case ir::ElementwiseBinary::kDiv: return "kDiv";
    case ir::ElementwiseBinary::kMax: return "kMax";
    case ir::ElementwiseBinary::kMin: return "kMin";
  }
  return "kAdd";
}

// The interpreter runs one step at a time, so a multiply of one step never fuses with an add of
// the next into one FMA there; in straight-line code the compiler (ptxas as well as NVVM) would
// fuse them. Add, Sub and Mul steps are therefore written as the intrinsics of the same IEEE
// operations that never fuse (add.rn, sub.rn, mul.rn): elementwise_binary's a + b, a - b, a * b,
// rounded once each, as the interpreter rounds them.
const char* rounded_intrinsic(ir::ElementwiseBinary op) {
  switch (op) {
    case ir::ElementwiseBinary::kAdd: return "__fadd_rn";
    case ir::ElementwiseBinary::kSub: return "__fsub_rn";
    case ir::ElementwiseBinary::kMul: return "__fmul_rn";
    default: return nullptr;
  }
}

const char* unary_name(ir::UnaryOp op) {
  switch (op) {
#define KILN_UNARY_NAME(k) \
  case ir::UnaryOp::k: return #k;
    KILN_FLOAT_UNARY_OPS(KILN_UNARY_NAME)
#undef KILN_UNARY_NAME
    default: return nullptr;
  }
}

}  // namespace

std::string generated_kernel_name(int unroll) { return "kiln_fused_elementwise_u" + std::to_string(unroll); }

std::optional<std::string> fused_elementwise_source(const ir::ElementwiseProgram& program, const GeneratedElementwise& g) {
  using Access = GeneratedOperand::Access;
  const int vector = g.half ? 8 : 4;
  const bool wide = g.n >= (int64_t{1} << 31);
  const std::string suffix = wide ? "ull" : "u";
  auto index = [&](int64_t v) { return std::to_string(v) + suffix; };
  const std::string half = g.half ? "true" : "false";
  auto storage = [&](const GeneratedOperand& o) -> std::string { return o.float32 ? "false" : half; };

  std::ostringstream s;
  s << "// kiln: the generated kernel of a FusedElementwise group: " << g.signature << "\n"
    << "#include \"ir/float_math.h\"\n\n"
    << "namespace {\n\n"
    << "using Index = " << (wide ? "unsigned long long" : "unsigned int") << ";\n"
    << "constexpr int kV = " << vector << ";\n"
    << "constexpr Index kVectors = " << index(g.n / vector) << ";\n"
    << kPrelude << "\n"
    << "struct Args {\n  const void* in[" << std::max(g.slots, 1) << "];\n  void* out;\n};\n\n";

  // The concatenation: its row split in units of the parts' widths' common divisor, and the
  // part each unit lies in.
  const int parts = program.concat_parts;
  int64_t unit = 0;
  if (parts > 0) {
    for (int64_t w : g.concat.width) unit = std::gcd(unit, w);
    if (unit <= 0 || g.concat.row % unit != 0 || g.concat.row / unit > kMaxConcatUnits) return std::nullopt;
    const int64_t units = g.concat.row / unit;
    std::vector<int> part_of(static_cast<size_t>(units));
    std::vector<int64_t> start;
    int64_t at = 0;
    for (int k = 0; k < parts; ++k) {
      start.push_back(at);
      for (int64_t u = at / unit; u < (at + g.concat.width[static_cast<size_t>(k)]) / unit; ++u) part_of[static_cast<size_t>(u)] = k;
      at += g.concat.width[static_cast<size_t>(k)];
    }
    auto list = [&](auto values, bool as_index) {
      std::string out;
      for (size_t k = 0; k < values.size(); ++k) out += (k ? ", " : "") + (as_index ? index(values[k]) : std::to_string(values[k]));
      return out;
    };
    s << "constexpr Index kRow = " << index(g.concat.row) << ", kUnit = " << index(unit) << ";\n"
      << "constexpr int kParts = " << parts << ", kUnits = " << units << ";\n"
      << "__constant__ Index kPartWidth[kParts] = {" << list(g.concat.width, true) << "};\n"
      << "__constant__ Index kPartStart[kParts] = {" << list(start, true) << "};\n"
      << "__constant__ unsigned char kUnitPart[kUnits] = {" << list(part_of, false) << "};\n\n";
  }

  // Which operands stream: read as the output is (its own layout, or the concatenation), in the
  // output's storage: their 16 bytes are loaded for all U vectors before any is computed.
  std::vector<bool> streamed;
  for (const GeneratedOperand& o : g.operands)
    streamed.push_back((o.access == Access::kFull && !o.float32 == g.half) || o.access == Access::kConcat);

  s << "template <int U> __device__ __forceinline__ void run(const Args& args) {\n";
  if (parts > 0) {
    s << "  __shared__ const void* part_data[kParts];\n"
      << "  __shared__ Index part_width[kParts], part_start[kParts];\n"
      << "  __shared__ unsigned char unit_part[kUnits];\n"
      << "  for (int k = threadIdx.x; k < kParts; k += blockDim.x) {\n"
      << "    part_data[k] = args.in[k];\n"
      << "    part_width[k] = kPartWidth[k];\n"
      << "    part_start[k] = kPartStart[k];\n"
      << "  }\n"
      << "  for (int k = threadIdx.x; k < kUnits; k += blockDim.x) unit_part[k] = kUnitPart[k];\n"
      << "  __syncthreads();\n";
  }
  s << "  const Index threads = static_cast<Index>(gridDim.x) * blockDim.x;\n"
    << "  for (Index base = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; base < kVectors; base += threads * U) {\n";
  for (size_t k = 0; k < g.operands.size(); ++k)
    if (streamed[k]) s << "    uint4 raw" << k << "[U];\n";
  s << "#pragma unroll\n"
    << "    for (int u = 0; u < U; ++u) {\n"
    << "      const Index v = base + u * threads;\n"
    << "      if (v >= kVectors) break;\n"
    << "      const Index i = v * kV;\n";
  for (size_t k = 0; k < g.operands.size(); ++k) {
    if (!streamed[k]) continue;
    const GeneratedOperand& o = g.operands[k];
    if (o.access == Access::kConcat) {
      s << "      {\n"
        << "        const Index row = i / kRow, at = i - row * kRow;\n"
        << "        const int part = unit_part[at / kUnit];\n"
        << "        raw" << k << "[u] = load16(part_data[part], " << half << ", row * part_width[part] + (at - part_start[part]));\n"
        << "      }\n";
    } else {
      s << "      raw" << k << "[u] = load16(args.in[" << o.slot << "], " << half << ", i);\n";
    }
  }
  s << "    }\n"
    << "#pragma unroll\n"
    << "    for (int u = 0; u < U; ++u) {\n"
    << "      const Index v = base + u * threads;\n"
    << "      if (v >= kVectors) break;\n"
    << "      const Index i = v * kV;\n";
  // Each operand as a step reads it: x<k>[j] (a vector) or x<k> (one value for the vector).
  std::vector<std::string> element;
  for (size_t k = 0; k < g.operands.size(); ++k) {
    const GeneratedOperand& o = g.operands[k];
    const std::string x = "x" + std::to_string(k);
    const std::string data = "args.in[" + std::to_string(o.slot) + "]";
    if (streamed[k]) {
      s << "      float " << x << "[kV];\n";
      s << "      unpack(raw" << k << "[u], " << half << ", " << x << ");\n";
      element.push_back(x + "[j]");
      continue;
    }
    switch (o.access) {
      case Access::kFull:
        s << "      float " << x << "[kV];\n      load_vector(" << data << ", " << storage(o) << ", i, " << x << ");\n";
        element.push_back(x + "[j]");
        break;
      case Access::kBlock:
        if (o.repeat == 1) {
          s << "      float " << x << "[kV];\n      load_vector(" << data << ", " << storage(o) << ", i % " << index(o.count) << ", " << x << ");\n";
          element.push_back(x + "[j]");
        } else {
          s << "      const float " << x << " = load_one(" << data << ", " << storage(o) << ", (i / " << index(o.repeat) << ") % "
            << index(o.count) << ");\n";
          element.push_back(x);
        }
        break;
      case Access::kScalar:
        if (o.value) s << "      const float " << x << " = " << float_literal(*o.value) << ";\n";
        else s << "      const float " << x << " = load_one(" << data << ", " << storage(o) << ", 0);\n";
        element.push_back(x);
        break;
      case Access::kStrided: {
        s << "      Index " << x << "_at = 0;\n      {\n        Index q = i;\n";
        for (size_t d = o.dims.size(); d-- > 0;) {
          const auto [size, stride] = o.dims[d];
          if (d > 0) s << "        " << x << "_at += (q % " << index(size) << ") * " << index(stride) << "; q /= " << index(size) << ";\n";
          else s << "        " << x << "_at += q * " << index(stride) << ";\n";
        }
        const int64_t last = o.dims.empty() ? 0 : o.dims.back().second;
        s << "      }\n      float " << x << "[kV];\n"
          << "#pragma unroll\n      for (int j = 0; j < kV; ++j) " << x << "[j] = load_one(" << data << ", " << storage(o) << ", " << x
          << "_at + j * " << index(last) << ");\n";
        element.push_back(x + "[j]");
        break;
      }
      case Access::kConcat: break;  // streamed
    }
  }
  const int steps = static_cast<int>(program.steps.size());
  auto value = [&](int reg) {
    if (reg < program.inputs) return element[static_cast<size_t>(reg)];
    return "s" + std::to_string(reg - program.inputs) + "[j]";
  };
  for (int t = 0; t < steps; ++t) s << "      float s" << t << "[kV];\n";
  s << "#pragma unroll\n      for (int j = 0; j < kV; ++j) {\n";
  for (int t = 0; t < steps; ++t) {
    const ir::ElementwiseStep& st = program.steps[static_cast<size_t>(t)];
    s << "        s" << t << "[j] = ";
    if (st.binary && rounded_intrinsic(st.binary_op)) {
      s << rounded_intrinsic(st.binary_op) << "(" << value(st.a) << ", " << value(st.b) << ")";
    } else if (st.binary) {
      s << "kiln::ir::elementwise_binary(kiln::ir::ElementwiseBinary::" << binary_name(st.binary_op) << ", " << value(st.a) << ", "
        << value(st.b) << ")";
    } else {
      const char* name = unary_name(st.unary_op);
      if (!name) return std::nullopt;
      s << "kiln::ir::unary_float<kiln::ir::UnaryOp::" << name << ">(" << value(st.a) << ", kiln::ir::UnaryParams{"
        << float_literal(st.params.alpha) << ", " << float_literal(st.params.beta) << "})";
    }
    s << ";\n";
  }
  s << "      }\n"
    << "      store_vector(args.out, " << half << ", i, s" << steps - 1 << ");\n"
    << "    }\n"
    << "  }\n"
    << "}\n\n"
    << "}  // namespace\n\n";
  for (int u : kGeneratedUnrolls)
    s << "extern \"C\" __global__ void __launch_bounds__(256) " << generated_kernel_name(u) << "(const __grid_constant__ Args args) {\n"
      << "  run<" << u << ">(args);\n}\n";
  return s.str();
}

}  // namespace kiln::cuda
