#include "serve/infer_messages.h"

#include <cstring>
#include <utility>

#include "kiln/error.h"

namespace kiln::serve {

namespace pb = ::inference;

namespace {

// The protocol's datatype names, for the dtypes kiln runs.
const std::vector<std::pair<DType, const char*>>& datatype_names() {
  static const std::vector<std::pair<DType, const char*>> names = {
      {DType::kBool, "BOOL"},     {DType::kUInt8, "UINT8"},     {DType::kInt8, "INT8"},     {DType::kUInt16, "UINT16"},
      {DType::kInt16, "INT16"},   {DType::kUInt32, "UINT32"},   {DType::kInt32, "INT32"},   {DType::kUInt64, "UINT64"},
      {DType::kInt64, "INT64"},   {DType::kFloat16, "FP16"},    {DType::kBFloat16, "BF16"}, {DType::kFloat32, "FP32"},
      {DType::kFloat64, "FP64"}};
  return names;
}

// "[1, 3, 224, 224]": shapes in errors as kiln serve's Python front writes them.
std::string shape_list(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}


using Parameters = google::protobuf::Map<std::string, pb::InferParameter>;

bool names_a_region(const Parameters& parameters) { return parameters.count("shared_memory_region") > 0; }

// A whole number parameter (int64 or uint64), at least 0.
uint64_t whole_number(const Parameters& parameters, const std::string& key, const std::string& what, bool required) {
  auto it = parameters.find(key);
  if (it == parameters.end()) {
    if (required) refuse(what + ": " + key + " is missing");
    return 0;
  }
  const pb::InferParameter& p = it->second;
  if (p.parameter_choice_case() == pb::InferParameter::kUint64Param) return p.uint64_param();
  if (p.parameter_choice_case() == pb::InferParameter::kInt64Param && p.int64_param() >= 0)
    return static_cast<uint64_t>(p.int64_param());
  refuse(what + ": " + key + " must be a whole number of at least 0");
}

// The span of a region a tensor's parameters name.
RegionSpan region_span(const SharedMemoryRegions& regions, const Parameters& parameters, const std::string& what) {
  const pb::InferParameter& region = parameters.at("shared_memory_region");
  if (region.parameter_choice_case() != pb::InferParameter::kStringParam)
    refuse(what + ": shared_memory_region must be a string");
  const uint64_t bytes = whole_number(parameters, "shared_memory_byte_size", what, true);
  const uint64_t offset = whole_number(parameters, "shared_memory_offset", what, false);
  try {
    return regions.span(region.string_param(), offset, bytes, what);
  } catch (const Error& e) {  // (an unknown region too: the request is at fault, as over HTTP)
    refuse(e.what());
  }
}

// A tensor over memory the request (or a region) keeps alive: no copy. `keep` owns it.
Tensor borrowed(DType dtype, std::vector<int64_t> shape, const void* data, std::shared_ptr<const void> keep) {
  // (the aliasing constructor: the Tensor shares `keep`'s ownership and points at `data`)
  return Tensor::over_storage(
      dtype, std::move(shape),
      std::shared_ptr<unsigned char[]>(std::const_pointer_cast<void>(std::move(keep)),
                                       static_cast<unsigned char*>(const_cast<void*>(data))));
}

template <class To, class From>
Tensor from_list(DType dtype, std::vector<int64_t> shape, const google::protobuf::RepeatedField<From>& values,
                 const std::string& what) {
  Tensor t = Tensor::uninitialized(dtype, std::move(shape));
  if (values.size() != t.numel())
    refuse(what + ": " + std::to_string(values.size()) + " values in contents for " + std::to_string(t.numel()) +
           " elements");
  To* out = static_cast<To*>(t.raw());
  for (int i = 0; i < values.size(); ++i) out[i] = static_cast<To>(values.Get(i));
  return t;
}

// An input given as typed contents (not raw bytes): a copy in the engine's dtype.
Tensor from_contents(DType dtype, std::vector<int64_t> shape, const pb::InferTensorContents& c, const std::string& what) {
  switch (dtype) {
    case DType::kBool: return from_list<bool>(dtype, std::move(shape), c.bool_contents(), what);
    case DType::kInt8: return from_list<int8_t>(dtype, std::move(shape), c.int_contents(), what);
    case DType::kInt16: return from_list<int16_t>(dtype, std::move(shape), c.int_contents(), what);
    case DType::kInt32: return from_list<int32_t>(dtype, std::move(shape), c.int_contents(), what);
    case DType::kInt64: return from_list<int64_t>(dtype, std::move(shape), c.int64_contents(), what);
    case DType::kUInt8: return from_list<uint8_t>(dtype, std::move(shape), c.uint_contents(), what);
    case DType::kUInt16: return from_list<uint16_t>(dtype, std::move(shape), c.uint_contents(), what);
    case DType::kUInt32: return from_list<uint32_t>(dtype, std::move(shape), c.uint_contents(), what);
    case DType::kUInt64: return from_list<uint64_t>(dtype, std::move(shape), c.uint64_contents(), what);
    case DType::kFloat32: return from_list<float>(dtype, std::move(shape), c.fp32_contents(), what);
    case DType::kFloat64: return from_list<double>(dtype, std::move(shape), c.fp64_contents(), what);
    default: refuse(what + ": " + datatype_name(dtype) + " data must come as raw_input_contents");
  }
}

// Rows [first, first + count) of a batch's output, in place: where they lie, how many bytes,
// and their shape (all of it for an output without rows, or when they are all of it).
struct RowSpan {
  const unsigned char* data;
  size_t bytes;
  std::vector<int64_t> shape;
};
RowSpan row_span(const Tensor& all, int64_t first, int64_t count) {
  RowSpan span{static_cast<const unsigned char*>(all.raw()), all.nbytes(), all.shape()};
  if (all.rank() == 0 || (first == 0 && count == all.dim(0))) return span;
  const size_t row_bytes = all.dim(0) > 0 ? span.bytes / static_cast<size_t>(all.dim(0)) : 0;
  span.data += row_bytes * static_cast<size_t>(first);
  span.bytes = row_bytes * static_cast<size_t>(count);
  span.shape[0] = count;
  return span;
}

}  // namespace

[[noreturn]] void refuse(std::string message, grpc::StatusCode code) { throw Refusal{code, std::move(message)}; }

std::string datatype_name(DType dtype) {
  for (const auto& [d, name] : datatype_names())
    if (d == dtype) return name;
  return to_string(dtype);
}

Tensor rows_of(const Tensor& all, int64_t first, int64_t count) {
  if (all.rank() == 0 || (first == 0 && count == all.dim(0))) return all;
  const RowSpan span = row_span(all, first, count);
  Tensor part = Tensor::uninitialized(all.dtype(), span.shape);
  if (span.bytes) std::memcpy(part.raw(), span.data, span.bytes);
  return part;
}

RequestInputs decode_request(const pb::ModelInferRequest& request, const ServedModel& served,
                             const SharedMemoryRegions& regions, uint64_t max_request_bytes,
                             const std::shared_ptr<const void>& keep) {
  if (request.inputs_size() != static_cast<int>(served.inputs.size()))
    refuse("model '" + served.name + "' takes " + std::to_string(served.inputs.size()) + " inputs; the request gives " +
           std::to_string(request.inputs_size()));
  const bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size())
    refuse("the request has " + std::to_string(request.raw_input_contents_size()) +
           " raw_input_contents for " + std::to_string(request.inputs_size()) + " inputs");
  for (const auto& wanted : request.outputs()) {
    bool known = false;
    for (const TensorDesc& d : served.outputs) known = known || d.name == wanted.name();
    if (!known) refuse("model '" + served.name + "' has no output '" + wanted.name() + "'");
  }
  RequestInputs out;
  uint64_t total = 0;
  std::vector<int64_t> rows_seen;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const pb::ModelInferRequest::InferInputTensor& in = request.inputs(i);
    const std::string what = "input '" + in.name() + "'";
    const TensorDesc* desc = nullptr;
    for (const TensorDesc& d : served.inputs)
      if (d.name == in.name()) desc = &d;
    if (!desc) refuse("model '" + served.name + "' has no input '" + in.name() + "'");
    if (out.inputs.count(in.name())) refuse(what + " is given twice");
    if (in.datatype() != datatype_name(desc->dtype))
      refuse(what + " must be " + datatype_name(desc->dtype) + ", not " + in.datatype());
    std::vector<int64_t> shape(in.shape().begin(), in.shape().end());
    bool fits = shape.size() == desc->shape.size();
    for (size_t d = 0; fits && d < shape.size(); ++d)
      fits = shape[d] >= 0 && (desc->shape[d] < 0 || shape[d] == desc->shape[d]);
    if (!fits)
      refuse(what + " must have shape " + shape_list(desc->shape) + " (-1: any size), not " + shape_list(shape));
    size_t bytes = 0;
    try {
      bytes = shape_bytes(shape, desc->dtype);
    } catch (const Error& e) {
      refuse(what + ": " + e.what());
    }
    total += bytes;
    if (total > max_request_bytes)
      refuse("the request's inputs are more than the server takes (" + std::to_string(max_request_bytes) +
             " bytes; kiln serve --max-request-mb)");
    Tensor tensor;
    if (names_a_region(in.parameters())) {
      RegionSpan span = region_span(regions, in.parameters(), what);
      if (span.bytes != bytes)
        refuse(what + ": shape " + shape_list(shape) + " of " + to_string(desc->dtype) + " is " +
               std::to_string(bytes) + " bytes; shared_memory_byte_size says " + std::to_string(span.bytes));
      tensor = borrowed(desc->dtype, shape, span.data, span.object);
    } else if (raw) {
      const std::string& data = request.raw_input_contents(i);
      if (data.size() != bytes)
        refuse(what + ": shape " + shape_list(shape) + " of " + to_string(desc->dtype) + " is " +
               std::to_string(bytes) + " bytes; its raw_input_contents hold " + std::to_string(data.size()));
      tensor = borrowed(desc->dtype, shape, data.data(), keep);
    } else {
      tensor = from_contents(desc->dtype, shape, in.contents(), what);
    }
    if (!shape.empty()) rows_seen.push_back(shape[0]);
    out.inputs.emplace(in.name(), std::move(tensor));
  }
  for (int64_t r : rows_seen)
    if (r != rows_seen.front()) refuse("the inputs' first dimensions differ");
  out.rows = rows_seen.empty() ? 1 : rows_seen.front();
  if (served.batching.max_batch > 1 && out.rows > served.batching.max_batch)
    refuse("the request has " + std::to_string(out.rows) + " rows; model '" + served.name + "' takes at most " +
           std::to_string(served.batching.max_batch) + " (kiln serve --max-batch)");
  return out;
}

void write_answer(const pb::ModelInferRequest& request, const ServedModel& model, const SharedMemoryRegions& regions,
                  const BatchResult& result, pb::ModelInferResponse* response) {
  if (!result.error.empty())
    refuse("model '" + model.name + "': " + result.error, grpc::StatusCode::INTERNAL);
  response->set_model_name(model.name);
  response->set_model_version(model.version);
  response->set_id(request.id());
  for (const TensorDesc& desc : model.outputs) {
    const pb::ModelInferRequest::InferRequestedOutputTensor* wanted = nullptr;
    for (const auto& w : request.outputs())
      if (w.name() == desc.name) wanted = &w;
    if (request.outputs_size() > 0 && !wanted) continue;
    auto found = result.outputs->find(desc.name);
    if (found == result.outputs->end())
      refuse("model '" + model.name + "': the engine gave no output '" + desc.name + "'",
             grpc::StatusCode::INTERNAL);
    const Tensor& all = found->second;
    // (of a batch of several requests, or padded: this request's rows)
    const RowSpan rows = row_span(all, result.first_row, result.rows);
    const unsigned char* data = rows.data;
    const size_t bytes = rows.bytes;
    auto* out = response->add_outputs();
    out->set_name(desc.name);
    out->set_datatype(datatype_name(all.dtype()));
    for (int64_t d : rows.shape) out->add_shape(d);
    const std::string what = "output '" + desc.name + "'";
    if (wanted && names_a_region(wanted->parameters())) {
      RegionSpan span = region_span(regions, wanted->parameters(), what);
      if (bytes > span.bytes)
        refuse(what + ": the output is " + std::to_string(bytes) + " bytes; its region holds " +
               std::to_string(span.bytes));
      if (bytes) std::memcpy(span.data, data, bytes);
      (*out->mutable_parameters())["shared_memory_region"].set_string_param(
          wanted->parameters().at("shared_memory_region").string_param());
      (*out->mutable_parameters())["shared_memory_byte_size"].set_int64_param(static_cast<int64_t>(bytes));
      response->add_raw_output_contents();  // (empty: keeps each later output at its index)
    } else {
      response->add_raw_output_contents()->assign(reinterpret_cast<const char*>(data), bytes);
    }
  }
}

}  // namespace kiln::serve
