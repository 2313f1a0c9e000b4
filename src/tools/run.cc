// kiln run model.onnx: feeds inputs (tensors from .npy / .pb files, photos, or random data),
// runs the model on the CPU engine and summarizes each output (and the top classes of
// classifier outputs).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "io/image.h"
#include "io/npy.h"
#include "compiler/input_values.h"
#include "ir/parameter_inputs.h"
#include "ir/small_types.h"
#include "kiln/kiln.h"
#include "onnx/importer.h"
#include "tools/commands.h"
#include "tools/engine_options.h"
#include "tools/image_flags.h"
#include "tools/input_files.h"
#include "tools/random_inputs.h"
#include "tools/shapes.h"

namespace kiln::tools {

namespace fs = std::filesystem;

namespace {

struct RunOptions {
  std::string model;
  std::vector<std::string> inputs;
  bool random = false;
  uint64_t seed = 0;
  int64_t batch = -1;
  std::vector<std::string> dims;
  std::vector<std::string> shapes;
  std::string output_dir;
  int top_k = 5;
  std::string labels;
  EngineOptions engine;  // --device, precision, --timing-cache, --allow-cpu-fallback
  ImageFlags image;  // image preprocessing: --resize, --crop, --mean, --std, --gray
};

Tensor load_image_input(const std::string& path, const TensorDesc& desc, const RunOptions& o) {
  Tensor one = io::load_image(path, o.image.options(desc, path));
  // The batch: --batch, else the model's fixed batch, else 1. Every row is the same photo.
  int64_t batch = o.batch > 0 ? o.batch : desc.shape[0] > 0 ? desc.shape[0] : 1;
  std::vector<int64_t> shape = one.shape();
  shape[0] = batch;
  Tensor t(DType::kFloat32, shape);
  for (int64_t b = 0; b < batch; ++b)
    std::copy(one.data<float>(), one.data<float>() + one.numel(), t.data<float>() + b * one.numel());
  return desc.dtype == DType::kFloat32 ? t : cast_input(t, desc.dtype, desc.name);
}

Tensor load_input(const std::string& path, const TensorDesc& desc, const RunOptions& o) {
  if (is_tensor_file(path)) return read_tensor_input(path, desc);
  if (!fs::exists(path)) throw Error(ErrorKind::kIo, "input file '" + path + "' does not exist");
  return load_image_input(path, desc, o);
}

std::string format_value(double v, DType dtype) {
  if (is_float(dtype)) return fmt::format("{:.6g}", v);
  return fmt::format("{}", static_cast<int64_t>(v));
}

// A classifier's output row: show the k largest scores as probabilities. Rows that already
// are probabilities (softmax inside the model) are shown as they are.
void print_top_k(const Tensor& t, int k, const std::vector<std::string>& labels) {
  int64_t rows = t.dim(0), classes = t.dim(1);
  const int64_t max_rows = 16;
  for (int64_t r = 0; r < std::min(rows, max_rows); ++r) {
    std::vector<double> row(static_cast<size_t>(classes));
    for (int64_t c = 0; c < classes; ++c) row[static_cast<size_t>(c)] = t.value_as_double(r * classes + c);
    double sum = 0;
    bool in_unit = true;
    for (double v : row) {
      sum += v;
      in_unit = in_unit && v >= 0 && v <= 1;
    }
    bool already = in_unit && std::abs(sum - 1.0) < 1e-3;
    std::vector<double> prob = row;
    if (!already) {
      double mx = *std::max_element(row.begin(), row.end());
      double total = 0;
      for (double& p : prob) total += (p = std::exp(p - mx));
      for (double& p : prob) p /= total;
    }
    std::vector<int64_t> order(static_cast<size_t>(classes));
    for (int64_t c = 0; c < classes; ++c) order[static_cast<size_t>(c)] = c;
    int64_t shown = std::min<int64_t>(k, classes);
    std::partial_sort(order.begin(), order.begin() + shown, order.end(), [&](int64_t a, int64_t b) {
      return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)];
    });
    std::cout << fmt::format("  top-{} of row {} ({}):\n", shown, r, already ? "the output is a probability" : "softmax of the output");
    for (int64_t i = 0; i < shown; ++i) {
      int64_t c = order[static_cast<size_t>(i)];
      std::string label = c < static_cast<int64_t>(labels.size()) ? "  " + labels[static_cast<size_t>(c)] : "";
      std::cout << fmt::format("    {:>6}  {:>8.4f}  (score {:.4g}){}\n", c, prob[static_cast<size_t>(c)], row[static_cast<size_t>(c)], label);
    }
  }
  if (rows > max_rows) std::cout << fmt::format("  ({} more rows not shown)\n", rows - max_rows);
}

void print_output(const std::string& name, const Tensor& t, const RunOptions& o, const std::vector<std::string>& labels) {
  std::cout << fmt::format("output '{}': {} [{}]\n", name, to_string(t.dtype()), shape_to_string(t.shape()));
  if (t.numel() == 0 || element_size(t.dtype()) == 0) return;
  double mn = INFINITY, mx = -INFINITY, sum = 0;
  int64_t nans = 0, finite = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = t.value_as_double(i);
    if (std::isnan(v)) { ++nans; continue; }
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    if (std::isfinite(v)) { sum += v; ++finite; }
  }
  std::cout << fmt::format("  min {}  max {}  mean {:.6g}{}\n", format_value(mn, DType::kFloat64), format_value(mx, DType::kFloat64),
                           finite ? sum / static_cast<double>(finite) : NAN, nans ? fmt::format("  ({} NaN)", nans) : "");
  std::string first;
  int64_t n = std::min<int64_t>(t.numel(), 8);
  for (int64_t i = 0; i < n; ++i) first += (i ? " " : "") + format_value(t.value_as_double(i), t.dtype());
  std::cout << fmt::format("  first values: {}{}\n", first, t.numel() > n ? " ..." : "");
  if (o.top_k > 0 && t.rank() == 2 && is_float(t.dtype()) && t.dim(1) >= 2) print_top_k(t, o.top_k, labels);
}

// A file name for an output: tensor names may hold '/' or ':'.
std::string file_name_for(const std::string& name) {
  std::string s = name;
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) c = '_';
  if (s.empty() || s[0] == '.') s = "_" + s;
  return s;
}

std::vector<std::string> read_labels(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(ErrorKind::kIo, "cannot open the labels file '" + path + "'");
  std::vector<std::string> labels;
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    labels.push_back(line);
  }
  return labels;
}

// An output as NumPy can hold it: bfloat16 and the 8- and 4-bit floats as float32 values, the
// sub-byte integers as the int8 / uint8 bytes they are stored in.
Tensor npy_compatible(const Tensor& t) {
  if (t.dtype() == DType::kBFloat16 || is_small_float(t.dtype())) return t.to_float32();
  if (!is_sub_byte_integer(t.dtype())) return t;
  const bool is_signed = t.dtype() == DType::kInt4 || t.dtype() == DType::kInt2;
  Tensor wide(is_signed ? DType::kInt8 : DType::kUInt8, t.shape());
  if (t.nbytes()) std::memcpy(wide.raw(), t.raw(), t.nbytes());
  return wide;
}

int run(const RunOptions& o) {
  std::vector<std::string> labels = o.labels.empty() ? std::vector<std::string>{} : read_labels(o.labels);
  // A GPU engine is built for the shapes of the data given, so the inputs are read first, by
  // the model's declared inputs; a CPU engine or an engine file is opened first.
  const bool engine_file = is_engine_file(o.model);
  const bool gpu_from_onnx = !engine_file && o.engine.device == "cuda";
  std::optional<Engine> engine;
  double build_ms = 0;
  auto open_engine = [&](const std::map<std::string, std::vector<int64_t>>& shapes,
                         const std::map<std::string, Tensor>& values) {
    auto t0 = std::chrono::steady_clock::now();
    if (engine_file) {
      engine.emplace(Engine::load(o.model, o.engine.load_options()));
    } else {
      std::vector<std::string> unused;
      EngineOptions eo = o.engine;
      eo.image = o.image;  // a --calib folder of images is preprocessed as --input photos are
      eo.shapes.clear();
      eo.dims.clear();
      eo.batch = -1;
      BuildOptions build = eo.build_options(o.model, unused);
      for (const auto& [name, shape] : shapes) build.input_shapes[name] = shape;
      for (const auto& [name, v] : values) build.input_values.emplace(name, v);  // --input-values first
      engine.emplace(Engine::from_onnx(o.model, build));
    }
    build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::cout << fmt::format("model: {} ({} layers on {}{}, {} in {:.1f} ms)\n", o.model, engine->layer_count(),
                             engine->backend(), o.engine.no_optimize ? ", not optimized" : "",
                             engine_file ? "loaded" : "built", build_ms);
  };
  std::vector<TensorDesc> declared;
  // A GPU engine built here plans for the values given to inputs that set parameters.
  std::vector<std::string> parameter_inputs;
  if (gpu_from_onnx) {
    ir::Graph g = onnx_import::import_file(o.model);
    parameter_inputs = ir::parameter_inputs(g, compiler::kMaxInputValueElements);
    for (const std::string& in : g.inputs) {
      TensorDesc d;
      d.name = in;
      const ir::Value& v = g.value(in);
      d.dtype = v.type.dtype;
      if (v.type.shape)
        for (const ir::Dim& dim : *v.type.shape) {
          d.shape.push_back(dim.known() ? dim.value : -1);
          d.dim_names.push_back(dim.known() ? "" : dim.symbol);
        }
      declared.push_back(d);
    }
  } else {
    open_engine({}, {});
    declared = engine->inputs();
  }

  std::vector<std::string> input_names, symbols;
  for (const TensorDesc& d : declared) {
    input_names.push_back(d.name);
    for (const std::string& s : d.dim_names)
      if (!s.empty()) symbols.push_back(s);
  }
  ShapeBindings bindings;
  for (const std::string& d : o.dims) bindings.add_dim_option(d);
  for (const std::string& s : o.shapes) bindings.add_shapes_option(s);
  bindings.batch = o.batch;
  check_bindings_used(bindings, input_names, symbols);

  const std::map<std::string, std::string> files = assign_input_files(o.inputs, input_names);

  std::map<std::string, Tensor> inputs;
  std::vector<std::string> missing, defaulted;
  std::mt19937_64 rng(o.seed);
  for (const TensorDesc& d : declared) {
    auto f = files.find(d.name);
    if (f != files.end()) {
      inputs[d.name] = load_input(f->second, d, o);
    } else if (o.random) {
      std::vector<int64_t> shape = resolve_shape(d.name, d.shape, d.dim_names, bindings, 1, defaulted);
      inputs[d.name] = random_input(d, shape, rng);
    } else {
      missing.push_back(d.name);
      continue;
    }
    std::cout << fmt::format("input '{}': {} [{}]{}\n", d.name, to_string(inputs[d.name].dtype()),
                             shape_to_string(inputs[d.name].shape()), f != files.end() ? " from " + f->second : " (random)");
  }
  if (!missing.empty())
    throw Error(ErrorKind::kInvalidArgument, "no data for input(s) " + name_list(missing))
        .hint("pass --input NAME=file.npy (or .pb, or a photo), or --random");
  if (!defaulted.empty())
    std::cout << fmt::format("note: dynamic dimensions set to 1: {} (choose with --dim NAME=VALUE, --shapes or --batch)\n", name_list(defaulted));

  if (gpu_from_onnx) {
    std::map<std::string, std::vector<int64_t>> shapes;
    std::map<std::string, Tensor> values;
    for (const auto& [name, t] : inputs) {
      shapes[name] = t.shape();
      if (std::find(parameter_inputs.begin(), parameter_inputs.end(), name) != parameter_inputs.end()) values[name] = t;
    }
    open_engine(shapes, values);
  }
  auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, Tensor> outputs = engine->run(inputs);
  double run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << fmt::format("ran in {:.2f} ms\n", run_ms);

  if (!o.output_dir.empty()) {
    std::error_code ec;
    fs::create_directories(o.output_dir, ec);
    if (ec) throw Error(ErrorKind::kIo, "cannot create the directory '" + o.output_dir + "': " + ec.message());
  }
  for (const TensorDesc& d : engine->outputs()) {
    const Tensor& t = outputs.at(d.name);
    print_output(d.name, t, o, labels);
    if (!o.output_dir.empty()) {
      std::string path = (fs::path(o.output_dir) / (file_name_for(d.name) + ".npy")).string();
      io::write_npy(path, npy_compatible(t));
      std::cout << fmt::format("  wrote {}\n", path);
    }
  }
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, std::function<int()>& action) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Run a model (CPU or GPU engine, or an engine file) and summarize its outputs");
  add_model_option(cmd, o->model, true);
  cmd->add_option("--input,-i", o->inputs,
                  "Input data: NAME=FILE or FILE (next unnamed input); FILE is .npy, .pb (ONNX TensorProto) or an image (repeatable)");
  cmd->add_flag("--random", o->random, "Fill inputs without a file with random data (floats ~ N(0,1), integers in 0..9)");
  cmd->add_option("--seed", o->seed, "Seed for --random")->capture_default_str();
  cmd->add_option("--batch", o->batch, "Batch size: the first dimension of dynamic inputs, and images are repeated this often")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dim", o->dims, "Bind a dynamic dimension for --random, e.g. --dim seq=128 (repeatable)");
  cmd->add_option("--shapes", o->shapes, "Input shapes for --random, e.g. --shapes input:1x3x224x224");
  cmd->add_option("--output-dir,-o", o->output_dir, "Write every output to DIR/<output name>.npy");
  cmd->add_option("--top-k", o->top_k, "Classes to show per row of classifier outputs ([N, C] float; 0: none)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--labels", o->labels, "Class names, one per line, for the top-k lists");
  o->image.add_to(cmd);
  o->engine.add_to(cmd, "cpu", /*shape_options=*/false, /*image_options=*/false);
  cmd->callback([o, cmd, &action] {
    action = [o, cmd] {
      check_model_option(cmd, o->model);
      return run(*o);
    };
  });
}

}  // namespace kiln::tools
