// kiln bench: times an engine in the manner of trtexec. For each batch size: build the engine
// for it (or set a dynamic engine's input shapes: an engine file, or a build with a profile),
// warm up, then time runs. Two modes:
//   latency (the default): CUDA events around each run (the engine's CUDA graph replay,
//     optionally with the host<->device copies), synchronizing after each, as the PyTorch peers
//     in bench/ are timed; throughput = batch / median latency.
//   throughput (--throughput, or --streams N): N contexts, each on a stream of its own, runs
//     enqueued ahead (two in flight per stream) as trtexec does; throughput = runs * batch over
//     the wall clock. Each run's events still give its host latency (copies included) and GPU
//     compute time.
// Reports latency statistics, throughput, GPU memory and engine size; --profile adds time per
// layer; --json writes everything (docs/bench.md).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <utility>

#include "compiler/data_dependent_split.h"
#include "tools/commands.h"
#include "tools/engine_options.h"
#include "tools/input_files.h"
#include "tools/json_output.h"
#include "tools/random_inputs.h"
#include "tools/shapes.h"

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/runtime/check.h"
#include "cuda/runtime/device_scope.h"
#endif

namespace kiln::tools {

namespace {

struct BenchOptions {
  std::string model;
  EngineOptions engine;
  std::string batches;  // "1,8,128"
  int warmup = 20;
  int iterations = 0;   // 0: by batch size (200, or 50 for batches >= 64) unless --duration
  double duration_s = 0;
  bool with_transfers = false;
  bool no_graph = false;
  bool profile = false;
  std::string json;
  uint64_t seed = 0;
  std::vector<std::string> input_files;  // --input NAME=FILE
  std::map<std::string, Tensor> given_inputs;  // read from input_files (their shapes join engine.shapes)
  // trtexec's: warm up for this many milliseconds (besides --warmup runs); report each sample as
  // the mean of this many consecutive runs; write per-run times, the layers, the profile.
  double warmup_ms = 0;
  int avg_runs = 1;
  bool use_cuda_graph = false, no_data_transfers = false;  // kiln's defaults, accepted as trtexec spells them
  std::string export_times, export_layer_info, export_profile;
  std::string save_engine;  // trtexec's --saveEngine: the engine built here, written to this file
  // Throughput mode: runs enqueued ahead on `streams` contexts, each on its own stream.
  bool throughput = false;
  int streams = 1;
  bool pipelined() const { return throughput || streams > 1; }
};

// Runs a stream keeps enqueued at once in throughput mode: one running, the next queued behind
// it, so the GPU never waits for the host between two runs.
constexpr int kRunsInFlight = 2;

// trtexec's --saveEngine: one engine built from an ONNX model, written before it is timed.
void check_save_engine(const BenchOptions& o, size_t batches) {
  if (o.save_engine.empty()) return;
  if (is_engine_file(o.model))
    throw Error(ErrorKind::kInvalidArgument, "--saveEngine writes the engine bench builds from an ONNX model; '" + o.model +
                                                 "' is an engine file already");
  if (batches > 1 && !o.engine.has_profiles())
    throw Error(ErrorKind::kInvalidArgument, "--saveEngine writes one engine, and " + std::to_string(batches) +
                                                 " batch sizes build one each")
        .hint("give one batch size, or a profile (--minShapes/--optShapes/--maxShapes) for one engine that runs them all");
}

void save_built_engine(const BenchOptions& o, const Engine& engine) {
  if (o.save_engine.empty()) return;
  engine.save(o.save_engine);
  std::cout << "saved the engine to " << o.save_engine << "\n";
}

// trtexec's --avgRuns: each sample the mean of `n` consecutive runs.
std::vector<double> averaged(const std::vector<double>& times, int n) {
  if (n <= 1) return times;
  std::vector<double> out;
  for (size_t i = 0; i + static_cast<size_t>(n) <= times.size(); i += static_cast<size_t>(n))
    out.push_back(std::accumulate(times.begin() + static_cast<std::ptrdiff_t>(i), times.begin() + static_cast<std::ptrdiff_t>(i) + n, 0.0) / n);
  return out.empty() ? times : out;
}

// Untimed runs: `count` of them, then more until `ms` milliseconds have passed.
template <class Run>
void warm_up(const BenchOptions& o, int count, Run run) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) run();
  while (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() < o.warmup_ms) run();
}

struct Stats {
  double min = 0, mean = 0, median = 0, p90 = 0, p95 = 0, p99 = 0, max = 0, stddev = 0;
};

Stats statistics(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) { return v[static_cast<size_t>(std::lround(p * static_cast<double>(v.size() - 1)))]; };
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.p90 = pct(0.90);
  s.p95 = pct(0.95);
  s.p99 = pct(0.99);
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - s.mean) * (x - s.mean);
  s.stddev = std::sqrt(sq / static_cast<double>(v.size()));
  return s;
}

nlohmann::json stats_json(const Stats& s) {
  return {{"min", s.min}, {"mean", s.mean}, {"median", s.median}, {"p90", s.p90}, {"p95", s.p95},
          {"p99", s.p99}, {"max", s.max}, {"stddev", s.stddev}};
}

nlohmann::json layers_json(const std::vector<LayerInfo>& layers) {
  nlohmann::json out = nlohmann::json::array();
  for (const LayerInfo& l : layers) {
    out.push_back({{"name", l.name}, {"op", l.op}, {"tactic", l.tactic}, {"precision", l.precision}, {"shape", l.shape},
                   {"flops", l.flops}, {"cpu_fallback", l.cpu_fallback}});
    if (!l.members.empty()) out.back()["members"] = l.members;
  }
  return out;
}

std::vector<int64_t> parse_batches(const std::string& text) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size() && !text.empty()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v <= 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw Error(ErrorKind::kInvalidArgument, "--batches takes positive integers separated by commas, not '" + text + "'");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// Median time per layer over kProfileRuns profiled runs (`profile_once` runs and times one):
// prints the total and the slowest layers with their FLOP rate and bandwidth (as a fraction of
// `peak_bytes_per_s` where that is known), returns the "profile" JSON (docs/bench.md).
constexpr int kProfileRuns = 10;
nlohmann::json profile_summary(const std::function<std::vector<LayerTiming>()>& profile_once,
                               const std::vector<LayerInfo>& layer_info, const std::string& how,
                               double peak_bytes_per_s = 0) {
  std::vector<std::vector<double>> per_layer;
  std::vector<LayerTiming> first_profile;
  for (int i = 0; i < kProfileRuns; ++i) {
    std::vector<LayerTiming> t = profile_once();
    if (per_layer.empty()) {
      per_layer.resize(t.size());
      first_profile = t;
    }
    for (size_t l = 0; l < t.size() && l < per_layer.size(); ++l) per_layer[l].push_back(t[l].ms);
  }
  nlohmann::json layers = nlohmann::json::array();
  double total_ms = 0;
  std::vector<std::pair<double, size_t>> order;
  for (size_t l = 0; l < per_layer.size(); ++l) {
    Stats ls = statistics(per_layer[l]);
    total_ms += ls.median;
    order.push_back({ls.median, l});
    const double flops = first_profile[l].flops > 0 ? first_profile[l].flops : l < layer_info.size() ? layer_info[l].flops : 0.0;
    const double bytes = first_profile[l].bytes;
    nlohmann::json layer = {{"name", first_profile[l].name}, {"op", first_profile[l].op},
                            {"tactic", first_profile[l].tactic}, {"median_ms", ls.median}, {"flops", flops},
                            {"bytes", bytes}};
    if (bytes > 0 && ls.median > 0) {
      layer["bytes_per_s"] = bytes / ls.median * 1e3;
      if (peak_bytes_per_s > 0) layer["bandwidth_fraction"] = bytes / ls.median * 1e3 / peak_bytes_per_s;
    }
    layers.push_back(std::move(layer));
  }
  std::sort(order.rbegin(), order.rend());
  std::cout << fmt::format("  profile (median of {} runs, {}): {:.4f} ms total{}\n", kProfileRuns, how, total_ms,
                           peak_bytes_per_s > 0 ? fmt::format("; device memory {:.0f} GB/s", peak_bytes_per_s / 1e9) : "");
  for (size_t i = 0; i < std::min<size_t>(order.size(), 25); ++i) {
    const auto& l = first_profile[order[i].second];
    const nlohmann::json& layer = layers[order[i].second];
    const double flops = layer["flops"].get<double>();
    std::string rate = flops > 0 && order[i].first > 0 ? fmt::format("  {:.1f} GFLOP/s", flops / order[i].first / 1e6) : "";
    if (layer.contains("bytes_per_s")) {
      rate += fmt::format("  {:.1f} GB/s", layer["bytes_per_s"].get<double>() / 1e9);
      if (layer.contains("bandwidth_fraction")) rate += fmt::format(" ({:.0f}%)", 100.0 * layer["bandwidth_fraction"].get<double>());
    }
    std::cout << fmt::format("    {:>8.4f} ms {:>5.1f}%  {:<18} {:<40} {}{}\n", order[i].first,
                             total_ms > 0 ? 100.0 * order[i].first / total_ms : 0.0, l.op, l.name.substr(0, 40), l.tactic,
                             rate);
  }
  return {{"total_ms", total_ms}, {"layers", layers}};
}

// The data an input is fed: its --input file (converted to the input's dtype; its shape must be
// `shape`), else random.
Tensor input_data(const BenchOptions& o, const TensorDesc& desc, const std::vector<int64_t>& shape, std::mt19937_64& rng) {
  auto given = o.given_inputs.find(desc.name);
  if (given == o.given_inputs.end()) return random_input(desc, shape, rng);
  if (given->second.shape() != shape)
    throw Error(ErrorKind::kInvalidArgument, "--input " + desc.name + ": the file holds [" + shape_to_string(given->second.shape()) +
                                                 "], but the engine runs the input at [" + shape_to_string(shape) + "]");
  return given->second.dtype() == desc.dtype ? given->second : cast_input(given->second, desc.dtype, desc.name);
}

// Every --input names an input of the engine; a note for each file converted to its input's dtype.
void check_given_inputs(const BenchOptions& o, const Engine& engine) {
  for (const auto& given : o.given_inputs) {
    const std::string& name = given.first;
    const Tensor& t = given.second;
    auto d = std::find_if(engine.inputs().begin(), engine.inputs().end(), [&](const TensorDesc& in) { return in.name == name; });
    if (d == engine.inputs().end()) {
      std::vector<std::string> names;
      for (const TensorDesc& in : engine.inputs()) names.push_back(in.name);
      throw Error(ErrorKind::kInvalidArgument, "--input " + name + ": the engine has no input named '" + name + "'")
          .hint("its inputs are: " + name_list(names));
    }
    if (d->dtype != t.dtype())
      std::cout << fmt::format("note: input '{}' converted from {} to {}\n", name, to_string(t.dtype()), to_string(d->dtype));
  }
}

// Engine::run timed by the wall clock: the CPU engine, and GPU engines whose last nodes run on the
// CPU engine after data-dependent shapes (their outputs exist only once run() returns). Dynamic
// first dimensions take the batch size; other dynamic dimensions take --dim / --shapes.
nlohmann::json time_engine_runs(const BenchOptions& o, const Engine& engine, double build_s, int64_t batch,
                                const std::map<std::string, std::vector<int64_t>>& input_shapes) {
  check_given_inputs(o, engine);
  std::mt19937_64 rng(o.seed);
  std::map<std::string, Tensor> inputs;
  for (TensorDesc d : engine.inputs()) {
    if (auto given = input_shapes.find(d.name); given != input_shapes.end()) d.shape = given->second;
    for (size_t i = 0; i < d.shape.size(); ++i)
      if (d.shape[i] < 0) {
        if (i != 0)
          throw Error(ErrorKind::kInvalidArgument, "input '" + d.name + "' has a dynamic dimension " + std::to_string(i) +
                                                       "; give its size with --dim NAME=SIZE or --shapes");
        d.shape[i] = batch > 0 ? batch : 1;
      }
    inputs.emplace(d.name, input_data(o, d, d.shape, rng));
  }
  const int64_t items = inputs.empty() || inputs.begin()->second.rank() == 0 ? 1 : inputs.at(engine.inputs()[0].name).dim(0);
  auto iteration = [&]() {
    auto start = std::chrono::steady_clock::now();
    engine.run(inputs);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  warm_up(o, o.warmup, iteration);
  std::vector<double> times;
  const int iters = (o.iterations > 0 ? o.iterations : (items >= 64 ? 10 : 50)) * std::max(o.avg_runs, 1);
  auto bench_start = std::chrono::steady_clock::now();
  while (true) {
    times.push_back(iteration());
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - bench_start).count();
    if (o.duration_s > 0 ? (elapsed >= o.duration_s && times.size() >= 10) : static_cast<int>(times.size()) >= iters) break;
  }
  const Stats s = statistics(averaged(times, o.avg_runs));
  const EngineInfo info = engine.info();
  std::cout << fmt::format("batch {:>4}  {} {}: median {:.4f} ms  mean {:.4f}  min {:.4f}  p90 {:.4f}  p99 {:.4f}  max {:.4f}  "
                           "| {:.1f} items/s | build {:.1f} s\n",
                           items, engine.backend(), info.precision, s.median, s.mean, s.min, s.p90, s.p99, s.max,
                           1000.0 * static_cast<double>(items) / s.median, build_s);
  nlohmann::json profile;
  if (o.profile && engine.backend() == "cpu")
    profile = profile_summary([&] { return engine.profile(inputs); }, info.layers, "layer by layer, wall clock");
  nlohmann::json r = {{"batch", items},
          {"precision", info.precision},
          {"device", engine.backend()},
          {"layers", info.layers.size()},
          {"build_s", build_s},
          {"iterations", times.size()},
          {"warmup", o.warmup},
          {"latency_ms", stats_json(s)},
          {"throughput_per_s", 1000.0 * static_cast<double>(items) / s.median},
          {"throughput_mean_per_s", 1000.0 * static_cast<double>(items) / s.mean},
          {"int8_kept_float", info.int8_kept_float},
          {"times_ms", times},
          {"layer_info", layers_json(info.layers)}};
  if (o.profile && engine.backend() == "cpu") r["profile"] = std::move(profile);
  if (!info.data_dependent_nodes.empty()) {
    r["data_dependent_nodes"] = info.data_dependent_nodes;
    r["mode"] = "run";
  }
  return r;
}

// The CPU engine, built from the model or loaded from its engine file.
nlohmann::json bench_cpu_one(const BenchOptions& o, int64_t batch) {
  std::vector<std::string> defaulted;
  EngineOptions eo = o.engine;
  if (batch > 0) eo.batch = batch;
  const bool engine_file = is_engine_file(o.model);
  const BuildOptions build = engine_file ? BuildOptions{} : eo.build_options(o.model, defaulted);
  auto t0 = std::chrono::steady_clock::now();
  Engine engine = engine_file ? Engine::load(o.model, o.engine.load_options()) : Engine::from_onnx(o.model, build);
  const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  save_built_engine(o, engine);
  return time_engine_runs(o, engine, build_s, batch, build.input_shapes);
}

#if KILN_WITH_CUDA
// Opens the engine a GPU bench runs: the engine file, or the model built with the options (at
// `batch` for a static build; batch <= 0: as the options say).
Engine open_gpu_engine(const BenchOptions& o, int64_t batch, double& build_s, size_t& engine_file_bytes) {
  std::vector<std::string> defaulted;
  EngineOptions eo = o.engine;
  if (batch > 0) eo.batch = batch;
  auto t0 = std::chrono::steady_clock::now();
  std::optional<Engine> engine;
  if (is_engine_file(o.model)) {
    engine.emplace(Engine::load(o.model, o.engine.load_options()));
    engine_file_bytes = std::filesystem::file_size(o.model);
  } else {
    engine.emplace(Engine::from_onnx(o.model, eo.build_options(o.model, defaulted)));
  }
  build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  save_built_engine(o, *engine);
  return std::move(*engine);
}

// Sets the context's inputs to the profile's opt shapes, then to what --shapes and --dim give
// (an engine file runs any shape in its profile), then to `batch` in the first dimension where
// the engine lets it vary (batch <= 0: no change). Throws naming the input when a shape lies
// outside the profile (or the engine has fixed shapes), or names an input the engine lacks.
// `engine_file`: the engine was loaded, not built here; a --dim naming none of its dynamic
// dimensions is then a mistake (a build here uses --dim for the inputs it fixes).
void set_input_shapes(const Engine& engine, Context& context, int64_t batch, const EngineOptions& options, bool engine_file) {
  context.set_optimization_profile(context.optimization_profile());  // opt shapes
  ShapeBindings given;
  for (const std::string& d : options.dims) given.add_dim_option(d);
  for (const std::string& s : options.shapes) given.add_shapes_option(s);
  for (const auto& [name, shape] : given.shapes) {
    (void)shape;
    if (std::none_of(engine.inputs().begin(), engine.inputs().end(), [&](const TensorDesc& d) { return d.name == name; }))
      throw Error(ErrorKind::kInvalidArgument, "--shapes names input '" + name + "', which the engine does not have");
  }
  std::set<std::string> used_dims;
  for (const TensorDesc& d : engine.inputs()) {
    std::vector<int64_t> shape = context.input_shape(d.name);
    if (auto it = given.shapes.find(d.name); it != given.shapes.end()) {
      shape = it->second;
    } else {
      for (size_t i = 0; i < shape.size() && i < d.dim_names.size(); ++i)
        if (auto dim = given.dims.find(d.dim_names[i]); !d.dim_names[i].empty() && dim != given.dims.end()) {
          shape[i] = dim->second;
          used_dims.insert(dim->first);
        }
    }
    if (shape != context.input_shape(d.name)) context.set_input_shape(d.name, shape);
  }
  for (const auto& [name, value] : given.dims)
    if (engine_file && !used_dims.count(name))
      throw Error(ErrorKind::kInvalidArgument, "--dim " + name + "=" + std::to_string(value) +
                                                   ": no dynamic dimension of the engine's inputs is named '" + name + "'");
  if (batch <= 0) return;
  bool any = false;
  for (const TensorDesc& d : engine.inputs()) {
    std::vector<int64_t> shape = context.input_shape(d.name);
    if (!d.shape.empty() && d.shape[0] < 0) {
      shape[0] = batch;
      any = true;
      context.set_input_shape(d.name, shape);
    } else if (!d.shape.empty() && d.shape[0] != batch && engine.inputs().size() == 1) {
      throw Error(ErrorKind::kInvalidArgument, "batch " + std::to_string(batch) + ": the engine's input '" + d.name +
                                                   "' has a fixed first dimension " + std::to_string(d.shape[0]))
          .hint("build it with a profile over the batch (--min-shapes/--opt-shapes/--max-shapes)");
    }
  }
  if (!any && engine.inputs().size() > 1)
    throw Error(ErrorKind::kInvalidArgument, "batch " + std::to_string(batch) + ": no input of the engine has a dynamic first dimension");
}

// The current GPU's peak memory bandwidth in bytes per second (memory clock, double data rate,
// bus width), against which --profile sets each layer's; 0 where the device does not say.
double device_memory_bandwidth() {
  int device = 0, clock_khz = 0, bus_bits = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
}

// Free device memory before the engine was opened, after, and after its context was made:
// the GPU memory figures are differences of these, as a user of the engine sees them.
struct FreeMemory {
  size_t before = 0, engine = 0, context = 0;
};

size_t free_device_memory() {
  size_t free = 0, total = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

size_t used_between(size_t free_earlier, size_t free_later) { return free_earlier > free_later ? free_earlier - free_later : 0; }

// One run's times: from CUDA events before the copies in, before the engine, after it and after
// the copies out (host latency = H2D + GPU compute + D2H, as trtexec defines it), and the host's
// time to enqueue it all.
struct RunTimes {
  double latency_ms = 0, h2d_ms = 0, compute_ms = 0, d2h_ms = 0, enqueue_ms = 0;
};

// A context on a stream of its own, with pinned host copies of its inputs and outputs and the
// events of kRunsInFlight + 1 runs (a slot is reused once its run has been waited for).
struct Lane {
  Context& context;
  cudaStream_t stream = nullptr;
  std::vector<std::pair<void*, void*>> h2d, d2h;  // (pinned host, device)
  std::vector<size_t> h2d_bytes, d2h_bytes;
  struct Slot {
    cudaEvent_t events[4] = {};
    double enqueue_ms = 0;
  };
  std::vector<Slot> slots;
  std::deque<int> pending;  // slots enqueued and not yet waited for, oldest first
  int next_slot = 0;

  Lane(const BenchOptions& o, const Engine& engine, Context& c, uint64_t seed) : context(c), slots(kRunsInFlight + 1) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (Slot& slot : slots)
      for (cudaEvent_t& e : slot.events) KILN_CUDA_CHECK(cudaEventCreate(&e));
    std::mt19937_64 rng(seed);
    for (TensorDesc d : engine.inputs()) {
      d.shape = context.input_shape(d.name);
      Tensor t = input_data(o, d, d.shape, rng);
      void* host = nullptr;
      KILN_CUDA_CHECK(cudaMallocHost(&host, std::max<size_t>(t.nbytes(), 1)));
      h2d.push_back({host, context.input_buffer(d.name)});
      h2d_bytes.push_back(t.nbytes());
      std::memcpy(host, t.raw(), t.nbytes());
      KILN_CUDA_CHECK(cudaMemcpy(context.input_buffer(d.name), host, t.nbytes(), cudaMemcpyHostToDevice));
    }
    for (const TensorDesc& d : engine.outputs()) {
      const size_t bytes = shape_bytes(context.output_shape(d.name), d.dtype);
      void* host = nullptr;
      KILN_CUDA_CHECK(cudaMallocHost(&host, std::max<size_t>(bytes, 1)));
      d2h.push_back({host, context.output_buffer(d.name)});
      d2h_bytes.push_back(bytes);
    }
  }
  Lane(Lane&& other) noexcept
      : context(other.context), stream(std::exchange(other.stream, nullptr)), h2d(std::move(other.h2d)),
        d2h(std::move(other.d2h)), h2d_bytes(std::move(other.h2d_bytes)), d2h_bytes(std::move(other.d2h_bytes)),
        slots(std::move(other.slots)), pending(std::move(other.pending)), next_slot(other.next_slot) {
    other.slots.clear();
    other.h2d.clear();
    other.d2h.clear();
  }
  Lane(const Lane&) = delete;
  ~Lane() {
    if (stream) cudaStreamSynchronize(stream);
    for (Slot& slot : slots)
      for (cudaEvent_t e : slot.events) cudaEventDestroy(e);
    for (auto& [host, dev] : h2d) cudaFreeHost(host);
    for (auto& [host, dev] : d2h) cudaFreeHost(host);
    if (stream) cudaStreamDestroy(stream);
  }

  // Enqueues one run (with the copies when `transfers`); returns its slot.
  int enqueue(bool transfers) {
    const int s = next_slot;
    next_slot = (next_slot + 1) % static_cast<int>(slots.size());
    Slot& slot = slots[static_cast<size_t>(s)];
    const auto start = std::chrono::steady_clock::now();
    KILN_CUDA_CHECK(cudaEventRecord(slot.events[0], stream));
    if (transfers)
      for (size_t i = 0; i < h2d.size(); ++i)
        KILN_CUDA_CHECK(cudaMemcpyAsync(h2d[i].second, h2d[i].first, h2d_bytes[i], cudaMemcpyHostToDevice, stream));
    KILN_CUDA_CHECK(cudaEventRecord(slot.events[1], stream));
    context.enqueue(stream);
    KILN_CUDA_CHECK(cudaEventRecord(slot.events[2], stream));
    if (transfers)
      for (size_t i = 0; i < d2h.size(); ++i)
        KILN_CUDA_CHECK(cudaMemcpyAsync(d2h[i].first, d2h[i].second, d2h_bytes[i], cudaMemcpyDeviceToHost, stream));
    KILN_CUDA_CHECK(cudaEventRecord(slot.events[3], stream));
    slot.enqueue_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    pending.push_back(s);
    return s;
  }

  // Waits for the run in `slot` (the oldest pending one) and returns its times.
  RunTimes wait(int s) {
    Slot& slot = slots[static_cast<size_t>(s)];
    KILN_CUDA_CHECK(cudaEventSynchronize(slot.events[3]));
    if (pending.empty() || pending.front() != s)
      throw Error(ErrorKind::kInternal, "kiln bench waited for a run out of the order it was enqueued");
    pending.pop_front();
    float ms[3] = {};
    for (int i = 0; i < 3; ++i) KILN_CUDA_CHECK(cudaEventElapsedTime(&ms[i], slot.events[i], slot.events[i + 1]));
    RunTimes t;
    t.h2d_ms = ms[0];
    t.compute_ms = ms[1];
    t.d2h_ms = ms[2];
    t.latency_ms = double{ms[0]} + ms[1] + ms[2];
    t.enqueue_ms = slot.enqueue_ms;
    return t;
  }
};

std::string mode_label(const BenchOptions& o, size_t streams) {
  if (!o.pipelined()) return "latency: one run at a time";
  return fmt::format("throughput: {} stream{}, {} runs in flight each", streams, streams == 1 ? "" : "s", kRunsInFlight);
}

// Times the engine at the contexts' current input shapes (the same on each; one context but in
// throughput mode).
nlohmann::json bench_context(const BenchOptions& o, const Engine& engine, const std::vector<Context*>& contexts, double build_s,
                             size_t engine_file_bytes, const FreeMemory& free) {
  nlohmann::json r;
  const std::vector<TensorDesc>& ins = engine.inputs();
  Context& context = *contexts.front();
  const int64_t items = ins.empty() || context.input_shape(ins[0].name).empty() ? 1 : context.input_shape(ins[0].name)[0];

  std::vector<Lane> lanes;
  lanes.reserve(contexts.size());
  check_given_inputs(o, engine);
  for (size_t i = 0; i < contexts.size(); ++i) lanes.emplace_back(o, engine, *contexts[i], o.seed + i);
  // The first run at a new shape plans it (dynamic engines) and captures its CUDA graph; each
  // further context captures its own, untimed.
  auto first = std::chrono::steady_clock::now();
  lanes.front().wait(lanes.front().enqueue(o.with_transfers));
  const double first_run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first).count();
  for (size_t i = 1; i < lanes.size(); ++i) lanes[i].wait(lanes[i].enqueue(o.with_transfers));
  // Warm-up: one run at a time on each stream in latency mode, enqueued ahead in throughput mode.
  const bool pipelined = o.pipelined();
  size_t turn = 0;
  std::vector<RunTimes> timed;
  bool timing = false;
  // One run: synchronized at once (latency), or enqueued behind the stream's earlier ones, the
  // run kRunsInFlight before it waited for first (throughput).
  auto run_once = [&]() {
    Lane& lane = lanes[turn++ % lanes.size()];
    const int slot = lane.enqueue(o.with_transfers);
    if (!pipelined) {
      RunTimes t = lane.wait(slot);
      if (timing) timed.push_back(t);
    } else if (lane.pending.size() > kRunsInFlight) {
      RunTimes t = lane.wait(lane.pending.front());
      if (timing) timed.push_back(t);
    }
  };
  auto drain = [&]() {
    for (Lane& lane : lanes)
      while (!lane.pending.empty()) {
        RunTimes t = lane.wait(lane.pending.front());
        if (timing) timed.push_back(t);
      }
  };
  warm_up(o, o.warmup - 1, run_once);
  drain();
  const size_t free_after = free_device_memory();
  const size_t iters = static_cast<size_t>((o.iterations > 0 ? o.iterations : (items >= 64 ? 50 : 200)) * std::max(o.avg_runs, 1));
  timing = true;
  size_t enqueued = 0;
  auto bench_start = std::chrono::steady_clock::now();
  while (true) {
    run_once();
    ++enqueued;
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - bench_start).count();
    if (o.duration_s > 0 ? (elapsed >= o.duration_s && enqueued >= 10) : enqueued >= iters) break;
  }
  drain();
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - bench_start).count();
  std::vector<double> times, compute, h2d_ms, d2h_ms, enqueue_ms;
  for (const RunTimes& t : timed) {
    times.push_back(t.latency_ms);
    compute.push_back(t.compute_ms);
    h2d_ms.push_back(t.h2d_ms);
    d2h_ms.push_back(t.d2h_ms);
    enqueue_ms.push_back(t.enqueue_ms);
  }
  Stats s = statistics(averaged(times, o.avg_runs));
  const Stats compute_stats = statistics(averaged(compute, o.avg_runs));
  // Latency mode: batch / median latency, as the PyTorch peers are reported. Throughput mode:
  // what the streams together got through, over the wall clock (trtexec's throughput).
  const double throughput = pipelined ? static_cast<double>(items) * static_cast<double>(timed.size()) / wall_s
                                      : 1000.0 * static_cast<double>(items) / s.median;
  EngineInfo info = engine.info();
  nlohmann::json shapes = nlohmann::json::object();
  for (const TensorDesc& d : ins) shapes[d.name] = context.input_shape(d.name);
  bool dynamic = false;
  for (const TensorDesc& d : ins) dynamic |= std::find(d.shape.begin(), d.shape.end(), -1) != d.shape.end();
  r = {{"batch", items},
       {"input_shapes", shapes},
       {"dynamic_engine", dynamic},
       {"precision", info.precision},
       {"device", info.device},
       {"gpu", info.gpu},
       {"layers", context.layers().size()},
       {"build_s", build_s},
       {"first_run_ms", first_run_ms},
       {"iterations", times.size()},
       {"warmup", o.warmup},
       {"mode", pipelined ? "throughput" : "latency"},
       {"streams", lanes.size()},
       {"runs_in_flight_per_stream", pipelined ? kRunsInFlight : 1},
       {"wall_s", wall_s},
       {"cuda_graph", !o.no_graph},
       {"with_transfers", o.with_transfers},
       {"latency_ms", stats_json(s)},
       {"gpu_compute_ms", stats_json(compute_stats)},
       {"enqueue_ms", stats_json(statistics(enqueue_ms))},
       {"throughput_per_s", throughput},
       {"throughput_mean_per_s", pipelined ? throughput : 1000.0 * static_cast<double>(items) / s.mean},
       {"weights_bytes", info.weight_bytes},
       {"activation_bytes", info.activation_bytes},
       {"workspace_bytes", info.workspace_bytes},
       {"gpu_memory_used_bytes", used_between(free.before, free_after)},
       // Where it went: opening the engine (weights, library state), making the context
       // (activations, workspace, inputs and outputs), and the first runs (kernels loaded on
       // first use, the CUDA graph).
       {"gpu_memory_engine_bytes", used_between(free.before, free.engine)},
       {"gpu_memory_context_bytes", used_between(free.engine, free.context)},
       {"gpu_memory_first_runs_bytes", used_between(free.context, free_after)},
       {"gpu_memory_predicted_bytes", info.device_memory_bytes},  // what `kiln inspect` says before running
       {"fp32_layers", info.fp32_layers},
       {"int8_kept_float", info.int8_kept_float},
       {"cpu_fallback", info.has_cpu_fallback},
       {"times_ms", times},
       {"gpu_compute_times_ms", compute},
       {"layer_info", layers_json(context.layers())}};
  if (o.with_transfers) {
    r["h2d_ms"] = stats_json(statistics(h2d_ms));
    r["d2h_ms"] = stats_json(statistics(d2h_ms));
  }
  if (engine_file_bytes) r["engine_file_bytes"] = engine_file_bytes;
  std::cout << fmt::format(
      "batch {:>4}  {} [{}]: median {:.4f} ms  mean {:.4f}  min {:.4f}  p90 {:.4f}  p95 {:.4f}  p99 {:.4f}  max {:.4f}  sd {:.4f}  "
      "| {:.1f} items/s | {} {:.1f} s | GPU memory {} (engine {}, context {}, first runs {})\n",
      items, info.precision, mode_label(o, lanes.size()), s.median, s.mean, s.min, s.p90, s.p95, s.p99, s.max, s.stddev,
      throughput, engine_file_bytes ? "load" : "build", build_s,
      format_bytes(static_cast<double>(used_between(free.before, free_after))),
      format_bytes(static_cast<double>(used_between(free.before, free.engine))),
      format_bytes(static_cast<double>(used_between(free.engine, free.context))),
      format_bytes(static_cast<double>(used_between(free.context, free_after))));
  if (o.with_transfers || pipelined)
    std::cout << fmt::format("            host latency median {:.4f} ms = H2D {:.4f} + GPU compute {:.4f} + D2H {:.4f}; "
                             "enqueue {:.4f} ms (host)\n",
                             s.median, statistics(h2d_ms).median, compute_stats.median, statistics(d2h_ms).median,
                             statistics(enqueue_ms).median);
  if (o.profile) {
    const std::vector<LayerInfo> layer_info = context.layers();
    r["profile"] = profile_summary([&] { return context.profile(lanes.front().stream); }, layer_info,
                                   "layer by layer without a CUDA graph", device_memory_bandwidth());
  }
  return r;
}

// The contexts a bench runs on: one, or --streams of them (each with its own stream).
std::vector<Context> make_contexts(const BenchOptions& o, Engine& engine) {
  std::vector<Context> contexts;
  for (int i = 0; i < o.streams; ++i) contexts.push_back(engine.create_context(!o.no_graph));
  return contexts;
}

std::vector<Context*> pointers(std::vector<Context>& contexts) {
  std::vector<Context*> out;
  for (Context& c : contexts) out.push_back(&c);
  return out;
}

// A GPU engine whose last nodes run on the CPU engine after data-dependent shapes (detection
// models' box selection) runs only through run(): it is timed as Engine::run, wall clock.
bool finishes_on_the_cpu(const BenchOptions& o, const Engine& engine) {
  const std::vector<std::string> nodes = engine.info().data_dependent_nodes;
  if (nodes.empty()) return false;
  const std::string names = compiler::named_nodes(nodes);
  if (o.pipelined() || o.profile)
    throw Error(ErrorKind::kInvalidArgument, "--throughput, --streams and --profile time runs enqueued on a stream, and this "
                                             "engine's last nodes run on the CPU engine after " + names +
                                             ", whose output shapes depend on the data")
        .hint("leave them out: kiln bench then times Engine::run, both parts and the copies between them");
  std::cerr << "kiln bench: the engine's last nodes run on the CPU engine after " << names
            << " (output shapes that depend on the data): timing Engine::run by the wall clock\n";
  return true;
}

// --shapes as given, for an engine timed through Engine::run.
std::map<std::string, std::vector<int64_t>> given_shapes(const BenchOptions& o) {
  ShapeBindings given;
  for (const std::string& s : o.engine.shapes) given.add_shapes_option(s);
  return given.shapes;
}

// One static engine per batch size (an ONNX model without profiles: each built for its batch),
// or one engine swept over the batches (an engine file, or a build with profiles).
nlohmann::json bench_gpu(const BenchOptions& o, const std::vector<int64_t>& batches) {
  const cuda::DeviceScope gpu(o.engine.gpu);  // the bench's own streams, buffers and memory figures too
  FreeMemory free;
  free.before = free_device_memory();
  nlohmann::json results = nlohmann::json::array();
  const bool one_engine = is_engine_file(o.model) || o.engine.has_profiles();
  if (one_engine) {
    double build_s = 0;
    size_t file_bytes = 0;
    Engine engine = open_gpu_engine(o, -1, build_s, file_bytes);
    if (finishes_on_the_cpu(o, engine)) {
      for (int64_t b : batches) results.push_back(time_engine_runs(o, engine, build_s, b, given_shapes(o)));
      return results;
    }
    free.engine = free_device_memory();
    std::vector<Context> contexts = make_contexts(o, engine);
    free.context = free_device_memory();
    for (int64_t b : batches) {
      for (Context& context : contexts) set_input_shapes(engine, context, b, o.engine, is_engine_file(o.model));
      results.push_back(bench_context(o, engine, pointers(contexts), build_s, file_bytes, free));
    }
    return results;
  }
  for (int64_t b : batches) {
    double build_s = 0;
    size_t file_bytes = 0;
    Engine engine = open_gpu_engine(o, b, build_s, file_bytes);
    if (finishes_on_the_cpu(o, engine)) {
      results.push_back(time_engine_runs(o, engine, build_s, b, given_shapes(o)));
      continue;
    }
    free.engine = free_device_memory();
    std::vector<Context> contexts = make_contexts(o, engine);
    free.context = free_device_memory();
    results.push_back(bench_context(o, engine, pointers(contexts), build_s, file_bytes, free));
  }
  return results;
}
#endif

// --input NAME=FILE (or trtexec's NAME:FILE): the files read into o.given_inputs, their shapes
// added to --shapes, and the batch the first of them holds (which --batches may only repeat)
// returned; -1 without files.
int64_t read_given_inputs(BenchOptions& o) {
  int64_t batch = -1;
  for (const std::string& spec : o.input_files) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos) eq = spec.rfind(':');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      throw Error(ErrorKind::kInvalidArgument, "--input " + spec + ": expected NAME=FILE (.npy or .pb)");
    const std::string name = spec.substr(0, eq);
    if (o.given_inputs.count(name)) throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' is given twice");
    Tensor t = read_tensor_input(spec.substr(eq + 1));
    if (batch < 0 && t.rank() > 0) batch = t.dim(0);
    if (t.rank() > 0) o.engine.shapes.push_back(name + ":" + shape_to_string(t.shape()));
    o.given_inputs.emplace(name, std::move(t));
  }
  return batch;
}

int bench(BenchOptions o) {
  const JsonOutput json(o.json);
  const int64_t given_batch = read_given_inputs(o);
  std::vector<int64_t> batches = !o.batches.empty() ? parse_batches(o.batches)
                                 : given_batch >= 0 ? std::vector<int64_t>{given_batch}
                                                    : std::vector<int64_t>{o.engine.batch};
  if (given_batch >= 0 && (batches.size() != 1 || batches[0] != given_batch))
    throw Error(ErrorKind::kInvalidArgument, "--batches " + o.batches + ": the --input files hold batch " +
                                                 std::to_string(given_batch) + ", which is what is timed")
        .hint("leave --batches out, or write files of each batch and time them one by one");
  const bool cpu = is_engine_file(o.model) ? engine_file_backend(o.model) == "cpu" : o.engine.device == "cpu";
  check_save_engine(o, batches.size());
  if (cpu && (o.with_transfers || o.no_graph))
    throw Error(ErrorKind::kInvalidArgument, "--with-transfers and --no-graph are for GPU engines (--device cuda)");
  if (cpu && o.pipelined())
    throw Error(ErrorKind::kInvalidArgument, "--throughput and --streams time GPU engines (--device cuda): the CPU engine's "
                                             "runs return their outputs, so there is nothing to enqueue ahead")
        .hint("the CPU engine's --threads sets how many cores one run takes");
  nlohmann::json results = nlohmann::json::array();
  if (cpu) {
    for (int64_t b : batches) results.push_back(bench_cpu_one(o, b));
  } else {
#if KILN_WITH_CUDA
    results = bench_gpu(o, batches);
#else
    throw Error(ErrorKind::kUnsupported, "this kiln was built without the CUDA backend; kiln bench --device cuda needs it");
#endif
  }
  // trtexec's export files, per batch: the per-run times, the layers, the per-layer profile.
  auto export_json = [&](const std::string& path, std::initializer_list<const char*> keys) {
    if (path.empty()) return;
    nlohmann::json per_batch = nlohmann::json::array();
    for (const nlohmann::json& r : results) {
      nlohmann::json entry = {{"batch", r.at("batch")}};
      for (const char* key : keys)
        if (r.contains(key) || key == *keys.begin()) entry[key] = r.contains(key) ? r.at(key) : nlohmann::json();
      per_batch.push_back(std::move(entry));
    }
    std::ofstream f(path);
    if (!f || !(f << per_batch.dump(1) << "\n")) throw Error(ErrorKind::kIo, "cannot write '" + path + "'");
  };
  // GPU: each run's GPU compute time beside its host latency.
  export_json(o.export_times, {"times_ms", "gpu_compute_times_ms"});
  export_json(o.export_layer_info, {"layer_info"});
  export_json(o.export_profile, {"profile"});
  for (nlohmann::json& r : results) {
    r.erase("times_ms");
    r.erase("gpu_compute_times_ms");
    r.erase("layer_info");
  }
  nlohmann::json out = {{"schema", "kiln-bench 1"},
                        {"model", o.model},
                        {"kiln_version", KILN_VERSION},
                        {"timing", cpu ? "wall clock around each Engine::run (which returns the outputs); throughput = batch / median latency"
                                   : o.pipelined()
                                       ? fmt::format("throughput mode: {} context(s) on streams of their own, {} runs enqueued ahead on "
                                                     "each; CUDA events around each run's copies and compute; throughput = runs * "
                                                     "batch / wall-clock time", o.streams, kRunsInFlight)
                                       : "CUDA events around each run, synchronized after each; throughput = batch / median latency"},
                        {"results", results}};
  json.write(out);
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, std::function<int()>& action) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Time a GPU engine: latency statistics, throughput, memory (like trtexec)");
  add_model_option(cmd, o->model, true);
  o->engine.add_to(cmd, "cuda");
  // kiln bench's --batch is --batches (one size or several), not the build option's single size.
  cmd->remove_option(cmd->get_option("--batch"));
  cmd->add_option("--batch", o->batches, "The same as --batches");
  cmd->add_option("--batches", o->batches,
                  "Batch sizes to sweep, e.g. 1,8,128: an ONNX model is built once per batch (or once, with a "
                  "profile: --min-shapes/--opt-shapes/--max-shapes), an engine file runs each batch within its profile");
  cmd->add_option("--warmup", o->warmup, "Untimed runs first")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--iterations", o->iterations, "Timed runs (default 200, or 50 for batches >= 64)")->check(CLI::PositiveNumber);
  cmd->add_option("--duration", o->duration_s, "Time runs for this many seconds instead (at least 10 runs)")->check(CLI::PositiveNumber);
  cmd->add_flag("--with-transfers", o->with_transfers, "Include copying inputs in and outputs out (pinned host memory)");
  cmd->add_flag("--no-graph", o->no_graph, "Launch layer by layer instead of replaying a CUDA graph");
  cmd->add_flag("--profile", o->profile, "Also time every layer (median of 10 runs)");
  cmd->add_option("--json", o->json, "Write the results as JSON to FILE, or - for standard output (schema: docs/bench.md)");
  cmd->add_option("--seed", o->seed, "Seed of the random inputs")->capture_default_str();
  cmd->add_option("--input,-i,--loadInputs", o->input_files,
                  "Input data instead of random: NAME=FILE (or NAME:FILE), FILE .npy or .pb (ONNX TensorProto), converted to the input's "
                  "dtype; its shape is the shape timed, its first dimension the batch (repeatable)");
  // trtexec's spellings and options.
  cmd->add_flag("--useCudaGraph", o->use_cuda_graph, "Replay a CUDA graph (kiln's default)")->excludes("--no-graph");
  cmd->add_flag("--noDataTransfers", o->no_data_transfers, "Time the engine without copies in and out (kiln's default)")
      ->excludes("--with-transfers");
  cmd->add_option("--warmUp", o->warmup_ms, "Also warm up for this many milliseconds (trtexec's --warmUp)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--avgRuns", o->avg_runs, "Report each sample as the mean of this many consecutive runs")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--exportTimes", o->export_times, "Write every run's time (ms), per batch, as JSON");
  cmd->add_option("--exportLayerInfo", o->export_layer_info, "Write the engine's layers (op, tactic, precision, shape), per batch, as JSON");
  cmd->add_option("--exportProfile", o->export_profile, "Write the per-layer profile, per batch, as JSON (implies --profile)");
  cmd->add_flag("--throughput", o->throughput,
                "Throughput mode: enqueue runs ahead (two in flight per stream) and report runs * batch over the wall clock, "
                "as trtexec does; each run's host latency (copies included with --with-transfers) and GPU compute time are "
                "still reported");
  cmd->add_option("--streams,--infStreams", o->streams,
                  "Throughput mode on this many contexts, each on a CUDA stream of its own, run concurrently (trtexec's "
                  "--streams / --infStreams)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--saveEngine", o->save_engine,
                  "Write the engine built from the ONNX model to FILE before timing it (one batch size, or a profile)");
  cmd->callback([o, cmd, &action] {
    action = [o, cmd] {
      check_model_option(cmd, o->model);
      if (!o->export_profile.empty()) o->profile = true;
      return bench(*o);
    };
  });
}

}  // namespace kiln::tools
