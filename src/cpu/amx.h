// AMX's tile registers (Sapphire Rapids and later), shared by the int8 and bfloat16 GEMMs.
//
// Both configure the eight tiles alike: every tile 16 rows of 64 bytes, which holds 16 x 16
// float32 or int32 sums, 16 rows of 64 int8 or 32 bfloat16 values of A, or 16 rows (steps of K)
// of B's 16 columns of 4 int8 or 2 bfloat16 values.
#pragma once

namespace kiln::cpu {

// Whether Linux lets this process use AMX's tile data (arch_prctl ARCH_REQ_XCOMP_PERM, Linux
// 5.16 and later), asked once for the process. The caller checks the CPU's CPUID bits.
bool amx_tile_data_permitted();

// While a thread computes tiles: the tile registers configured (when `active`), released after.
class AmxTileScope {
 public:
  explicit AmxTileScope(bool active);
  ~AmxTileScope();
  AmxTileScope(const AmxTileScope&) = delete;
  AmxTileScope& operator=(const AmxTileScope&) = delete;

 private:
  bool active_;
};

}  // namespace kiln::cpu
