#include "cpu/amx.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace kiln::cpu {

namespace {

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

constexpr TileConfig amx_tile_config() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  return config;
}

// In static storage: GCC 12 does not see that ldtilecfg reads its operand, and dropped the
// stores of a configuration built on the stack.
alignas(64) constexpr TileConfig kAmxTileConfig = amx_tile_config();

__attribute__((target("amx-tile"))) void amx_configure() { _tile_loadconfig(&kAmxTileConfig); }

__attribute__((target("amx-tile"))) void amx_release() { _tile_release(); }

}  // namespace

bool amx_tile_data_permitted() {
  static const bool permitted = [] {
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return permitted;
}

AmxTileScope::AmxTileScope(bool active) : active_(active) {
  if (active_) amx_configure();
}

AmxTileScope::~AmxTileScope() {
  if (active_) amx_release();
}

}  // namespace kiln::cpu
