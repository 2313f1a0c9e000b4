#include "ir/graph.h"

#include <algorithm>
#include <unordered_set>

namespace kiln::ir {

std::string dims_to_string(const Dims& dims) {
  if (dims.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += "x";
    s += dims[i].str();
  }
  return s;
}

bool all_known(const Dims& dims) {
  return std::all_of(dims.begin(), dims.end(), [](const Dim& d) { return d.known(); });
}

std::vector<int64_t> known_values(const Dims& dims) {
  std::vector<int64_t> out;
  out.reserve(dims.size());
  for (const Dim& d : dims) {
    if (!d.known()) throw Error(ErrorKind::kInternal, "dimension " + d.str() + " is not known");
    out.push_back(d.value);
  }
  return out;
}

Dims dims_of(const std::vector<int64_t>& shape) { return Dims(shape.begin(), shape.end()); }

void check_shape_size(const Dims& dims, DType dtype, const std::string& what) {
  std::vector<int64_t> known;
  known.reserve(dims.size());
  for (const Dim& d : dims) known.push_back(d.known() ? d.value : 1);
  try {
    if (element_size(dtype) > 0) shape_bytes(known, dtype);
    else shape_numel(known);
  } catch (const Error&) {
    throw Error(ErrorKind::kInvalidModel, what + " has shape " + dims_to_string(dims) +
                                              (element_size(dtype) > 0 ? " of " + to_string(dtype) : std::string()) +
                                              ", larger than kiln allows for one tensor (" +
                                              std::to_string(kMaxTensorBytes >> 30) + " GiB)");
  }
}

std::string TensorType::str() const {
  return to_string(dtype) + "[" + (shape ? dims_to_string(*shape) : std::string("?")) + "]";
}

namespace {
template <class T>
const T* get_typed(const std::map<std::string, AttrValue>& map, const std::string& name,
                   const char* type_name) {
  auto it = map.find(name);
  if (it == map.end()) return nullptr;
  const T* v = std::get_if<T>(&it->second);
  if (!v)
    throw Error(ErrorKind::kInvalidModel, "attribute '" + name + "' is not of type " + type_name);
  return v;
}
}  // namespace

int64_t Attributes::get_int(const std::string& name, int64_t fallback) const {
  const int64_t* v = get_typed<int64_t>(map_, name, "int");
  return v ? *v : fallback;
}
float Attributes::get_float(const std::string& name, float fallback) const {
  auto it = map_.find(name);
  if (it != map_.end()) {
    if (const int64_t* i = std::get_if<int64_t>(&it->second)) return static_cast<float>(*i);
  }
  const float* v = get_typed<float>(map_, name, "float");
  return v ? *v : fallback;
}
std::string Attributes::get_string(const std::string& name, const std::string& fallback) const {
  const std::string* v = get_typed<std::string>(map_, name, "string");
  return v ? *v : fallback;
}
std::vector<int64_t> Attributes::get_ints(const std::string& name,
                                          const std::vector<int64_t>& fallback) const {
  const auto* v = get_typed<std::vector<int64_t>>(map_, name, "ints");
  return v ? *v : fallback;
}
std::vector<float> Attributes::get_floats(const std::string& name,
                                          const std::vector<float>& fallback) const {
  const auto* v = get_typed<std::vector<float>>(map_, name, "floats");
  return v ? *v : fallback;
}
std::vector<std::string> Attributes::get_strings(const std::string& name, const std::vector<std::string>& fallback) const {
  const auto* v = get_typed<std::vector<std::string>>(map_, name, "strings");
  return v ? *v : fallback;
}
const Tensor* Attributes::get_tensor(const std::string& name) const {
  return get_typed<Tensor>(map_, name, "tensor");
}
int64_t Attributes::require_int(const std::string& name) const {
  const int64_t* v = get_typed<int64_t>(map_, name, "int");
  if (!v) throw Error(ErrorKind::kInvalidModel, "required attribute '" + name + "' is missing");
  return *v;
}

Error Node::error(ErrorKind kind, const std::string& message) const {
  Error e(kind, message);
  e.node(name, op);
  return e;
}

Value& Graph::value(const std::string& name) {
  auto it = values_.find(name);
  if (it == values_.end()) throw Error(ErrorKind::kInternal, "no value named '" + name + "'");
  return it->second;
}
const Value& Graph::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw Error(ErrorKind::kInternal, "no value named '" + name + "'");
  return it->second;
}
Value* Graph::find_value(const std::string& name) {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}
const Value* Graph::find_value(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}
Value& Graph::set_value(Value v) {
  std::string key = v.name;
  return values_[key] = std::move(v);
}

const Tensor* Graph::constant(const std::string& name) const {
  const Value* v = find_value(name);
  return v && v->constant ? &*v->constant : nullptr;
}

std::string Graph::unique_name(const std::string& hint) {
  std::unordered_set<std::string> node_names;
  std::string candidate = hint;
  auto taken = [&](const std::string& n) {
    if (values_.count(n)) return true;
    for (const Node& node : nodes)
      if (node.name == n) return true;
    return false;
  };
  while (candidate.empty() || taken(candidate))
    candidate = hint + "__" + std::to_string(name_counter_++);
  return candidate;
}

std::string Graph::add_constant(const std::string& hint, Tensor t) {
  Value v;
  v.name = unique_name(hint);
  v.type.dtype = t.dtype();
  v.type.shape = dims_of(t.shape());
  if (t.rank() <= 1 && is_integer(t.dtype()) && t.numel() <= 64) v.symbolic_value = dims_of(t.to_int_vector());
  v.constant = std::move(t);
  std::string name = v.name;
  set_value(std::move(v));
  return name;
}

int Graph::producer(const std::string& value) const {
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const std::string& o : nodes[i].outputs)
      if (o == value) return static_cast<int>(i);
  return -1;
}

std::vector<int> Graph::consumers(const std::string& value) const {
  std::vector<int> out;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const std::string& in : nodes[i].inputs)
      if (in == value) { out.push_back(static_cast<int>(i)); break; }
  return out;
}

bool Graph::is_graph_output(const std::string& value) const {
  return std::find(outputs.begin(), outputs.end(), value) != outputs.end();
}

void Graph::replace_uses(const std::string& from, const std::string& to) {
  for (Node& n : nodes)
    for (std::string& in : n.inputs)
      if (in == from) in = to;
  for (std::string& o : outputs)
    if (o == from) o = to;
}

void Graph::prune_values() {
  std::unordered_set<std::string> used(inputs.begin(), inputs.end());
  used.insert(outputs.begin(), outputs.end());
  for (const Node& n : nodes) {
    used.insert(n.inputs.begin(), n.inputs.end());
    used.insert(n.outputs.begin(), n.outputs.end());
  }
  for (auto it = values_.begin(); it != values_.end();) {
    if (!used.count(it->first)) it = values_.erase(it);
    else ++it;
  }
}

void Graph::topological_sort() {
  std::unordered_set<std::string> ready(inputs.begin(), inputs.end());
  for (const auto& [name, v] : values_)
    if (v.constant) ready.insert(name);
  ready.insert("");
  std::vector<Node> sorted;
  sorted.reserve(nodes.size());
  std::vector<bool> done(nodes.size(), false);
  size_t remaining = nodes.size();
  while (remaining) {
    bool progress = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (done[i]) continue;
      bool ok = std::all_of(nodes[i].inputs.begin(), nodes[i].inputs.end(),
                            [&](const std::string& in) { return ready.count(in) != 0; });
      if (!ok) continue;
      done[i] = true;
      --remaining;
      progress = true;
      ready.insert(nodes[i].outputs.begin(), nodes[i].outputs.end());
      sorted.push_back(std::move(nodes[i]));
    }
    if (!progress) {
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (done[i]) continue;
        for (size_t k = 0; k < nodes[i].inputs.size(); ++k) {
          if (!ready.count(nodes[i].inputs[k])) {
            throw nodes[i]
                .error(ErrorKind::kInvalidModel,
                       "input '" + nodes[i].inputs[k] +
                           "' is neither a graph input, an initializer, nor produced by any node "
                           "(or the graph has a cycle)")
                .input(static_cast<int>(k));
          }
        }
      }
      throw Error(ErrorKind::kInvalidModel, "the graph has a cycle");
    }
  }
  nodes = std::move(sorted);
}

int64_t Graph::parameter_count() const {
  int64_t n = 0;
  for (const auto& [name, v] : values_)
    if (v.constant) n += v.constant->numel();
  return n;
}

int64_t Graph::parameter_bytes() const {
  int64_t n = 0;
  for (const auto& [name, v] : values_)
    if (v.constant) n += static_cast<int64_t>(v.constant->nbytes());
  return n;
}

}  // namespace kiln::ir
