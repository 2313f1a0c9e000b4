// The INT8 pass (see quantize_graph.h).
#include "compiler/quantize_graph.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ir/activation.h"
#include "compiler/gemm_as_conv.h"

namespace kiln::compiler {

namespace {

bool is_conv(const ir::Node& n) {
  return (n.op == "Conv" && n.domain.empty()) || (n.op == "FusedConv" && n.domain == "kiln");
}

// Activations an FP8 convolution's epilogue has: cuDNN's pointwise ops, which its FP8 graph
// engines fuse (the only FP8 convolutions on the GPU).
bool fp8_epilogue_has(const std::string& kind) {
  for (const char* k : {"", "Relu", "Clip", "LeakyRelu", "Sigmoid", "SiLU", "Tanh", "Gelu", "GeluTanh"})
    if (kind == k) return true;
  return false;
}

// Activations an INT8 convolution's epilogue has: every one of ir::Activation. The CPU engine
// applies any; on the GPU, HardSwish and HardSigmoid, which cuDNN's pointwise ops lack, run on
// kiln's INT8 kernels and CUTLASS's products (cuda/layers/quantized_conv.cc).
bool int8_epilogue_has(const std::string& kind) {
  return fp8_epilogue_has(kind) || kind == "HardSwish" || kind == "HardSigmoid";
}

// "" when the conv can be quantized, else why not.
std::string why_float(const ir::Graph& g, const ir::Node& n, const std::map<std::string, float>& scales,
                      const std::set<std::string>& pinned, const QuantizeTarget& target) {
  if (pinned.count(n.name)) return "pinned to float";
  const ir::Value* x = g.find_value(n.inputs[0]);
  if (!x || x->type.dtype != DType::kFloat32 || x->type.rank() != 4) return "input is not a float32 NCHW tensor";
  const Tensor* w = g.constant(n.inputs[1]);
  if (!w || w->dtype() != DType::kFloat32 || w->rank() != 4) return "weights are not a constant float32 4-D tensor";
  const int64_t group = n.attrs.get_int("group", 1);
  const int64_t out_c = w->dim(0), in_c = w->dim(1);
  const bool depthwise = group != 1 && in_c == 1 && out_c == group;
  if (group != 1 && !target.grouped_convolutions) {
    if (depthwise) {
      if (!target.depthwise_convolutions) return "grouped convolution (depthwise; no INT8 layer for it on this device)";
      if (out_c % 16 != 0) return std::to_string(out_c) + " depthwise channels (INT8 needs multiples of 16)";
    } else {
      if (!target.gpu_grouped_convolutions) return "grouped convolution (no INT8 layer for it on this device)";
      const int64_t width = in_c;
      if (out_c / group != width || (width != 4 && width != 8 && width != 16 && width != 32 && width != 64))
        return "grouped convolution of " + std::to_string(width) + " input / " + std::to_string(out_c / group) +
               " output channels per group (the GPU's INT8 kernel takes 4, 8, 16, 32 or 64 of each)";
      if (out_c % 16 != 0) return std::to_string(out_c) + " grouped channels (INT8 needs multiples of 16)";
      if (n.has_input(3)) return "a grouped convolution with a residual input (no INT8 kernel for it on this device)";
    }
  }
  if (group == 1 && (in_c % 16 != 0 || out_c % 16 != 0)) {
    const bool stem = target.few_input_channels && in_c <= 4 && out_c % 16 == 0;
    if (!stem)
      return std::to_string(in_c) + " input / " + std::to_string(out_c) + " output channels (" +
             (target.format == QuantizeFormat::kFloat8E4M3 ? "FP8 needs multiples of 16)"
              : target.few_input_channels                 ? "INT8 needs multiples of 16, or 1 to 4 input channels)"
                                                          : "INT8 needs multiples of 16)");
    if (w->numel() / (out_c * in_c) > 64) return "a filter of more than 64 taps over " + std::to_string(in_c) + " input channels";
    if (n.has_input(3)) return "a residual input to a convolution of " + std::to_string(in_c) + " input channels";
  }
  const bool fp8 = target.format == QuantizeFormat::kFloat8E4M3;
  if (!(fp8 ? fp8_epilogue_has : int8_epilogue_has)(n.attrs.get_string("activation", "")))
    return std::string("activation has no ") + (fp8 ? "FP8" : "INT8") + " epilogue";
  if (n.has_input(3)) {
    const ir::Value* z = g.find_value(n.inputs[3]);
    if (!z || z->type.dtype != DType::kFloat32) return "residual is not float32";
  }
  auto s = scales.find(n.inputs[0]);
  if (s == scales.end() || !(s->second > 0)) return "no calibrated scale for its input " + n.inputs[0];
  return "";
}

Tensor scalar(DType dtype) { return Tensor(dtype, {}); }

// Values calibration never saw, because passes made them after calibration's graph, take the
// scale of a value holding the same elements: a layout op's output (Reshape, Transpose and the
// like) that of its input, and a node naming the values it replaced (same_values_as, as
// kiln::StridedAttention's output, written in the layout its output projection reads) that of
// the first with one. Without it that projection would stay float for want of a scale. The
// nodes are in topological order, so chains of views inherit along their length.
void scales_for_uncalibrated_values(const ir::Graph& g, std::map<std::string, float>& scales) {
  for (const ir::Node& n : g.nodes) {
    if (n.outputs.empty() || n.outputs[0].empty()) continue;
    for (const std::string& like : n.attrs.get_strings("same_values_as")) {
      auto s = scales.find(like);
      if (s == scales.end()) continue;
      scales.emplace(n.outputs[0], s->second);
      break;
    }
    if (!n.domain.empty() || n.inputs.empty()) continue;
    if (n.op != "Reshape" && n.op != "Transpose" && n.op != "Flatten" && n.op != "Squeeze" && n.op != "Unsqueeze" &&
        n.op != "Identity")
      continue;
    auto s = scales.find(n.inputs[0]);
    if (s != scales.end()) scales.emplace(n.outputs[0], s->second);  // a calibrated scale stays
  }
}

}  // namespace

QuantizeGraphReport quantize_graph(ir::Graph& g, const std::map<std::string, float>& calibrated,
                                   const std::set<std::string>& pinned,
                                   const std::map<std::string, QdqWeight>* model_weights, const QuantizeTarget& target) {
  QuantizeGraphReport report;
  std::map<std::string, float> scales = calibrated;  // and those of the values the rewrite adds
  scales_for_uncalibrated_values(g, scales);
  const bool fp8 = target.format == QuantizeFormat::kFloat8E4M3;
  report.matrix_products =
      rewrite_gemms_as_convs(g, scales, pinned, fp8 ? fp8_epilogue_has : int8_epilogue_has, report.kept_float);
  const DType q_type = fp8 ? DType::kFloat8E4M3FN : DType::kInt8;
  // Calibrated scales map the threshold to 127; E4M3's largest value is 448.
  if (fp8)
    for (auto& [name, scale] : scales) scale *= 127.f / 448.f;
  std::set<size_t> chosen;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    if (!is_conv(n)) continue;
    std::string why = why_float(g, n, scales, pinned, target);
    if (why.empty()) chosen.insert(i);
    else report.kept_float.push_back(n.name + ": " + why);
  }

  // Values that stay int8: written by a chosen conv, scaled, read only by chosen convs as X or Z,
  // or by MaxPools whose outputs are read only so. A MaxPool commutes with quantization
  // (rounding and saturation are monotonic), so it runs on the int8 tensor and its output keeps
  // the input's scale: ResNet's stem conv -> MaxPool -> blocks stays int8 throughout.
  auto read_as_int8 = [&](const std::string& v) {
    if (g.is_graph_output(v)) return false;
    for (int c : g.consumers(v)) {
      const ir::Node& r = g.nodes[static_cast<size_t>(c)];
      if (!chosen.count(static_cast<size_t>(c))) return false;
      for (size_t k = 0; k < r.inputs.size(); ++k)
        if (r.inputs[k] == v && k != 0 && k != 3) return false;
    }
    return true;
  };
  auto int8_max_pool = [&](int c, const std::string& v) {
    if (fp8) return false;  // E4M3 bytes do not order as their values (sign and magnitude)
    const ir::Node& r = g.nodes[static_cast<size_t>(c)];
    if (r.op != "MaxPool" || !r.domain.empty() || r.inputs.empty() || r.inputs[0] != v) return false;
    for (size_t k = 1; k < r.outputs.size(); ++k)  // Indices, if asked for, must go unused
      if (!r.outputs[k].empty() && (g.is_graph_output(r.outputs[k]) || !g.consumers(r.outputs[k]).empty())) return false;
    return read_as_int8(r.outputs[0]);
  };
  std::set<std::string> int8_values;
  std::vector<std::pair<std::string, std::string>> int8_pools;  // (input, output) of MaxPools on int8
  for (size_t i : chosen) {
    const std::string& y = g.nodes[i].outputs[0];
    auto s = scales.find(y);
    if (s == scales.end() || !(s->second > 0) || g.is_graph_output(y)) continue;
    bool all = true, pooled = false;
    for (int c : g.consumers(y)) {
      if (int8_max_pool(c, y)) {
        pooled = true;
        continue;
      }
      const ir::Node& r = g.nodes[static_cast<size_t>(c)];
      bool ok = chosen.count(static_cast<size_t>(c)) != 0;
      for (size_t k = 0; ok && k < r.inputs.size(); ++k)
        if (r.inputs[k] == y && k != 0 && k != 3) ok = false;
      all = all && ok;
    }
    if (!all) continue;
    int8_values.insert(y);
    if (pooled)
      for (int c : g.consumers(y))
        if (int8_max_pool(c, y)) int8_pools.push_back({y, g.nodes[static_cast<size_t>(c)].outputs[0]});
  }
  for (const auto& [in, out] : int8_pools) {
    scales[out] = scales.at(in);
    int8_values.insert(out);
    g.value(out).type.dtype = DType::kInt8;
  }
  report.int8_values = static_cast<int>(int8_values.size());
  report.int8_pools = static_cast<int>(int8_pools.size());

  std::map<std::string, std::string> quantized_inputs;  // float value -> its QuantizeLinear output
  std::vector<ir::Node> added;
  auto quantized_input = [&](const std::string& x) -> std::string {
    auto done = quantized_inputs.find(x);
    if (done != quantized_inputs.end()) return done->second;
    Tensor s = scalar(DType::kFloat32);
    *s.data<float>() = scales.at(x);
    Tensor zp = scalar(q_type);
    *static_cast<uint8_t*>(zp.raw()) = 0;  // 0 in int8 and in E4M3
    ir::Node q;
    q.op = "QuantizeLinear";
    q.name = g.unique_name(x + "_quantize");
    q.inputs = {x, g.add_constant(x + "_scale", std::move(s)), g.add_constant(x + "_zero_point", std::move(zp))};
    q.outputs = {g.unique_name(x + (fp8 ? "_fp8" : "_int8"))};
    ir::Value v;
    v.name = q.outputs[0];
    v.type = g.value(x).type;
    v.type.dtype = q_type;
    g.set_value(v);
    added.push_back(q);
    ++report.quantize_nodes;
    return quantized_inputs[x] = q.outputs[0];
  };

  for (size_t i : chosen) {
    ir::Node& n = g.nodes[i];
    const Tensor& w = *g.constant(n.inputs[1]);
    const int64_t out_c = w.dim(0);
    Tensor wq(q_type, w.shape());
    std::vector<float> w_scales(static_cast<size_t>(out_c));
    const QdqWeight* given = nullptr;
    if (model_weights && !fp8) {
      auto it = model_weights->find(n.inputs[1]);
      if (it != model_weights->end() && it->second.values.shape() == w.shape() &&
          std::memcmp(it->second.values.raw(), w.raw(), w.nbytes()) == 0)
        given = &it->second;
    }
    if (given) {
      // The model's own integers: w = int8 * scale exactly, so w / scale rounds back to them.
      w_scales = given->scales;
      const int64_t inner = w.numel() / out_c;
      for (int64_t e = 0; e < w.numel(); ++e)
        wq.data<int8_t>()[e] = static_cast<int8_t>(
            std::clamp(std::nearbyint(w.data<float>()[e] / w_scales[static_cast<size_t>(e / inner)]), -128.f, 127.f));
      ++report.model_weights;
    } else if (fp8) {
      ir::quantize_per_channel_float8(w.data<float>(), w.numel(), out_c, w.numel() / out_c, static_cast<uint8_t*>(wq.raw()),
                                  w_scales.data());
    } else {
      ir::quantize_per_channel(w.data<float>(), w.numel(), out_c, w.numel() / out_c, wq.data<int8_t>(), w_scales.data());
    }

    const std::string x = n.inputs[0];
    n.inputs[0] = int8_values.count(x) ? x : quantized_input(x);
    n.inputs[1] = g.add_constant(n.name + (fp8 ? "_weight_fp8" : "_weight_int8"), std::move(wq));
    n.attrs.set("x_scale", scales.at(x));
    n.attrs.set("w_scales", w_scales);
    if (n.has_input(3) && int8_values.count(n.inputs[3])) n.attrs.set("z_scale", scales.at(n.inputs[3]));
    const std::string& y = n.outputs[0];
    if (int8_values.count(y)) {
      n.attrs.set("y_scale", scales.at(y));
      g.value(y).type.dtype = q_type;
    }
    if (n.op == "Conv") ir::Activation{}.store(n);
    n.op = "QConv";
    n.domain = "kiln";
    ++report.quantized;
  }
  g.nodes.insert(g.nodes.end(), added.begin(), added.end());
  g.topological_sort();
  g.prune_values();
  return report;
}

}  // namespace kiln::compiler
