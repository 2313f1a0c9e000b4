// Importer of Constant: turned into an initializer, so no node remains.
#include "onnx/importer.h"

namespace kiln::onnx_import {

namespace {

void import_constant(ImportContext& ctx) {
  const ir::Attributes& a = ctx.node.attrs;
  if (ctx.node.outputs.size() != 1 || ctx.node.outputs[0].empty()) ctx.fail("Constant must have one output");
  if (a.all().size() != 1)
    ctx.fail("Constant must have exactly one of value, value_float(s), value_int(s), value_string(s)");
  Tensor t;
  if (const Tensor* v = a.get_tensor("value")) {
    t = *v;
  } else if (a.has("value_float")) {
    t = Tensor::scalar<float>(a.get_float("value_float", 0.f));
  } else if (a.has("value_floats")) {
    std::vector<float> f = a.get_floats("value_floats");
    t = Tensor::from_vector<float>({static_cast<int64_t>(f.size())}, f);
  } else if (a.has("value_int")) {
    t = Tensor::scalar<int64_t>(a.get_int("value_int", 0));
  } else if (a.has("value_ints")) {
    std::vector<int64_t> v = a.get_ints("value_ints");
    t = Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v);
  } else {
    ctx.unsupported("Constant with attribute '" + a.all().begin()->first +
                    "' is not supported (strings and sparse tensors are not)");
  }
  ir::Value v;
  v.name = ctx.node.outputs[0];
  v.type.dtype = t.dtype();
  v.type.shape = ir::dims_of(t.shape());
  if (t.rank() <= 1 && is_integer(t.dtype()) && t.numel() <= 64) v.symbolic_value = ir::dims_of(t.to_int_vector());
  v.constant = std::move(t);
  ctx.graph.set_value(std::move(v));
}

}  // namespace

KILN_REGISTER_IMPORTERS(constant) {
  registry.add({"Constant", kOldestOpset, import_constant});
}

}  // namespace kiln::onnx_import
