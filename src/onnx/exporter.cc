#include "onnx/exporter.h"
#include "onnx/importer.h"

#include <onnx.pb.h>

#include <cstring>
#include <set>

#include "ir/small_types.h"

namespace kiln::onnx_export {
namespace {

void write_type(const ir::TensorType& type, onnx::TypeProto* proto) {
  auto* tensor = proto->mutable_tensor_type();
  tensor->set_elem_type(static_cast<int32_t>(type.dtype));
  if (!type.shape) return;  // rank unknown: no shape field
  auto* shape = tensor->mutable_shape();
  for (const ir::Dim& d : *type.shape) {
    auto* dim = shape->add_dim();
    if (d.known()) dim->set_dim_value(d.value);
    else if (d.symbolic()) dim->set_dim_param(d.symbol);
  }
}

// A tensor's bytes as ONNX files hold them: sub-byte types packed, the rest as stored.
std::string file_bytes(const Tensor& t) {
  if (!packed_bits(t.dtype())) return std::string(static_cast<const char*>(t.raw()), t.nbytes());
  std::string packed(static_cast<size_t>(packed_bytes(t.dtype(), t.numel())), '\0');
  pack_elements(t.dtype(), static_cast<const uint8_t*>(t.raw()), t.numel(), reinterpret_cast<uint8_t*>(packed.data()));
  return packed;
}

void write_tensor(const std::string& name, const Tensor& t, onnx::TensorProto* proto) {
  proto->set_name(name);
  proto->set_data_type(static_cast<int32_t>(t.dtype()));
  for (int64_t d : t.shape()) proto->add_dims(d);
  if (t.dtype() == DType::kString)
    throw Error(ErrorKind::kUnsupported, "constant '" + name + "' holds strings, which the ONNX writer does not write");
  proto->set_raw_data(file_bytes(t));
}

void write_attribute(const std::string& name, const ir::AttrValue& value, onnx::AttributeProto* a) {
  using AP = onnx::AttributeProto;
  a->set_name(name);
  if (auto* i = std::get_if<int64_t>(&value)) {
    a->set_type(AP::INT), a->set_i(*i);
  } else if (auto* f = std::get_if<float>(&value)) {
    a->set_type(AP::FLOAT), a->set_f(*f);
  } else if (auto* s = std::get_if<std::string>(&value)) {
    a->set_type(AP::STRING), a->set_s(*s);
  } else if (auto* is = std::get_if<std::vector<int64_t>>(&value)) {
    a->set_type(AP::INTS);
    for (int64_t v : *is) a->add_ints(v);
  } else if (auto* fs = std::get_if<std::vector<float>>(&value)) {
    a->set_type(AP::FLOATS);
    for (float v : *fs) a->add_floats(v);
  } else if (auto* ss = std::get_if<std::vector<std::string>>(&value)) {
    a->set_type(AP::STRINGS);
    for (const std::string& v : *ss) a->add_strings(v);
  } else if (auto* t = std::get_if<Tensor>(&value)) {
    a->set_type(AP::TENSOR);
    write_tensor("", *t, a->mutable_t());
  }
}

// An initializer's bytes appended to an engine file's weights section (64-byte aligned), the
// tensor pointing there as external data.
// A constant a backend holds packed (ir::Value::packed) is the pack's bytes there, its layout
// named beside the location ("kiln_layout"), its dtype and dims the constant's.
void write_external(const std::string& name, const Tensor& t, const ir::PackedConstant* packed,
                    onnx::TensorProto* proto, std::string& weights) {
  proto->set_name(name);
  proto->set_data_type(static_cast<int32_t>(t.dtype()));
  for (int64_t d : t.shape()) proto->add_dims(d);
  if (t.dtype() == DType::kString)
    throw Error(ErrorKind::kUnsupported, "constant '" + name + "' holds strings, which the engine file does not hold");
  weights.resize((weights.size() + 63) / 64 * 64, '\0');
  const size_t offset = weights.size();
  if (packed) weights.append(static_cast<const char*>(packed->data.raw()), packed->data.nbytes());
  else if (packed_bits(t.dtype())) weights.append(file_bytes(t));
  else weights.append(static_cast<const char*>(t.raw()), t.nbytes());  // no copy of large weights first
  proto->set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* key, const std::string& value) {
    auto* kv = proto->add_external_data();
    kv->set_key(key);
    kv->set_value(value);
  };
  add("location", "kiln:weights");
  add("offset", std::to_string(offset));
  add("length", std::to_string(weights.size() - offset));
  if (packed) add("kiln_layout", packed->layout);
}

// Both forms: a plain ONNX model (`weights` null: kiln's ops refused, data inline), or an
// engine file's graph (kiln's ops in domain "kiln", initializers in `weights`).
std::string write_model(const ir::Graph& graph, const std::string& producer, std::string* weights) {
  onnx::ModelProto model;
  model.set_ir_version(8);  // the version of opsets 18-20; readers of newer opsets read it
  model.set_producer_name(producer);
  model.set_producer_version(KILN_VERSION);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  // A node the passes made of an op newer than the model (attention fusion's Attention, opset
  // 23) raises the opset to the one that op is read from.
  int written = std::max(graph.opset, kMinWrittenOpset);
  for (const ir::Node& node : graph.nodes)
    if (node.domain.empty())
      if (const onnx_import::OpImporter* importer = onnx_import::ImporterRegistry::instance().find(node.op))
        written = std::max(written, importer->since_opset);
  opset->set_version(written);
  if (weights) {
    auto* kiln_opset = model.add_opset_import();
    kiln_opset->set_domain("kiln");
    kiln_opset->set_version(1);
  }

  onnx::GraphProto* g = model.mutable_graph();
  g->set_name(graph.name.empty() ? "kiln" : graph.name);
  std::set<std::string> initializers;
  auto constant_input = [&](const std::string& name) {
    const ir::Value* v = graph.find_value(name);
    if (!v || !v->constant || !initializers.insert(name).second) return;
    if (weights) {
      write_external(name, *v->constant, v->packed.get(), g->add_initializer(), *weights);
    } else {
      if (v->packed)
        throw Error(ErrorKind::kUnsupported, "constant '" + name + "' is held only in the layout " + v->packed->layout +
                                                 " of the engine that packed it, not as ONNX values");
      write_tensor(name, *v->constant, g->add_initializer());
    }
  };
  std::set<std::string> typed;  // inputs and outputs carry their types already
  for (const std::string& name : graph.inputs) {
    auto* in = g->add_input();
    in->set_name(name);
    write_type(graph.value(name).type, in->mutable_type());
    typed.insert(name);
  }
  for (const ir::Node& node : graph.nodes) {
    if (!node.domain.empty() && !weights)
      throw node.error(ErrorKind::kUnsupported, "is kiln's own op " + node.domain + "::" + node.op +
                                                    ", which has no ONNX form (write the model before fusion)");
    auto* n = g->add_node();
    if (!node.domain.empty()) n->set_domain(node.domain);
    n->set_name(node.name);
    n->set_op_type(node.op);
    for (const std::string& in : node.inputs) {
      n->add_input(in);
      if (!in.empty()) constant_input(in);
    }
    for (const std::string& out : node.outputs) n->add_output(out);
    for (const auto& [name, value] : node.attrs.all()) write_attribute(name, value, n->add_attribute());
  }
  for (const std::string& name : graph.outputs) {
    constant_input(name);  // an output that folded to a constant
    auto* out = g->add_output();
    out->set_name(name);
    write_type(graph.value(name).type, out->mutable_type());
    typed.insert(name);
  }
  // The inferred types of intermediate values, so readers need not infer them again.
  for (const ir::Node& node : graph.nodes)
    for (const std::string& out : node.outputs) {
      const ir::Value* v = out.empty() || typed.count(out) ? nullptr : graph.find_value(out);
      if (!v || v->type.dtype == DType::kUndefined) continue;
      auto* info = g->add_value_info();
      info->set_name(out);
      write_type(v->type, info->mutable_type());
    }
  std::string bytes;
  if (!model.SerializeToString(&bytes))
    throw Error(ErrorKind::kInternal, "could not serialize the ONNX model (over 2 GB?)");
  return bytes;
}

}  // namespace

std::string export_model(const ir::Graph& graph, const std::string& producer) {
  return write_model(graph, producer, nullptr);
}

std::string export_engine_graph(const ir::Graph& graph, std::string& weights) {
  return write_model(graph, "kiln", &weights);
}

}  // namespace kiln::onnx_export
