// The engine file's header (engine_file.h has the layout; docs/engine-format.md every field):
// what an engine was built for and from, as JSON, written by Engine::save and read back, with
// each field checked, by Engine::load.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/types.h"

namespace kiln::engine_file {

struct Header {
  std::string kiln_version;
  std::string backend;         // "cpu" or "cuda"
  nlohmann::json device;       // the device identity the engine was built on
  BuildOptions options;        // precision, optimize, CPU fallback, timing step, INT8 scales, float layers
  std::string model_name;      // the model's file name, informative
  std::vector<TensorDesc> inputs, outputs;  // informative: loading derives them from the graph
  std::vector<OptimizationProfile> profiles;
  std::vector<std::string> kept_float;       // INT8/FP8: layers left in float, "name: why"
  std::map<std::string, std::string> tactics;  // timing-cache entries of the chosen tactics
};

nlohmann::json to_json(const Header& header);
// Throws kInvalidModel naming `path`: a file of another kiln version (first, with a hint to
// rebuild), an unknown backend, a missing or malformed field.
Header header_from_json(const nlohmann::json& json, const std::string& path);

}  // namespace kiln::engine_file
