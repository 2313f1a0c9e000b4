// The engine over optimization profiles: one plan per input shape, built from the graph
// specialized to that shape. The profiles' opt, min and max shapes and a geometric ladder between
// them are planned (and their tactics timed) when the engine is built; any other shape within a
// profile is planned on first use, each layer starting from the tactic it took in the timed plan
// nearest in size.
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cuda/runtime/check.h"
#include "cuda/runtime/engine.h"
#include "cuda/runtime/timing_cache.h"

namespace kiln::cuda {

std::string device_signature(const cudaDeviceProp& prop);
std::unique_ptr<ShapePlan> build_plan(std::shared_ptr<const ir::Graph> graph, const Shapes& shapes, const Values& values,
                                      const BuildConfig& config, TimingCache& cache, WeightMemory& weights,
                                      const std::map<std::string, std::string>* hints, const CudnnSource& cudnn);

std::string shapes_key(const Shapes& shapes) {
  std::string key;
  for (const auto& [name, shape] : shapes) {
    if (!key.empty()) key += ";";
    key += name + "=" + shape_to_string(shape);
  }
  return key;
}

namespace {

// The elements of a value input, exactly: integers as written, floating point to every digit,
// other dtypes as their bytes in hex.
std::string value_text(const Tensor& t) {
  std::string out = "[";
  char buf[32];
  const auto* bytes = static_cast<const unsigned char*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (i) out += ",";
    switch (t.dtype()) {
      case DType::kInt64: out += std::to_string(t.data<int64_t>()[i]); break;
      case DType::kInt32: out += std::to_string(t.data<int32_t>()[i]); break;
      case DType::kFloat32: std::snprintf(buf, sizeof buf, "%.9g", t.data<float>()[i]); out += buf; break;
      case DType::kFloat64: std::snprintf(buf, sizeof buf, "%.17g", t.data<double>()[i]); out += buf; break;
      default: {
        const size_t size = element_size(t.dtype());
        for (size_t b = 0; b < size; ++b) {
          std::snprintf(buf, sizeof buf, "%02x", bytes[static_cast<size_t>(i) * size + b]);
          out += buf;
        }
      }
    }
  }
  return out + "]";
}

}  // namespace

std::string binding_key(const Shapes& shapes, const Values& values) {
  std::string key = shapes_key(shapes);
  for (const auto& [name, tensor] : values) key += ";" + name + ":=" + value_text(tensor);
  return key;
}

namespace {

Shapes pick(const std::map<std::string, ShapeRange>& inputs, std::vector<int64_t> ShapeRange::*which) {
  Shapes out;
  for (const auto& [name, range] : inputs) out[name] = range.*which;
  return out;
}

// log(elements) summed over inputs: plans are matched by how much work they do.
double log_size(const Shapes& shapes) {
  double s = 0;
  for (const auto& [name, shape] : shapes) s += std::log(static_cast<double>(std::max<int64_t>(shape_numel(shape), 1)));
  return s;
}

}  // namespace

std::vector<Shapes> timed_shapes(const Profile& profile, double step) {
  std::vector<Shapes> out;
  auto add = [&](const Shapes& s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  };
  add(profile.opt());
  add(profile.min());
  add(profile.max());
  if (!(step > 1)) return out;
  // Between a and b: n - 1 shapes at fractions k/n of the way (in log space), n chosen so that
  // neighbours differ by about `step` in elements.
  auto ladder = [&](const Shapes& a, const Shapes& b) {
    const double span = std::abs(log_size(b) - log_size(a));
    const int n = static_cast<int>(std::ceil(span / std::log(step) - 1e-9));
    for (int k = 1; k < n; ++k) {
      const double t = static_cast<double>(k) / n;
      Shapes s = a;
      for (auto& [name, shape] : s)
        for (size_t d = 0; d < shape.size(); ++d) {
          const double lo = static_cast<double>(a.at(name)[d]), hi = static_cast<double>(b.at(name)[d]);
          shape[d] = std::llround(std::exp(std::log(lo) + t * (std::log(hi) - std::log(lo))));
        }
      add(s);
    }
  };
  ladder(profile.min(), profile.opt());
  ladder(profile.opt(), profile.max());
  return out;
}

Shapes Profile::min() const { return pick(inputs, &ShapeRange::min); }
Shapes Profile::opt() const { return pick(inputs, &ShapeRange::opt); }
Shapes Profile::max() const { return pick(inputs, &ShapeRange::max); }

std::string Profile::mismatch(const Shapes& shapes) const {
  for (const auto& [name, range] : inputs) {
    auto it = shapes.find(name);
    if (it == shapes.end()) return "input '" + name + "' has no shape";
    const std::vector<int64_t>& s = it->second;
    if (s.size() != range.min.size())
      return "input '" + name + "' has rank " + std::to_string(range.min.size()) + ", not " + std::to_string(s.size()) +
             " (" + shape_to_string(s) + ")";
    for (size_t d = 0; d < s.size(); ++d) {
      if (s[d] < range.min[d])
        return "input '" + name + "': dimension " + std::to_string(d) + " is " + std::to_string(s[d]) +
               ", below the profile's min " + std::to_string(range.min[d]) + " (min " + shape_to_string(range.min) +
               ", max " + shape_to_string(range.max) + ")";
      if (s[d] > range.max[d])
        return "input '" + name + "': dimension " + std::to_string(d) + " is " + std::to_string(s[d]) +
               ", above the profile's max " + std::to_string(range.max[d]) + " (min " + shape_to_string(range.min) +
               ", max " + shape_to_string(range.max) + ")";
    }
  }
  for (const auto& [name, shape] : shapes)
    if (!inputs.count(name)) return "the engine has no input named '" + name + "'";
  return "";
}

CudaEngine::~CudaEngine() = default;

std::unique_ptr<CudaEngine> CudaEngine::build(Specializer specialize, const BuildConfig& config) {
  if (config.profiles.empty()) throw Error(ErrorKind::kInternal, "a GPU engine needs at least one optimization profile");
  std::unique_ptr<CudaEngine> e(new CudaEngine());
  e->specialize_ = std::move(specialize);
  e->config_ = config;
  e->profiles_ = config.profiles;
  e->precision_ = config.precision;
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  check_gpu_architecture(prop);
  e->device_name_ = prop.name;
  // Tactics chosen under other tactic options are not the default build's: a cache written
  // under them carries them in its device line, so neither build reads the other's.
  const std::string tactics = config.tactics.describe();
  e->cache_ = std::make_unique<TimingCache>(device_signature(prop) + (tactics.empty() ? "" : " tactics " + tactics));
  if (!config.timing_cache_path.empty()) {
    std::string note = e->cache_->load(config.timing_cache_path);
    if (!note.empty() && config.log) config.log(note);
  }
  for (const auto& [key, tactic] : config.timing_entries) e->cache_->set(key, tactic);

  // The timed plans: each profile's opt shape first (the one TensorRT's users expect tactics
  // from), then its min and max, then shapes between them, so that any shape in the profile
  // starts from tactics timed near it.
  const size_t n = e->profiles_.size();
  for (size_t p = 0; p < n; ++p) {
    const Profile& profile = e->profiles_[p];
    const std::vector<Shapes> timed = timed_shapes(profile, config.timed_shape_step);
    for (size_t i = 0; i < timed.size(); ++i) {
      const std::string key = binding_key(timed[i], config.input_values);
      if (e->pinned_.count(key)) continue;
      if (config.log)
        config.log("profile " + std::to_string(p) + (n > 1 ? " of " + std::to_string(n) : "") + ": planning " + key +
                   " (" + std::to_string(i + 1) + "/" + std::to_string(timed.size()) + ")");
      e->pinned_[key] = e->build_plan(timed[i], config.input_values, nullptr, e->config_);
    }
    e->opt_plans_.push_back(e->pinned_.at(binding_key(profile.opt(), config.input_values)));
    e->max_plans_.push_back(e->pinned_.at(binding_key(profile.max(), config.input_values)));
  }

  // Inputs and outputs, sized for the largest shape of any profile.
  const ShapePlan& first = *e->opt_plans_.front();
  for (const EngineIO& in : first.inputs()) e->io_.push_back(IoSlot{in.name, in.dtype, true, 0});
  for (const EngineIO& out : first.outputs()) e->io_.push_back(IoSlot{out.name, out.dtype, false, 0});
  for (const auto& [name, tensor] : config.input_values) e->io_.push_back(IoSlot{name, tensor.dtype(), true, tensor.nbytes()});
  for (const auto& [key, plan] : e->pinned_) {
    size_t i = 0;
    for (const auto* list : {&plan->inputs(), &plan->outputs()})
      for (const EngineIO& x : *list) {
        if (i >= e->io_.size() || e->io_[i].name != x.name)
          throw Error(ErrorKind::kInternal, "the plans at " + key + " and " + shapes_key(first.shapes()) +
                                                " disagree on the engine's inputs and outputs");
        e->io_[i].capacity = std::max(e->io_[i].capacity, plan->buffers()[x.buffer].spec.bytes());
        ++i;
      }
  }
  if (!config.timing_cache_path.empty()) e->cache_->save(config.timing_cache_path);
  return e;
}

std::shared_ptr<const ShapePlan> CudaEngine::build_plan(const Shapes& shapes, const Values& values,
                                                   const std::map<std::string, std::string>* hints,
                                                   const BuildConfig& config, std::shared_ptr<const ir::Graph> graph,
                                                   const CudnnSource& cudnn) const {
  if (!graph) graph = std::make_shared<const ir::Graph>(specialize_(shapes, values));
  std::shared_ptr<const ShapePlan> plan =
      cuda::build_plan(std::move(graph), shapes, values, config, *cache_, weights_, hints, cudnn);
  arena_bytes_ = std::max(arena_bytes_, plan->arena_bytes());
  workspace_bytes_ = std::max(workspace_bytes_, plan->workspace_bytes());
  return plan;
}

int CudaEngine::io_index(const std::string& name, bool is_input) const {
  for (size_t i = 0; i < io_.size(); ++i)
    if (io_[i].name == name && io_[i].is_input == is_input) return static_cast<int>(i);
  throw Error(ErrorKind::kInvalidArgument, std::string("the engine has no ") + (is_input ? "input" : "output") +
                                               " named '" + name + "'");
}

std::shared_ptr<const ShapePlan> CudaEngine::plan(const Shapes& shapes, const Values& values) const {
  const std::string key = binding_key(shapes, values);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = pinned_.find(key); it != pinned_.end()) return it->second;
  auto touch = [&] {
    cached_order_.erase(std::remove(cached_order_.begin(), cached_order_.end(), key), cached_order_.end());
    cached_order_.push_back(key);
  };
  if (auto it = cached_.find(key); it != cached_.end()) {
    touch();
    return it->second;
  }
  // The timed plan nearest in size gives each layer its starting tactic.
  const double size = log_size(shapes);
  const ShapePlan* nearest = nullptr;
  double best = 0;
  for (const auto& [k, p] : pinned_) {
    const double d = std::abs(log_size(p->shapes()) - size);
    if (!nearest || d < best) nearest = p.get(), best = d;
  }
  // The engine's log belongs to the build; plans made while running stay quiet.
  BuildConfig quiet = config_;
  quiet.log = nullptr;
  std::shared_ptr<const ShapePlan> plan = build_plan(shapes, values, nearest ? &nearest->node_tactics() : nullptr, quiet);
  cached_[key] = plan;
  touch();
  while (cached_order_.size() > config_.max_cached_plans) {
    cached_.erase(cached_order_.front());  // contexts holding it keep it alive
    cached_order_.erase(cached_order_.begin());
  }
  return plan;
}

std::shared_ptr<const ShapePlan> CudaEngine::context_plan(const Shapes& shapes, const Values& values,
                                                      const CudnnSource& cudnn) const {
  std::shared_ptr<const ShapePlan> shared = plan(shapes, values);
  std::lock_guard<std::mutex> lock(mutex_);
  BuildConfig quiet = config_;
  quiet.log = nullptr;
  return build_plan(shapes, values, &shared->node_tactics(), quiet, shared->graph(), cudnn);
}

std::shared_ptr<const ShapePlan> CudaEngine::opt_plan(int profile) const { return opt_plans_.at(static_cast<size_t>(profile)); }
std::shared_ptr<const ShapePlan> CudaEngine::max_plan(int profile) const { return max_plans_.at(static_cast<size_t>(profile)); }

size_t CudaEngine::weight_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return weights_.bytes();
}

size_t CudaEngine::weight_held_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return weights_.held_bytes();
}

size_t CudaEngine::arena_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return arena_bytes_;
}

size_t CudaEngine::workspace_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return workspace_bytes_;
}

size_t CudaEngine::plan_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pinned_.size() + cached_.size();
}

std::map<std::string, std::string> CudaEngine::timing_entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, std::string> out;
  for (const auto* plans : {&pinned_, &cached_})
    for (const auto& [key, plan] : *plans) out.insert(plan->timing_entries().begin(), plan->timing_entries().end());
  return out;
}

}  // namespace kiln::cuda
