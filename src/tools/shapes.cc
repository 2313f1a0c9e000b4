#include "tools/shapes.h"

#include <algorithm>
#include <charconv>

#include "kiln/error.h"

namespace kiln::tools {

namespace {

int64_t parse_size(const std::string& text, const std::string& option) {
  int64_t v = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0)
    throw Error(ErrorKind::kInvalidArgument, "'" + text + "' in " + option + " is not a non-negative integer");
  return v;
}

}  // namespace

void ShapeBindings::add_dim_option(const std::string& text) {
  size_t eq = text.rfind('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(ErrorKind::kInvalidArgument, "--dim '" + text + "' is not of the form NAME=VALUE").hint("e.g. --dim batch=8");
  dims[text.substr(0, eq)] = parse_size(text.substr(eq + 1), "--dim " + text);
}

void ShapeBindings::add_shapes_option(const std::string& text, const std::string& option) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    if (item.empty()) continue;
    // The name may itself contain ':' (e.g. "input:0" from TensorFlow exports): split at the last one.
    size_t colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw Error(ErrorKind::kInvalidArgument, option + " '" + item + "' is not of the form INPUT:DIMxDIMx...")
          .hint("e.g. " + option + " input:1x3x224x224");
    std::string dims_text = item.substr(colon + 1);
    std::vector<int64_t> shape;
    if (dims_text != "scalar") {
      size_t p = 0;
      while (p <= dims_text.size()) {
        size_t x = dims_text.find('x', p);
        shape.push_back(parse_size(dims_text.substr(p, x == std::string::npos ? std::string::npos : x - p), option + " " + item));
        p = x == std::string::npos ? dims_text.size() + 1 : x + 1;
      }
    }
    shapes[item.substr(0, colon)] = shape;
  }
}

std::vector<OptimizationProfile> parse_profiles(const ProfileFlags& min, const ProfileFlags& opt, const ProfileFlags& max) {
  if (min.size() != max.size() || (!opt.empty() && opt.size() != min.size()))
    throw Error(ErrorKind::kInvalidArgument, "each optimization profile needs --min-shapes and --max-shapes (and --opt-shapes, "
                                             "or none at all): got " + std::to_string(min.size()) + " --min-shapes, " +
                                             std::to_string(opt.size()) + " --opt-shapes, " + std::to_string(max.size()) +
                                             " --max-shapes")
        .hint("e.g. --min-shapes input:1x3x224x224 --opt-shapes input:32x3x224x224 --max-shapes input:64x3x224x224");
  std::vector<OptimizationProfile> out;
  for (size_t p = 0; p < min.size(); ++p) {
    // One profile's flag: every word's shapes, each input once.
    auto read = [p](const std::vector<std::string>& words, const std::string& option) {
      ShapeBindings all;
      for (const std::string& word : words) {
        ShapeBindings one;
        one.add_shapes_option(word, option);
        for (auto& [name, shape] : one.shapes)
          if (!all.shapes.emplace(name, std::move(shape)).second)
            throw Error(ErrorKind::kInvalidArgument, "optimization profile " + std::to_string(p) + ": " + option +
                                                         " gives input '" + name + "' twice");
      }
      return all;
    };
    ShapeBindings lo = read(min[p], "--min-shapes"), hi = read(max[p], "--max-shapes");
    ShapeBindings mid = opt.empty() ? hi : read(opt[p], "--opt-shapes");
    auto names = [](const ShapeBindings& b) {
      std::vector<std::string> n;
      for (const auto& [name, shape] : b.shapes) n.push_back(name);
      return n;
    };
    if (names(lo) != names(hi) || names(mid) != names(hi))
      throw Error(ErrorKind::kInvalidArgument, "optimization profile " + std::to_string(p) +
                                                   ": --min-shapes, --opt-shapes and --max-shapes must name the same inputs");
    OptimizationProfile profile;
    for (const auto& [name, shape] : hi.shapes) profile[name] = ShapeRange{lo.shapes.at(name), mid.shapes.at(name), shape};
    out.push_back(std::move(profile));
  }
  return out;
}

std::vector<int64_t> resolve_shape(const std::string& input, const std::vector<int64_t>& shape,
                                   const std::vector<std::string>& names, const ShapeBindings& b,
                                   int64_t fallback, std::vector<std::string>& defaulted) {
  auto it = b.shapes.find(input);
  if (it != b.shapes.end()) {
    const std::vector<int64_t>& given = it->second;
    if (given.size() != shape.size())
      throw Error(ErrorKind::kInvalidArgument, "--shapes gives input '" + input + "' rank " + std::to_string(given.size()) +
                                                   " but the model declares rank " + std::to_string(shape.size()));
    for (size_t i = 0; i < shape.size(); ++i)
      if (shape[i] >= 0 && shape[i] != given[i])
        throw Error(ErrorKind::kInvalidArgument, "--shapes gives input '" + input + "' dimension " + std::to_string(i) + " = " +
                                                     std::to_string(given[i]) + " but the model fixes it to " + std::to_string(shape[i]));
    return given;
  }
  std::vector<int64_t> out = shape;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] >= 0) continue;
    const std::string name = i < names.size() ? names[i] : "";
    auto d = name.empty() ? b.dims.end() : b.dims.find(name);
    if (d != b.dims.end()) {
      out[i] = d->second;
    } else if (i == 0 && b.batch >= 0) {
      out[i] = b.batch;
    } else {
      out[i] = fallback;
      std::string what = name.empty() ? input + "[" + std::to_string(i) + "]" : name;
      if (std::find(defaulted.begin(), defaulted.end(), what) == defaulted.end()) defaulted.push_back(what);
    }
  }
  return out;
}

void check_bindings_used(const ShapeBindings& b, const std::vector<std::string>& input_names,
                         const std::vector<std::string>& symbols) {
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? std::string("(none)") : s;
  };
  for (const auto& [name, shape] : b.shapes)
    if (std::find(input_names.begin(), input_names.end(), name) == input_names.end())
      throw Error(ErrorKind::kInvalidArgument, "--shapes names '" + name + "', which is not an input of the model")
          .hint("its inputs are: " + join(input_names));
  for (const auto& [name, value] : b.dims)
    if (std::find(symbols.begin(), symbols.end(), name) == symbols.end())
      throw Error(ErrorKind::kInvalidArgument, "--dim names '" + name + "', which is not a dimension of any model input")
          .hint("its dynamic dimensions are: " + join(symbols));
}

}  // namespace kiln::tools
