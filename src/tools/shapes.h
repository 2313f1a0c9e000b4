// Binding a model's dynamic input dimensions to numbers, trtexec style:
//   --dim N=8                       every dimension named N is 8
//   --shapes input:1x3x224x224      the whole shape of one input
// and ranges of them (GPU optimization profiles):
//   --min-shapes input:1x3x224x224 --opt-shapes input:32x3x224x224 --max-shapes input:64x3x224x224
// Dimensions left unbound get a default (1) and the command says so.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::tools {

struct ShapeBindings {
  std::map<std::string, int64_t> dims;                   // symbol -> value
  std::map<std::string, std::vector<int64_t>> shapes;    // input name -> shape
  int64_t batch = -1;                                    // --batch: the first dim, if dynamic

  // Parses the option strings; throws kiln::Error (kInvalidArgument) on a malformed one.
  void add_dim_option(const std::string& text);     // "N=8"
  // "a:1x3x224x224,b:1x10"; `option` names the flag in error messages.
  void add_shapes_option(const std::string& text, const std::string& option = "--shapes");
};

// Optimization profiles from trtexec-style flags: the k-th occurrence of --min-shapes,
// --opt-shapes and --max-shapes makes profile k; each occurrence holds one or more words of
// comma-separated shapes ("a:1x3x224x224,b:1x10" or "a:1x3x224x224" "b:1x10"). --opt-shapes may
// be left out (opt = max). Throws kInvalidArgument when the counts differ, a profile names an
// input twice, or a profile's flags name different inputs.
using ProfileFlags = std::vector<std::vector<std::string>>;
std::vector<OptimizationProfile> parse_profiles(const ProfileFlags& min, const ProfileFlags& opt, const ProfileFlags& max);

// The concrete shape of one input. `shape` uses -1 for a dynamic dimension and `names` holds
// their symbols ("" when unnamed). Dynamic dimensions nobody bound become `fallback`; their
// descriptions ("N" or "input:1") are appended to `defaulted`. Throws kInvalidArgument when
// --shapes contradicts the model.
std::vector<int64_t> resolve_shape(const std::string& input, const std::vector<int64_t>& shape,
                                   const std::vector<std::string>& names, const ShapeBindings& bindings,
                                   int64_t fallback, std::vector<std::string>& defaulted);

// Throws kInvalidArgument naming a --shapes input or --dim symbol the model does not have.
void check_bindings_used(const ShapeBindings& bindings, const std::vector<std::string>& input_names,
                         const std::vector<std::string>& symbols);

}  // namespace kiln::tools
