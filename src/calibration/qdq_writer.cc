// The QDQ model writer (see qdq_writer.h).
#include "calibration/qdq_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "kiln/error.h"
#include "onnx.pb.h"
#include "ops/quantize.h"

namespace kiln::calibration {

namespace {

bool is_quantized_layer(const std::string& op) { return op == "Conv" || op == "Gemm" || op == "MatMul"; }

int64_t get_int(const onnx::NodeProto& n, const std::string& attr, int64_t fallback) {
  for (const auto& a : n.attribute())
    if (a.name() == attr) return a.i();
  return fallback;
}

std::vector<float> float_data(const onnx::TensorProto& t) {
  int64_t count = 1;
  for (int64_t d : t.dims()) count *= d;
  std::vector<float> v(static_cast<size_t>(count));
  if (!t.raw_data().empty()) {
    if (t.raw_data().size() != v.size() * sizeof(float)) throw Error(ErrorKind::kInvalidModel, "initializer '" + t.name() + "' has the wrong size");
    std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
  } else {
    if (t.float_data_size() != count) throw Error(ErrorKind::kInvalidModel, "initializer '" + t.name() + "' has the wrong size");
    std::copy(t.float_data().begin(), t.float_data().end(), v.begin());
  }
  return v;
}

onnx::TensorProto scalar_or_vector(const std::string& name, int data_type, const std::vector<int64_t>& dims,
                                   const void* data, size_t bytes) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(data_type);
  for (int64_t d : dims) t.add_dims(d);
  t.set_raw_data(std::string(static_cast<const char*>(data), bytes));
  return t;
}

class Writer {
 public:
  Writer(onnx::ModelProto& model, const CalibrationCache& cache, QdqReport& report)
      : model_(model), graph_(*model.mutable_graph()), cache_(cache), report_(report) {
    for (int i = 0; i < graph_.initializer_size(); ++i) initializers_[graph_.initializer(i).name()] = i;
    for (const auto& n : graph_.node())
      for (const auto& in : n.input()) ++uses_[in];
    for (const auto& o : graph_.output()) ++uses_[o.name()];
  }

  void run() {
    std::vector<onnx::NodeProto> nodes(graph_.node().begin(), graph_.node().end());
    graph_.clear_node();
    for (onnx::NodeProto& n : nodes) {
      if (is_quantized_layer(n.op_type()) && n.input_size() >= 2) {
        bool any = false;
        // Activation inputs: X (and B of a MatMul whose B is computed).
        for (int i : {0, 1}) {
          const std::string& in = n.input(i);
          if (in.empty() || initializers_.count(in)) continue;
          if (i == 1 && n.op_type() != "MatMul") continue;
          auto scale = cache_.scales.find(in);
          if (scale == cache_.scales.end()) {
            ++report_.missing_scales;
            continue;
          }
          n.set_input(i, quantized_activation(in, scale->second));
          any = true;
        }
        // Weights: input 1 when it is a float32 initializer.
        if (initializers_.count(n.input(1))) {
          const onnx::TensorProto& w = graph_.initializer(initializers_.at(n.input(1)));
          if (w.data_type() == onnx::TensorProto::FLOAT && w.dims_size() >= 2) {
            int64_t axis = 0;  // Conv: [K, C/g, ...]
            if (n.op_type() == "Gemm") axis = get_int(n, "transB", 0) ? 0 : 1;
            if (n.op_type() == "MatMul") axis = w.dims_size() - 1;
            n.set_input(1, quantized_weight(n.input(1), axis));
            any = true;
          }
        }
        report_.layers += any;
      }
      *graph_.add_node() = n;
    }
    // Float weights that nothing reads any more.
    std::vector<onnx::TensorProto> kept;
    for (const auto& t : graph_.initializer())
      if (!replaced_.count(t.name()) || uses_[t.name()] > replaced_uses_[t.name()]) kept.push_back(t);
    graph_.clear_initializer();
    for (auto& t : kept) *graph_.add_initializer() = std::move(t);
    for (auto& t : added_) *graph_.add_initializer() = std::move(t);
  }

 private:
  std::string quantized_activation(const std::string& tensor, float scale) {
    auto done = activations_.find(tensor);
    if (done != activations_.end()) return done->second;
    const std::string base = unique(tensor + "_qdq");
    const int8_t zero = 0;
    added_.push_back(scalar_or_vector(base + "_scale", onnx::TensorProto::FLOAT, {}, &scale, sizeof scale));
    added_.push_back(scalar_or_vector(base + "_zero_point", onnx::TensorProto::INT8, {}, &zero, 1));
    onnx::NodeProto* q = graph_.add_node();
    q->set_op_type("QuantizeLinear");
    q->set_name(base + "_quantize");
    q->add_input(tensor), q->add_input(base + "_scale"), q->add_input(base + "_zero_point");
    q->add_output(base + "_int8");
    onnx::NodeProto* dq = graph_.add_node();
    dq->set_op_type("DequantizeLinear");
    dq->set_name(base + "_dequantize");
    dq->add_input(base + "_int8"), dq->add_input(base + "_scale"), dq->add_input(base + "_zero_point");
    dq->add_output(base + "_dequantized");
    ++report_.activations;
    return activations_[tensor] = base + "_dequantized";
  }

  std::string quantized_weight(const std::string& name, int64_t axis) {
    ++replaced_uses_[name];
    auto done = weights_.find(name);
    if (done != weights_.end()) return done->second;
    replaced_.insert(name);
    const onnx::TensorProto& w = graph_.initializer(initializers_.at(name));
    const std::vector<float> v = float_data(w);
    std::vector<int64_t> dims(w.dims().begin(), w.dims().end());
    const int64_t channels = dims[static_cast<size_t>(axis)];
    int64_t inner = 1;
    for (size_t d = static_cast<size_t>(axis) + 1; d < dims.size(); ++d) inner *= dims[d];
    std::vector<float> scale(static_cast<size_t>(channels));
    std::vector<int8_t> q(v.size());
    ir::quantize_per_channel(v.data(), static_cast<int64_t>(v.size()), channels, inner, q.data(), scale.data());
    std::vector<int8_t> zeros(static_cast<size_t>(channels), 0);
    const std::string base = unique(name + "_int8");
    added_.push_back(scalar_or_vector(base, onnx::TensorProto::INT8, dims, q.data(), q.size()));
    added_.push_back(scalar_or_vector(base + "_scale", onnx::TensorProto::FLOAT, {channels}, scale.data(), scale.size() * 4));
    added_.push_back(scalar_or_vector(base + "_zero_point", onnx::TensorProto::INT8, {channels}, zeros.data(), zeros.size()));
    onnx::NodeProto* dq = graph_.add_node();
    dq->set_op_type("DequantizeLinear");
    dq->set_name(base + "_dequantize");
    dq->add_input(base), dq->add_input(base + "_scale"), dq->add_input(base + "_zero_point");
    dq->add_output(base + "_dequantized");
    onnx::AttributeProto* a = dq->add_attribute();
    a->set_name("axis");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(axis);
    ++report_.weights;
    report_.float_weight_bytes += static_cast<int64_t>(v.size() * 4);
    report_.int8_weight_bytes += static_cast<int64_t>(q.size() + static_cast<size_t>(channels) * 5);
    return weights_[name] = base + "_dequantized";
  }

  // A name no value of the graph has yet.
  std::string unique(const std::string& want) {
    std::string name = want;
    for (int i = 1; uses_.count(name) || initializers_.count(name) || taken_.count(name); ++i) name = want + "_" + std::to_string(i);
    taken_.insert(name);
    return name;
  }

  onnx::ModelProto& model_;
  onnx::GraphProto& graph_;
  const CalibrationCache& cache_;
  QdqReport& report_;
  std::map<std::string, int> initializers_;
  std::map<std::string, int> uses_, replaced_uses_;
  std::set<std::string> replaced_, taken_;
  std::map<std::string, std::string> activations_, weights_;
  std::vector<onnx::TensorProto> added_;
};

}  // namespace

std::string write_qdq_model(const std::string& onnx_bytes, const std::string& name, const CalibrationCache& cache,
                            QdqReport& report) {
  onnx::ModelProto model;
  if (!model.ParseFromString(onnx_bytes)) throw Error(ErrorKind::kInvalidModel, name + " is not a valid ONNX model");
  int64_t opset = 0;
  for (const auto& o : model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  if (opset < 13)
    throw Error(ErrorKind::kUnsupported, name + " uses ONNX opset " + std::to_string(opset) +
                                             "; per-channel DequantizeLinear needs opset 13 or later")
        .hint("re-export with opset_version=17");
  if (!model.graph().sparse_initializer().empty())
    throw Error(ErrorKind::kUnsupported, name + " has sparse initializers, which kiln quantize does not handle");
  Writer(model, cache, report).run();
  std::string out;
  if (!model.SerializeToString(&out)) throw Error(ErrorKind::kInternal, "could not serialize the QDQ model of " + name);
  return out;
}

}  // namespace kiln::calibration
