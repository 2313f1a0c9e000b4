// The CUDA C++ of one FusedElementwise group as straight-line code, for NVRTC to compile while
// the engine builds (cuda/runtime/runtime_compiler.h). The interpreter kernel
// (fused_elementwise.cu) decodes each step and operand at run time; the generated kernel has
// them written out, with every size (the element count, the blocks of broadcast operands, the
// concatenation's parts) and every scalar constant as a literal, so only the tensors' addresses
// travel at launch. Its steps call the float math of ir/float_math.h, and its Add, Sub and Mul
// steps the intrinsics that never fuse into an FMA with a neighbouring step (as the
// interpreter's steps never do), so it computes bit for bit what the interpreter does; the build
// checks that before it times one, and refuses it where not.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/fused_elementwise.h"

namespace kiln::cuda {

// How the generated kernel reads one input register of the program (the interpreter reads its
// operands by the same kinds of access).
struct GeneratedOperand {
  enum class Access : uint8_t { kFull, kBlock, kScalar, kStrided, kConcat };
  Access access = Access::kFull;
  bool float32 = false;  // stored as float32 (constants), else as the output is
  int slot = 0;          // its address in the launch's argument array (kConcat: the first part's)
  int64_t repeat = 1, count = 1;  // kBlock: element offset (i / repeat) % count
  // kStrided: (size, stride) of the output's dims in memory order, outermost first, merged.
  std::vector<std::pair<int64_t, int64_t>> dims;
  std::optional<float> value;  // kScalar of a constant: the value itself, written into the code
};

struct GeneratedConcat {
  int64_t row = 0;              // elements of one output row (the concatenated axis and after)
  std::vector<int64_t> width;   // elements of one row of each part; part k is in slot k
};

struct GeneratedElementwise {
  bool half = false;  // float16 storage (8 elements a vector), else float32 (4)
  int64_t n = 0;      // output elements, a multiple of the vector
  int slots = 0;      // the launch's addresses besides the output
  std::vector<GeneratedOperand> operands;  // one per input register of the program
  GeneratedConcat concat;                  // when the program has concat_parts
  std::string signature;                   // for the source's first line
};

// The unrolls generated per group (vectors each thread takes a pass) and their kernels' names.
inline constexpr int kGeneratedUnrolls[] = {1, 2, 4};
std::string generated_kernel_name(int unroll);

// The largest concatenation row (in units of the parts' widths' common divisor) a generated
// kernel looks parts up in: its table of which part each unit lies in sits in shared memory.
inline constexpr int64_t kMaxConcatUnits = 4096;

// The source of a group's kernels (one per unroll), or nullopt where the group has no generated
// kernel (a concatenation whose parts' table would be too large).
std::optional<std::string> fused_elementwise_source(const ir::ElementwiseProgram& program, const GeneratedElementwise& g);

}  // namespace kiln::cuda
