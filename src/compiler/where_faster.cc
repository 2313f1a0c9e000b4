#include "compiler/where_faster.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "compiler/pipeline.h"
#include "passes/rewrite.h"

namespace kiln::compiler {

std::map<std::string, double> median_layer_ms(const std::vector<std::vector<LayerTiming>>& runs) {
  std::map<std::string, std::vector<double>> samples;
  for (const auto& run : runs) {
    std::map<std::string, double> summed;  // a name may repeat within a run (a split layer)
    for (const LayerTiming& t : run) summed[t.name] += t.ms;
    for (const auto& [name, ms] : summed) samples[name].push_back(ms);
  }
  std::map<std::string, double> out;
  for (auto& [name, v] : samples) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    out[name] = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }
  return out;
}

namespace {

double time_of(const std::map<std::string, double>& ms, const std::string& name) {
  auto it = ms.find(name);
  return it == ms.end() ? 0.0 : it->second;
}

// Reformats of the layer's input and output values, which the builder adds where formats differ.
double reformats_of(const ir::Node& n, const std::map<std::string, double>& ms) {
  double total = 0;
  for (const std::string& v : n.inputs)
    if (!v.empty()) total += time_of(ms, "reformat(" + v + ")");
  for (const std::string& v : n.outputs)
    if (!v.empty()) total += time_of(ms, "reformat(" + v + ")");
  return total;
}

}  // namespace

std::vector<QuantizedLayerCost> compare_quantized_layers(const ir::Graph& g, const std::map<std::string, double>& quantized_ms,
                                                         const std::map<std::string, double>& fp16_ms) {
  // The float name a QuantizeLinear output stands for, to find the fp16 engine's reformats.
  std::map<std::string, const ir::Node*> quantize_of;
  for (const ir::Node& n : g.nodes)
    if (n.op == "QuantizeLinear" && n.domain.empty() && !n.outputs.empty()) quantize_of[n.outputs[0]] = &n;
  // Attentions writing int8 (passes/fuse_attention_quantize.cc), by their output and the
  // reshapes of it: what the int8 output costs over the fp16 engine's float one counts to the
  // convolutions reading it, as the quantize layer's time would.
  std::map<std::string, const ir::Node*> int8_attention_of;
  for (const ir::Node& n : g.nodes) {  // in topological order
    if (n.op == "StridedAttention" && n.domain == "kiln" && n.inputs.size() > 4 && !n.inputs[4].empty() && !n.outputs.empty())
      int8_attention_of[n.outputs[0]] = &n;
    else if (passes::reshapes_only(n) && !n.inputs.empty() && !n.outputs.empty() && int8_attention_of.count(n.inputs[0]))
      int8_attention_of[n.outputs[0]] = int8_attention_of.at(n.inputs[0]);
  }
  std::vector<QuantizedLayerCost> costs;
  for (const ir::Node& n : g.nodes) {
    if (n.op != "QConv" || n.domain != "kiln") continue;
    auto half = fp16_ms.find(n.name);
    auto own = quantized_ms.find(n.name);
    if (half == fp16_ms.end() || own == quantized_ms.end()) continue;
    QuantizedLayerCost c;
    c.layer = n.name;
    c.quantized_ms = own->second;
    c.added_ms = reformats_of(n, quantized_ms);
    auto q = n.inputs.empty() ? quantize_of.end() : quantize_of.find(n.inputs[0]);
    ir::Node as_float = n;  // the layer as the fp16 engine has it: float input, not the quantized one
    if (q != quantize_of.end()) {
      int readers = 0;
      for (int r : g.consumers(q->first)) readers += g.nodes[static_cast<size_t>(r)].op == "QConv";
      c.added_ms += (time_of(quantized_ms, q->second->name) + reformats_of(*q->second, quantized_ms)) / std::max(readers, 1);
      as_float.inputs[0] = q->second->inputs[0];
    } else if (auto a = n.inputs.empty() ? int8_attention_of.end() : int8_attention_of.find(n.inputs[0]);
               a != int8_attention_of.end()) {
      int readers = 0;
      for (int r : g.consumers(a->first)) readers += g.nodes[static_cast<size_t>(r)].op == "QConv";
      c.added_ms += (time_of(quantized_ms, a->second->name) - time_of(fp16_ms, a->second->name)) / std::max(readers, 1);
    }
    c.fp16_ms = half->second + reformats_of(as_float, fp16_ms);
    costs.push_back(c);
  }
  return costs;
}

std::vector<std::string> quantized_layers_in_order(const ir::Graph& g) {
  std::vector<std::string> out;
  for (const ir::Node& n : g.nodes)
    if (n.op == "QConv" && n.domain == "kiln") out.push_back(n.name);
  return out;
}

std::vector<size_t> leading_region_lengths(const std::vector<std::string>& order, const std::set<std::string>& slower) {
  size_t before_first_slower = 0;
  while (before_first_slower < order.size() && !slower.count(order[before_first_slower])) ++before_first_slower;
  std::vector<size_t> lengths;
  for (size_t length : {size_t{1}, before_first_slower})
    if (length >= 1 && length < order.size() && std::find(lengths.begin(), lengths.end(), length) == lengths.end())
      lengths.push_back(length);
  return lengths;
}

namespace {

// Profiled runs whose median is each layer's time (where layers are not timed in CUDA graphs).
constexpr int kLayerRuns = 9;
// Rounds of pinning the layers whose quantized form is slower and building the mixed engine.
constexpr int kMaxRounds = 3;
// Whole engines: rounds in turns, each the median of this many replays.
constexpr int kWholeEngineRounds = 11;
constexpr int kReplaysPerSample = 20;

// The middle one of timing samples (the upper of the two middle ones for an even count).
double middle_sample(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

// `kiln build --int8` and `--fp8` on the GPU: quantized layers only where they are faster
// (where_faster.h). Builds the engine with every eligible layer quantized and the fp16 one,
// times both layer by layer, builds the mixed engine (fp16 where the quantized form lost;
// tactics already timed) and compares its own quantized layers again (up to three rounds),
// builds engines quantized only from the input to a point (leading_region_lengths), times
// the whole engines in turns and returns the fastest, its report naming the layers kept in
// fp16 and why. The per-layer sums are optimistic (ResNet-50 FP8 at batch 128: a mixed engine
// 0.56 ms slower than fp16, docs/design/fp8.md, "FP8 only where faster"), hence the last step.
CompiledEngine build_quantized_where_faster(const std::string& bytes, const std::string& name, const std::string& base_dir,
                                            const BuildOptions& options) {
  const bool fp8 = options.precision == Precision::kFp8;
  const std::string tag = fp8 ? "fp8" : "int8", format = fp8 ? "FP8" : "INT8";
  auto log = [&](const std::string& line) {
    if (options.log) options.log(line);
  };
  // Imported and optimized once (a QDQ model's pairs absorbed into `qdq`); every candidate
  // quantizes a copy.
  QdqScales qdq;
  const ir::Graph float_model = float_graph(bytes, name, base_dir, options, qdq);
  // The engine of `o`'s quantized copy, and what that copy kept in float.
  auto build_quantized = [&](const BuildOptions& o, const std::map<std::string, std::string>& tactics,
                             std::vector<std::string>& kept) {
    ir::Graph g = float_model;
    quantize_for_precision(g, name, o, qdq, kept);  // before make_engine copies `kept`
    return std::make_shared<CompiledEngine>(assemble(std::move(g), name, o, {}, tactics, kept));
  };
  std::vector<std::string> kept_all;
  log(tag + ": building the engine with every eligible layer in " + format);
  std::shared_ptr<CompiledEngine> all_quantized = build_quantized(options, {}, kept_all);
  BuildOptions half = options;
  half.precision = Precision::kFp16;
  log(tag + ": building the fp16 engine to time each " + format + " layer against");
  std::shared_ptr<CompiledEngine> fp16 = std::make_shared<CompiledEngine>(assemble(float_model, name, half, {}, {}, {}));

  log(tag + ": timing both engines layer by layer");
  std::map<std::string, double> fp16_ms = median_layer_ms(fp16->engine->timer()->layer_samples(kLayerRuns));
  struct Candidate {
    std::string what;
    std::shared_ptr<CompiledEngine> engine;
    std::map<std::string, std::string> why_fp16;  // its layers in fp16 that could be quantized -> why
    double ms = 0;
  };
  std::vector<Candidate> candidates = {{"every eligible layer in " + format, all_quantized, {}},
                                       {"no " + format + " layer", fp16, {}}};
  // Rounds: compare the quantized layers of the current engine with fp16, pin the slower ones,
  // build again. A layer pinned changes its neighbours' costs (a quantized layer after it now
  // needs its input quantized), so the next round looks at the mixed engine's own times.
  std::map<std::string, std::string> slower;  // layer -> why it stays fp16
  std::set<std::string> slower_in_round_1;     // against fp16 with every neighbour quantized
  std::map<std::string, std::string> tactics = all_quantized->engine->tactics();
  for (const auto& entry : fp16->engine->tactics()) tactics.insert(entry);
  std::shared_ptr<CompiledEngine> current = all_quantized;
  for (int round = 1; round <= kMaxRounds; ++round) {
    const std::vector<QuantizedLayerCost> costs = compare_quantized_layers(
        current->engine->graph(), median_layer_ms(current->engine->timer()->layer_samples(kLayerRuns)), fp16_ms);
    size_t pinned = 0;
    for (size_t i = 0; i < costs.size(); ++i) {
      const QuantizedLayerCost& c = costs[i];
      const std::string line = fmt::format("{} {:.4f} ms + {:.4f} ms quantize/reformat vs fp16 {:.4f} ms", format,
                                           c.quantized_ms, c.added_ms, c.fp16_ms);
      const std::string choice = c.keep_quantized() ? " -> " + format : " -> fp16";
      if (round == 1) log(fmt::format("[{}/{}] {}: ", i + 1, costs.size(), tag) + c.layer + ": " + line + choice);
      if (c.keep_quantized()) continue;
      if (round > 1) log(fmt::format("{} round {}: ", tag, round) + c.layer + ": " + line + choice);
      slower[c.layer] = "fp16 is faster here (" + line + ")";
      if (round == 1) slower_in_round_1.insert(c.layer);
      ++pinned;
    }
    if (pinned == 0 || pinned == costs.size()) break;
    BuildOptions mixed = options;
    for (const auto& [layer, why] : slower) mixed.float_layers.push_back(layer);
    log(fmt::format("{}: building the mixed engine of round {} ({} layers in {})", tag, round, costs.size() - pinned, format));
    std::vector<std::string> kept_mixed;
    current = build_quantized(mixed, tactics, kept_mixed);
    for (const auto& entry : current->engine->tactics()) tactics.insert(entry);
    candidates.push_back({fmt::format("mixed (round {})", round), current, slower});
  }
  // One quantized region from the input on (leading_region_lengths): the rounds above leave
  // islands, each with a quantize layer of its own.
  const std::vector<std::string> order = quantized_layers_in_order(all_quantized->engine->graph());
  for (size_t length : leading_region_lengths(order, slower_in_round_1)) {
    BuildOptions leading = options;
    leading.float_layers.insert(leading.float_layers.end(), order.begin() + static_cast<std::ptrdiff_t>(length), order.end());
    log(fmt::format("{}: building the engine with its first {} layers in {} ({} to {})", tag, length, format, order.front(),
                    order[length - 1]));
    std::vector<std::string> kept_leading;
    std::shared_ptr<CompiledEngine> engine = build_quantized(leading, tactics, kept_leading);
    for (const auto& entry : engine->engine->tactics()) tactics.insert(entry);
    std::map<std::string, std::string> why;
    for (size_t i = length; i < order.size(); ++i) {
      auto it = slower.find(order[i]);
      why[order[i]] = it != slower.end() && slower_in_round_1.count(order[i])
                          ? it->second
                          : "after the leading " + format + " region, whose engine ran fastest";
    }
    candidates.push_back({fmt::format("the first {} layers in {}", length, format), engine, std::move(why)});
  }
  // Whole engines, timed in turns so that clocks and neighbours treat them alike, after a
  // warm-up that brings the clocks up (the GPU idled while the host built); the engines differ by
  // a few percent at batch 1, about what one short sample varies by.
  {
    std::vector<std::unique_ptr<backend::Timer>> timers;
    for (const Candidate& c : candidates) timers.push_back(c.engine->engine->timer());
    for (auto& t : timers) t->latency_samples_ms(kReplaysPerSample);
    std::vector<std::vector<double>> rounds(candidates.size());
    for (int round = 0; round < kWholeEngineRounds; ++round)
      for (size_t i = 0; i < candidates.size(); ++i)
        rounds[i].push_back(middle_sample(timers[i]->latency_samples_ms(kReplaysPerSample)));
    for (size_t i = 0; i < candidates.size(); ++i) {
      candidates[i].ms = middle_sample(std::move(rounds[i]));
      log(fmt::format("{}: whole engine, {}: {:.4f} ms", tag, candidates[i].what, candidates[i].ms));
    }
  }
  const Candidate& best = *std::min_element(candidates.begin(), candidates.end(),
                                            [](const Candidate& a, const Candidate& b) { return a.ms < b.ms; });
  log(tag + ": keeping the engine with " + best.what);
  std::shared_ptr<CompiledEngine> chosen = best.engine;
  std::string summary;
  for (const Candidate& c : candidates) summary += (summary.empty() ? "" : ", ") + c.what + fmt::format(" {:.4f} ms", c.ms);
  if (chosen == fp16) {
    // A quantized engine without quantized layers: what the build measured, said as such.
    chosen->options = options;
    chosen->options.log = nullptr;
    chosen->kept_float = kept_all;
    for (const ir::Node& n : all_quantized->engine->graph().nodes) {
      if (n.op != "QConv" || n.domain != "kiln") continue;
      chosen->options.float_layers.push_back(n.name);
      chosen->kept_float.push_back(n.name + ": the engine without " + format + " layers ran fastest (" + summary + ")");
    }
  } else if (chosen != all_quantized) {
    for (std::string& k : chosen->kept_float) {
      const std::string layer = k.substr(0, k.find(": "));
      if (auto it = best.why_fp16.find(layer); it != best.why_fp16.end()) k = layer + ": " + it->second;
    }
  }
  return std::move(*chosen);
}

}  // namespace kiln::compiler
