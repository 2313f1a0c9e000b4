// kiln inspect model.onnx: inputs, outputs, layers with shapes, parameters and FLOPs.
// kiln inspect model.engine: the layers after fusion with precision, tactic and shape; memory.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <iostream>
#include <map>

#include "cpu/evaluate.h"
#include "ir/op_schema.h"
#include "onnx/importer.h"
#include "compiler/data_dependent_split.h"
#include "compiler/pipeline.h"
#include "passes/passes.h"
#include "engine/engine_file.h"
#include "engine/header.h"
#include "kiln/kiln.h"
#include "tools/commands.h"
#include "tools/engine_options.h"
#include "tools/json_output.h"
#include "tools/shapes.h"

namespace kiln::tools {

namespace {
struct InspectOptions {
  std::string model;
  bool optimize = false;
  bool verbose = false;  // with --optimize: what the passes did not fuse, and why
  std::string json;  // --json [FILE]: empty for text
  std::vector<std::string> dims;    // --dim N=8
  std::vector<std::string> shapes;  // --shapes input:1x3x224x224
};

std::string type_string(const ir::Graph& g, const std::string& name) {
  const ir::Value* v = g.find_value(name);
  return v ? v->type.str() : "?";
}

std::string human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T"};
  int p = 0;
  while (v >= 1000.0 && p < 4) { v /= 1000.0; ++p; }
  return fmt::format("{:.2f} {}{}", v, prefixes[p], unit);
}

// Gives every dynamic input dimension a number so that shapes and FLOPs further down are
// concrete. Returns the declared input types (before binding) and lists the dimensions that
// nobody bound (set to 1) in `defaulted`.
std::map<std::string, std::string> bind_dims(ir::Graph& g, const InspectOptions& o, std::vector<std::string>& defaulted) {
  tools::ShapeBindings b;
  for (const std::string& d : o.dims) b.add_dim_option(d);
  for (const std::string& s : o.shapes) b.add_shapes_option(s);
  std::vector<std::string> symbols;
  std::map<std::string, std::string> declared;
  for (const std::string& in : g.inputs) {
    const ir::Value& v = g.value(in);
    declared[in] = v.type.str();
    for (const ir::Dim& d : *v.type.shape)
      if (d.symbolic()) symbols.push_back(d.symbol);
  }
  check_bindings_used(b, g.inputs, symbols);
  bool changed = false;
  for (const std::string& in : g.inputs) {
    ir::Value& v = g.value(in);
    std::vector<int64_t> shape;
    std::vector<std::string> names;
    for (const ir::Dim& d : *v.type.shape) {
      shape.push_back(d.known() ? d.value : -1);
      names.push_back(d.known() ? "" : d.symbol);
    }
    std::vector<int64_t> bound = resolve_shape(in, shape, names, b, 1, defaulted);
    if (bound != shape) {
      v.type.shape = ir::dims_of(bound);
      changed = true;
    }
  }
  if (changed) {
    // Declared shapes of later values still carry the symbols; inference replaces them.
    for (const auto& [name, value] : g.values())
      if (!value.constant && std::find(g.inputs.begin(), g.inputs.end(), name) == g.inputs.end()) {
        ir::Value& v = g.value(name);
        if (v.type.shape && !ir::all_known(*v.type.shape)) v.type.shape.reset();
        v.symbolic_value.reset();  // it may name the symbols just bound
      }
    ir::infer_shapes(g);
  }
  return declared;
}

// Some shape arithmetic (torch's expand: Where(Equal(shape, -1), ...)) goes through negative
// numbers that symbolic inference does not track. With every dim bound, computing the shape
// subgraphs on a copy gives the concrete types; the graph shown stays as it is.
void fill_shapes_by_folding(ir::Graph& g) {
  ir::Graph folded = g;
  passes::fold_constants(folded, cpu::evaluate_node);
  ir::infer_shapes(folded);
  for (const auto& [name, v] : folded.values()) {
    ir::Value* shown = g.find_value(name);
    if (!shown || !v.type.shape || !ir::all_known(*v.type.shape)) continue;
    if (!shown->type.shape || !ir::all_known(*shown->type.shape)) shown->type = v.type;
  }
}

// An engine file: what was built (layers after fusion with their precision, tactic and output
// shape; inputs and outputs; memory) and for what (the header: kiln version, device, options).
int inspect_engine(const InspectOptions& o) {
  const JsonOutput json(o.json);
  const nlohmann::json header = engine_file::read_header(o.model);
  const Engine engine = Engine::load(o.model);
  const EngineInfo info = engine.info();
  auto desc_json = [](const TensorDesc& d) {
    return nlohmann::json{{"name", d.name}, {"dtype", to_string(d.dtype)}, {"shape", d.shape}, {"dim_names", d.dim_names}};
  };
  nlohmann::json j;
  j["engine"] = o.model;
  j["format_version"] = engine_file::kEngineFormatVersion;
  for (const char* key : {"kiln_version", "backend", "device", "options", "model_name"})
    if (header.contains(key)) j[key] = header.at(key);
  j["options"].erase("int8_scales");  // per tensor: long, and in the calibration cache
  j["int8_scales"] = header.contains("options") ? header.at("options").value("int8_scales", nlohmann::json::object()).size() : 0;
  j["precision"] = info.precision;
  for (const TensorDesc& d : engine.inputs()) j["inputs"].push_back(desc_json(d));
  for (const TensorDesc& d : engine.outputs()) j["outputs"].push_back(desc_json(d));
  // A CPU engine keeps its dims dynamic: its layers' FLOPs are not known until the shapes are
  // (kiln inspect on the ONNX model counts them at chosen dims).
  double flops = 0;
  bool dynamic = false;
  j["layers"] = nlohmann::json::array();
  for (const LayerInfo& l : info.layers) {
    flops += l.flops;
    for (int64_t d : l.shape) dynamic = dynamic || d < 0;
    j["layers"].push_back({{"name", l.name}, {"op", l.op}, {"tactic", l.tactic}, {"precision", l.precision},
                           {"shape", l.shape}, {"flops", l.flops}, {"cpu_fallback", l.cpu_fallback}});
    if (!l.members.empty()) j["layers"].back()["members"] = l.members;
  }
  j["flops"] = dynamic ? nlohmann::json() : nlohmann::json(flops);
  // GPU engines: which layers run on the GPU and which on the CPU engine (no GPU layer).
  std::vector<std::string> on_cpu;
  for (const LayerInfo& l : info.layers)
    if (l.cpu_fallback) on_cpu.push_back(l.name + " (" + l.op + ")");
  if (info.device != "cpu")
    j["partition"] = {{"gpu_layers", info.layers.size() - on_cpu.size()}, {"cpu_layers", on_cpu},
                      {"data_dependent_nodes", info.data_dependent_nodes}};
  j["memory"] = {{"weight_bytes", info.weight_bytes}, {"activation_bytes", info.activation_bytes},
                 {"workspace_bytes", info.workspace_bytes}};
  j["fp32_layers"] = info.fp32_layers;
  j["int8_kept_float"] = info.int8_kept_float;
  // GPU engines: each optimization profile with its ranges, the memory its max shapes need, and
  // every layer's output shape at min, opt and max.
  j["profiles"] = nlohmann::json::array();
  for (const ProfileInfo& p : info.profiles) {
    nlohmann::json pj;
    for (const auto& [name, r] : p.ranges) pj["inputs"][name] = {{"min", r.min}, {"opt", r.opt}, {"max", r.max}};
    pj["memory"] = {{"activation_bytes", p.activation_bytes}, {"workspace_bytes", p.workspace_bytes}};
    pj["layers"] = nlohmann::json::array();
    for (size_t i = 0; i < p.layers.size(); ++i)
      pj["layers"].push_back({{"name", p.layers[i].name}, {"tactic", p.layers[i].tactic},
                              {"shape", {{"min", p.min_shapes[i]}, {"opt", p.layers[i].shape}, {"max", p.max_shapes[i]}}}});
    j["profiles"].push_back(pj);
  }
  if (!info.profiles.empty()) {
    j["memory"]["io_bytes"] = info.io_bytes;
    j["memory"]["device_memory_bytes"] = info.device_memory_bytes;
  }
  if (json.wanted()) {
    json.write(j);
    return 0;
  }
  std::cout << fmt::format("engine: {} (kiln {}, {} engine, precision {}, format {})\n", o.model,
                           j.value("kiln_version", "?"), info.backend, info.precision, engine_file::kEngineFormatVersion);
  if (header.contains("device")) std::cout << "built for: " << header.at("device").dump() << "\n";
  std::cout << "inputs:\n";
  for (const TensorDesc& d : engine.inputs())
    std::cout << fmt::format("  {:<30} {}[{}]\n", d.name, to_string(d.dtype), shape_to_string(d.shape));
  std::cout << "outputs:\n";
  for (const TensorDesc& d : engine.outputs())
    std::cout << fmt::format("  {:<30} {}[{}]\n", d.name, to_string(d.dtype), shape_to_string(d.shape));
  // Inputs that set parameters, with the values the engine was planned for (others plan on first use).
  const std::map<std::string, Tensor> planned = engine_file::header_from_json(header, o.model).options.input_values;
  if (!planned.empty()) std::cout << "planned by value (other values are planned on first use):\n";
  for (const auto& [name, values] : planned) {
    std::string text;
    for (int64_t i = 0; i < values.numel(); ++i) text += fmt::format("{}{}", i ? ", " : "", values.value_as_double(i));
    std::cout << fmt::format("  {:<30} {}[{}] = [{}]\n", name, to_string(values.dtype()), shape_to_string(values.shape()), text);
  }
  for (size_t p = 0; p < info.profiles.size(); ++p) {
    const ProfileInfo& pi = info.profiles[p];
    std::cout << fmt::format("profile {}:\n", p);
    for (const auto& [name, r] : pi.ranges)
      std::cout << fmt::format("  {:<30} min [{}] opt [{}] max [{}]\n", name, shape_to_string(r.min), shape_to_string(r.opt),
                               shape_to_string(r.max));
    std::cout << fmt::format("  memory at max: activations {}, workspace {}\n",
                             human(static_cast<double>(pi.activation_bytes), "B"), human(static_cast<double>(pi.workspace_bytes), "B"));
  }
  std::cout << fmt::format("layers ({}{}):\n", info.layers.size(), info.profiles.empty() ? "" : ", at profile 0's opt shapes");
  for (size_t i = 0; i < info.layers.size(); ++i) {
    const LayerInfo& l = info.layers[i];
    std::cout << fmt::format("  {:<4} {:<18} {:<34} {:<9} {:<22} {}\n", i, l.op, l.name.substr(0, 34), l.precision,
                             "[" + shape_to_string(l.shape) + "]", l.tactic);
    if (!l.members.empty()) {
      std::string members;
      for (const std::string& m : l.members) members += (members.empty() ? "" : ", ") + m;
      std::cout << "         fuses: " << members << "\n";
    }
  }
  if (info.device != "cpu") {
    constexpr size_t kListed = 12;
    std::string cpu_list;
    for (size_t i = 0; i < on_cpu.size() && i < kListed; ++i) cpu_list += (cpu_list.empty() ? ": " : ", ") + on_cpu[i];
    if (on_cpu.size() > kListed) cpu_list += fmt::format(", and {} more", on_cpu.size() - kListed);
    std::cout << fmt::format("partition: {} layer(s) on the GPU, {} on the CPU engine{}\n", info.layers.size() - on_cpu.size(),
                             on_cpu.size(), cpu_list);
    if (!info.data_dependent_nodes.empty()) {
      std::cout << "  from " << compiler::named_nodes(info.data_dependent_nodes) << " on, the CPU engine runs every node after the GPU's part (output shapes that "
                << "depend on the data)\n";
    }
  }
  if (info.device == "cpu")
    std::cout << fmt::format("memory: weights {} (activations are planned for each input shape as it runs)\n",
                             human(static_cast<double>(info.weight_bytes), "B"));
  else
    std::cout << fmt::format("memory: weights {}, activations {}, workspace {} (per context)\n",
                             human(static_cast<double>(info.weight_bytes), "B"),
                             human(static_cast<double>(info.activation_bytes), "B"),
                             human(static_cast<double>(info.workspace_bytes), "B"));
  if (!info.profiles.empty())
    std::cout << fmt::format("device memory with one context, after its first run: about {} (weights and buffers in whole "
                             "pages, library state)\n",
                             human(static_cast<double>(info.device_memory_bytes), "B"));
  if (dynamic)
    std::cout << "FLOPs: not counted, the engine's dims are dynamic (kiln inspect MODEL.onnx --shapes counts them)\n";
  else
    std::cout << fmt::format("FLOPs: {}\n", human(flops, "FLOP"));
  for (const std::string& k : info.int8_kept_float) std::cout << "kept in float: " << k << "\n";
  return 0;
}

int inspect(const InspectOptions& o) {
  if (is_engine_file(o.model)) return inspect_engine(o);
  const JsonOutput json(o.json);
  ir::Graph g = onnx_import::import_file(o.model);
  // Optimize while the dims are still symbolic (the graph a dynamic engine runs), then bind
  // them only to make the shapes and FLOPs shown concrete.
  std::vector<std::string> notes;
  if (o.optimize) {
    compiler::PassOptions pass_options;
    pass_options.log = [&notes](const std::string& note) { notes.push_back(note); };
    compiler::optimize(g, pass_options);
  }
  std::vector<std::string> defaulted;
  std::map<std::string, std::string> declared = bind_dims(g, o, defaulted);
  fill_shapes_by_folding(g);
  int64_t total_flops = 0;
  nlohmann::json layers = nlohmann::json::array();
  for (const ir::Node& n : g.nodes) {
    int64_t f = ir::node_flops(g, n);
    total_flops += f;
    nlohmann::json l = {{"name", n.name}, {"op", n.op}, {"flops", f}};
    for (const std::string& in : n.inputs) l["inputs"].push_back({{"name", in}, {"type", in.empty() ? "" : type_string(g, in)}});
    for (const std::string& out : n.outputs) l["outputs"].push_back({{"name", out}, {"type", out.empty() ? "" : type_string(g, out)}});
    layers.push_back(l);
  }
  if (json.wanted()) {
    nlohmann::json j;
    j["model"] = o.model;
    j["opset"] = g.opset;
    for (const std::string& in : g.inputs)
      j["inputs"].push_back({{"name", in}, {"declared_type", declared[in]}, {"type", type_string(g, in)}});
    j["dims_bound_to_1"] = defaulted;
    for (const std::string& out : g.outputs) j["outputs"].push_back({{"name", out}, {"type", type_string(g, out)}});
    j["layers"] = layers;
    j["parameters"] = g.parameter_count();
    j["parameter_bytes"] = g.parameter_bytes();
    j["flops"] = total_flops;
    if (o.optimize) j["pass_notes"] = notes;
    json.write(j);
    return 0;
  }
  std::cout << fmt::format("model: {} (opset {}{})\n", o.model, g.opset, o.optimize ? ", after kiln's passes" : "");
  std::cout << "inputs:\n";
  for (const std::string& in : g.inputs) {
    std::string now = type_string(g, in);
    std::cout << fmt::format("  {:<30} {}{}\n", in, declared[in], now == declared[in] ? "" : "  (bound to " + now + ")");
  }
  std::cout << "outputs:\n";
  for (const std::string& out : g.outputs) std::cout << fmt::format("  {:<30} {}\n", out, type_string(g, out));
  std::cout << fmt::format("layers ({}):\n", g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    std::string outs;
    for (const std::string& out : n.outputs) if (!out.empty()) outs += (outs.empty() ? "" : ", ") + type_string(g, out);
    int64_t f = layers[i]["flops"].get<int64_t>();
    std::cout << fmt::format("  {:<4} {:<22} {:<36} -> {:<28} {}\n", i, n.op, n.name.substr(0, 36), outs,
                             f ? human(static_cast<double>(f), "FLOP") : "");
  }
  std::cout << fmt::format("parameters: {} ({})\n", g.parameter_count(), human(static_cast<double>(g.parameter_bytes()), "B"));
  std::cout << fmt::format("FLOPs: {} ({} total)\n", human(static_cast<double>(total_flops), "FLOP"), total_flops);
  if (!defaulted.empty()) {
    std::string list;
    for (const std::string& d : defaulted) list += (list.empty() ? "" : ", ") + d;
    std::cout << fmt::format("note: dynamic dimensions bound to 1 for shapes and FLOPs: {} (choose with --dim NAME=VALUE or --shapes INPUT:DxDxD)\n", list);
  }
  if (o.verbose)
    for (const std::string& note : notes) std::cout << "note: " << note << "\n";
  return 0;
}
}  // namespace

void add_inspect_command(CLI::App& app, std::function<int()>& action) {
  auto opts = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show a model's or an engine file's inputs, outputs, layers with shapes, "
                                                 "(engines: precision, tactic and memory), parameters and FLOPs");
  cmd->add_option("model", opts->model, "ONNX model file, or engine file")->required();
  cmd->add_flag("--optimize", opts->optimize, "Show the graph after kiln's passes (folding and fusion)");
  cmd->add_flag("-v,--verbose", opts->verbose, "With --optimize: say which patterns the passes did not fuse, and why");
  cmd->add_option("--json", opts->json, "JSON instead of text, to FILE, or to standard output when given alone or as -")
      ->expected(0, 1)
      ->default_str("-");
  cmd->add_option("--dim", opts->dims, "Bind a dynamic dimension, e.g. --dim N=8 (repeatable; unbound ones are 1)");
  cmd->add_option("--shapes", opts->shapes, "Bind input shapes, e.g. --shapes input:1x3x224x224,mask:1x128");
  cmd->callback([opts, &action] { action = [opts] { return inspect(*opts); }; });
}

}  // namespace kiln::tools
