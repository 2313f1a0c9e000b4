#include "compiler/profiles.h"

#include <algorithm>

namespace kiln::compiler {

namespace {

Error profile_error(size_t profile, const std::string& input, const std::string& what) {
  return Error(ErrorKind::kInvalidArgument, "optimization profile " + std::to_string(profile) + ", input '" + input + "': " + what);
}

// A dimension of 0 is allowed only where the model itself declares 0 (ONNX allows empty
// tensors, and onnx's own node tests feed some); elsewhere a profile's dimensions are at least 1.
bool dimension_too_small(int64_t given, int64_t declared) { return given < 1 && !(given == 0 && declared == 0); }

// Checks one shape (min, opt or max) against the declared one.
void check_shape(size_t profile, const TensorDesc& d, const char* which, const std::vector<int64_t>& shape) {
  if (shape.size() != d.shape.size())
    throw profile_error(profile, d.name, std::string(which) + " shape " + shape_to_string(shape) + " has rank " +
                                             std::to_string(shape.size()) + ", the input has rank " +
                                             std::to_string(d.shape.size()) + " (" + shape_to_string(d.shape) + ")");
  for (size_t i = 0; i < shape.size(); ++i) {
    if (dimension_too_small(shape[i], d.shape[i]))
      throw profile_error(profile, d.name, std::string(which) + " shape " + shape_to_string(shape) + ": dimension " +
                                               std::to_string(i) + " must be at least 1");
    if (d.shape[i] >= 0 && shape[i] != d.shape[i])
      throw profile_error(profile, d.name, std::string(which) + " shape " + shape_to_string(shape) + ": dimension " +
                                               std::to_string(i) + " is fixed at " + std::to_string(d.shape[i]) +
                                               " by the model (" + shape_to_string(d.shape) + ")");
  }
}

// "batch x 128": the declared dims, symbolic ones by name.
std::string describe_dims(const TensorDesc& d) {
  std::string out;
  for (size_t i = 0; i < d.shape.size(); ++i) {
    if (i) out += " x ";
    if (d.shape[i] >= 0) out += std::to_string(d.shape[i]);
    else out += i < d.dim_names.size() && !d.dim_names[i].empty() ? d.dim_names[i] : "?";
  }
  return out.empty() ? "a scalar" : out;
}

// "ids:1x16,mask:1x16": every input with its dynamic dims at 1, for hints.
std::string example_list(const std::vector<TensorDesc>& declared) {
  std::string out;
  for (const TensorDesc& d : declared) {
    if (!out.empty()) out += ",";
    out += d.name + ":";
    for (size_t i = 0; i < d.shape.size(); ++i) out += (i ? "x" : "") + std::to_string(d.shape[i] >= 0 ? d.shape[i] : 1);
  }
  return out;
}

bool has_input(const std::vector<TensorDesc>& declared, const std::string& name) {
  return std::any_of(declared.begin(), declared.end(), [&](const TensorDesc& d) { return d.name == name; });
}

}  // namespace

std::vector<OptimizationProfile> resolve_profiles(const std::vector<TensorDesc>& declared, const BuildOptions& options) {
  for (const auto& [name, shape] : options.input_shapes)
    if (!has_input(declared, name))
      throw Error(ErrorKind::kInvalidArgument, "the model has no input named '" + name + "' (given a fixed shape)");
  std::vector<OptimizationProfile> given = options.profiles;
  if (given.empty()) given.emplace_back();
  std::vector<OptimizationProfile> out;
  for (size_t p = 0; p < given.size(); ++p) {
    for (const auto& [name, range] : given[p])
      if (!has_input(declared, name))
        throw Error(ErrorKind::kInvalidArgument,
                    "optimization profile " + std::to_string(p) + " names input '" + name + "', which the model does not have");
    OptimizationProfile profile;
    for (const TensorDesc& d : declared) {
      auto r = given[p].find(d.name);
      auto fixed = options.input_shapes.find(d.name);
      ShapeRange range;
      if (r != given[p].end()) {
        if (fixed != options.input_shapes.end())
          throw profile_error(p, d.name, "given both a fixed shape " + shape_to_string(fixed->second) +
                                             " and a range; give one");
        range = r->second;
        check_shape(p, d, "min", range.min);
        check_shape(p, d, "opt", range.opt);
        check_shape(p, d, "max", range.max);
        for (size_t i = 0; i < range.min.size(); ++i)
          if (range.min[i] > range.opt[i] || range.opt[i] > range.max[i])
            throw profile_error(p, d.name, "dimension " + std::to_string(i) + " needs min <= opt <= max (min " +
                                               shape_to_string(range.min) + ", opt " + shape_to_string(range.opt) +
                                               ", max " + shape_to_string(range.max) + ")");
      } else {
        std::vector<int64_t> shape;
        if (fixed != options.input_shapes.end()) {
          shape = fixed->second;
          if (shape.size() != d.shape.size())
            throw Error(ErrorKind::kInvalidArgument, "input '" + d.name + "' has rank " + std::to_string(d.shape.size()) +
                                                         " (" + shape_to_string(d.shape) + "), the shape given is " +
                                                         shape_to_string(shape));
          for (size_t i = 0; i < shape.size(); ++i)
            if (dimension_too_small(shape[i], d.shape[i]) || (d.shape[i] >= 0 && shape[i] != d.shape[i]))
              throw Error(ErrorKind::kInvalidArgument, "input '" + d.name + "' is declared " + shape_to_string(d.shape) +
                                                           "; dimension " + std::to_string(i) + " cannot be " +
                                                           std::to_string(shape[i]));
        } else {
          // A profile the user gave covers every dynamic input: binding a left-out one to 1s
          // would build (and later run) shapes nobody asked for.
          const bool dynamic = std::any_of(d.shape.begin(), d.shape.end(), [](int64_t v) { return v < 0; });
          if (dynamic && !options.profiles.empty())
            throw profile_error(p, d.name, "no shape range given for this dynamic input (" + describe_dims(d) +
                                               "); a profile gives every dynamic input a range")
                .hint("name all inputs in each of --min-shapes, --opt-shapes and --max-shapes, e.g. --min-shapes " +
                      example_list(declared) + " (or give this input a fixed shape with --shapes)");
          for (int64_t v : d.shape) shape.push_back(v >= 0 ? v : 1);
        }
        range = ShapeRange{shape, shape, shape};
      }
      profile[d.name] = range;
    }
    out.push_back(std::move(profile));
  }
  return out;
}

std::vector<TensorDesc> profile_inputs(const std::vector<TensorDesc>& declared,
                                       const std::vector<OptimizationProfile>& profiles) {
  std::vector<TensorDesc> out = declared;
  for (TensorDesc& d : out) {
    for (size_t i = 0; i < d.shape.size(); ++i) {
      int64_t size = -2;  // unset
      for (const OptimizationProfile& p : profiles) {
        const ShapeRange& r = p.at(d.name);
        if (r.min[i] != r.max[i] || (size != -2 && size != r.min[i])) {
          size = -1;
          break;
        }
        size = r.min[i];
      }
      if (size != -2) d.shape[i] = size;
      if (size >= 0 && i < d.dim_names.size()) d.dim_names[i].clear();
    }
  }
  return out;
}

}  // namespace kiln::compiler
