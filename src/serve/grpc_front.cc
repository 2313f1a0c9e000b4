#include "serve/grpc_front.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <utility>

#include "inference.grpc.pb.h"
#include "kiln/error.h"
#include "kiln/tensor.h"
#include "serve/shared_memory_regions.h"

namespace kiln::serve {

namespace {

namespace pb = ::inference;

// The protocol's datatype names, for the dtypes kiln runs.
const std::vector<std::pair<DType, const char*>>& datatype_names() {
  static const std::vector<std::pair<DType, const char*>> names = {
      {DType::kBool, "BOOL"},     {DType::kUInt8, "UINT8"},     {DType::kInt8, "INT8"},     {DType::kUInt16, "UINT16"},
      {DType::kInt16, "INT16"},   {DType::kUInt32, "UINT32"},   {DType::kInt32, "INT32"},   {DType::kUInt64, "UINT64"},
      {DType::kInt64, "INT64"},   {DType::kFloat16, "FP16"},    {DType::kBFloat16, "BF16"}, {DType::kFloat32, "FP32"},
      {DType::kFloat64, "FP64"}};
  return names;
}

std::string datatype_name(DType dtype) {
  for (const auto& [d, name] : datatype_names())
    if (d == dtype) return name;
  return to_string(dtype);
}

// "[1, 3, 224, 224]": shapes in errors as kiln serve's Python front writes them.
std::string shape_list(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// A request the front answers with an error instead of running it.
struct Refusal {
  grpc::StatusCode code;
  std::string message;
};

[[noreturn]] void refuse(std::string message, grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT) {
  throw Refusal{code, std::move(message)};
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

// The same rows as a tensor of their own (the output itself when they are all of it).
Tensor rows_of(const Tensor& all, int64_t first, int64_t count) {
  if (all.rank() == 0 || (first == 0 && count == all.dim(0))) return all;
  const RowSpan span = row_span(all, first, count);
  Tensor part = Tensor::uninitialized(all.dtype(), span.shape);
  if (span.bytes) std::memcpy(part.raw(), span.data, span.bytes);
  return part;
}

struct Model {
  ServedModel served;
  std::unique_ptr<Batcher> batcher;
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> errors{0};
};

struct Prepared {
  Tensors inputs;
  int64_t rows = 1;
};

}  // namespace

struct GrpcFront::Impl final : pb::GRPCInferenceService::CallbackService {
  FrontOptions options;
  std::map<std::string, std::unique_ptr<Model>> models;
  SharedMemoryRegions regions;
  std::unique_ptr<grpc::Server> server;
  int bound_port = 0;
  std::mutex shutdown_mutex;
  bool shut_down = false;

  explicit Impl(FrontOptions o) : options(std::move(o)), regions(options.pin_gpu) {}

  // --- the model a request names -----------------------------------------------------------
  Model& find(const std::string& name, const std::string& version) {
    auto it = models.find(name);
    if (it == models.end()) refuse("no model '" + name + "' is served here", grpc::StatusCode::NOT_FOUND);
    const std::string& own = it->second->served.version;
    if (!version.empty() && !own.empty() && version != own)
      refuse("model '" + name + "' has no version '" + version + "' (it serves version " + own + ")",
             grpc::StatusCode::NOT_FOUND);
    return *it->second;
  }

  // --- a request's inputs, checked ---------------------------------------------------------
  Prepared prepare(const pb::ModelInferRequest& request, const Model& model,
                   const std::shared_ptr<const pb::ModelInferRequest>& keep) {
    const ServedModel& served = model.served;
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
    Prepared out;
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
      if (total > options.max_request_bytes)
        refuse("the request's inputs are more than the server takes (" + std::to_string(options.max_request_bytes) +
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

  // --- the answer: the request's rows of each output ---------------------------------------
  void answer(const pb::ModelInferRequest& request, const Model& model, const BatchResult& result,
              pb::ModelInferResponse* response) {
    if (!result.error.empty())
      refuse("model '" + model.served.name + "': " + result.error, grpc::StatusCode::INTERNAL);
    response->set_model_name(model.served.name);
    response->set_model_version(model.served.version);
    response->set_id(request.id());
    for (const TensorDesc& desc : model.served.outputs) {
      const pb::ModelInferRequest::InferRequestedOutputTensor* wanted = nullptr;
      for (const auto& w : request.outputs())
        if (w.name() == desc.name) wanted = &w;
      if (request.outputs_size() > 0 && !wanted) continue;
      auto found = result.outputs->find(desc.name);
      if (found == result.outputs->end())
        refuse("model '" + model.served.name + "': the engine gave no output '" + desc.name + "'",
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

  // Checks a request and queues it; `finish` gets the answer's status (on the thread that ran
  // its batch, or on this one when the request is refused).
  void infer(const std::shared_ptr<const pb::ModelInferRequest>& request, pb::ModelInferResponse* response,
             std::function<void(grpc::Status)> finish) {
    Model* model = nullptr;
    Prepared prepared;
    try {
      model = &find(request->model_name(), request->model_version());
      if (!model->batcher) refuse("the server is shutting down", grpc::StatusCode::UNAVAILABLE);
      model->requests.fetch_add(1, std::memory_order_relaxed);
      prepared = prepare(*request, *model, request);
    } catch (const Refusal& r) {
      if (model) model->errors.fetch_add(1, std::memory_order_relaxed);
      finish(grpc::Status(r.code, r.message));
      return;
    }
    model->batcher->submit(std::move(prepared.inputs), prepared.rows,
                           [this, model, request, response, finish = std::move(finish)](const BatchResult& result) {
                             try {
                               answer(*request, *model, result, response);
                             } catch (const Refusal& r) {
                               model->errors.fetch_add(1, std::memory_order_relaxed);
                               finish(grpc::Status(r.code, r.message));
                               return;
                             }
                             finish(grpc::Status::OK);
                           });
  }

  // --- the service's methods ---------------------------------------------------------------
  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context, const pb::ServerLiveRequest*,
                                       pb::ServerLiveResponse* response) override {
    response->set_live(true);
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context, const pb::ServerReadyRequest*,
                                        pb::ServerReadyResponse* response) override {
    response->set_ready(true);  // the front starts once every model is loaded and warmed
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context, const pb::ModelReadyRequest* request,
                                       pb::ModelReadyResponse* response) override {
    try {
      find(request->name(), request->version());
      response->set_ready(true);
    } catch (const Refusal& r) {
      return finished(context, grpc::Status(r.code, r.message));
    }
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context, const pb::ServerMetadataRequest*,
                                           pb::ServerMetadataResponse* response) override {
    response->set_name("kiln");
    response->set_version(options.server_version);
    response->add_extensions("system_shared_memory");
    response->add_extensions("binary_tensor_data");
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context, const pb::ModelMetadataRequest* request,
                                          pb::ModelMetadataResponse* response) override {
    try {
      const ServedModel& served = find(request->name(), request->version()).served;
      response->set_name(served.name);
      if (!served.version.empty()) response->add_versions(served.version);
      response->set_platform("kiln");
      auto describe = [](const TensorDesc& d, pb::ModelMetadataResponse::TensorMetadata* m) {
        m->set_name(d.name);
        m->set_datatype(datatype_name(d.dtype));
        for (int64_t s : d.shape) m->add_shape(s);
      };
      for (const TensorDesc& d : served.inputs) describe(d, response->add_inputs());
      for (const TensorDesc& d : served.outputs) describe(d, response->add_outputs());
    } catch (const Refusal& r) {
      return finished(context, grpc::Status(r.code, r.message));
    }
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context, const pb::ModelInferRequest* request,
                                       pb::ModelInferResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    // The request outlives the call's use of it: gRPC frees it only after Finish.
    std::shared_ptr<const pb::ModelInferRequest> borrowed_request(std::shared_ptr<void>(), request);
    infer(borrowed_request, response, [reactor](grpc::Status status) { reactor->Finish(std::move(status)); });
    return reactor;
  }

  grpc::ServerBidiReactor<pb::ModelInferRequest, pb::ModelStreamInferResponse>* ModelStreamInfer(
      grpc::CallbackServerContext*) override;

  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(grpc::CallbackServerContext* context,
                                                     const pb::SystemSharedMemoryStatusRequest* request,
                                                     pb::SystemSharedMemoryStatusResponse* response) override {
    try {
      for (const RegionStatus& r : regions.status(request->name())) {
        auto& entry = (*response->mutable_regions())[r.name];
        entry.set_name(r.name);
        entry.set_key(r.key);
        entry.set_offset(r.offset);
        entry.set_byte_size(r.byte_size);
      }
    } catch (const RegionNotFound& e) {
      return finished(context, grpc::Status(grpc::StatusCode::NOT_FOUND, e.what()));
    }
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(grpc::CallbackServerContext* context,
                                                       const pb::SystemSharedMemoryRegisterRequest* request,
                                                       pb::SystemSharedMemoryRegisterResponse*) override {
    try {
      regions.register_region(request->name(), request->key(), request->offset(), request->byte_size());
    } catch (const Error& e) {
      return finished(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e.what()));
    }
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(grpc::CallbackServerContext* context,
                                                         const pb::SystemSharedMemoryUnregisterRequest* request,
                                                         pb::SystemSharedMemoryUnregisterResponse*) override {
    regions.unregister(request->name());
    return finished(context, grpc::Status::OK);
  }

  static grpc::ServerUnaryReactor* finished(grpc::CallbackServerContext* context, grpc::Status status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(std::move(status));
    return reactor;
  }
};

namespace {

// One ModelStreamInfer call: every request read is checked and queued at once, and the answers
// are written in the order the requests came, each as soon as it and those before it are done.
// A request's error is its answer (error_message); the stream goes on. The call finishes once
// the client has stopped sending and every answer is written.
class StreamInfer final : public grpc::ServerBidiReactor<pb::ModelInferRequest, pb::ModelStreamInferResponse> {
 public:
  explicit StreamInfer(GrpcFront::Impl* front) : front_(front) { StartRead(&incoming_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::unique_lock<std::mutex> lock(mutex_);
      reads_done_ = true;
      proceed(lock);
      return;
    }
    auto request = std::make_shared<pb::ModelInferRequest>(std::move(incoming_));
    incoming_.Clear();
    uint64_t sequence = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sequence = next_read_++;
      ++in_flight_;
    }
    auto answer = std::make_shared<pb::ModelStreamInferResponse>();
    front_->infer(request, answer->mutable_infer_response(), [this, sequence, answer](grpc::Status status) {
      if (!status.ok()) {
        answer->clear_infer_response();
        answer->set_error_message(status.error_message());
      }
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.emplace(sequence, std::move(*answer));
      --in_flight_;
      proceed(lock);
    });
    StartRead(&incoming_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    writing_ = false;
    if (!ok) broken_ = true;  // the client is gone: the rest are run but not written
    proceed(lock);
  }

  void OnDone() override {
    std::unique_lock<std::mutex> lock(mutex_);
    done_ = true;
    proceed(lock);
  }

 private:
  // Writes the next answer in order, finishes the call, or deletes this reactor once gRPC is
  // done with it and no batch still holds it. Called with the lock held; lets go of it.
  void proceed(std::unique_lock<std::mutex>& lock) {
    if (done_) {
      const bool last = in_flight_ == 0;
      lock.unlock();
      if (last) delete this;
      return;
    }
    if (writing_ || finished_) return;
    if (broken_) ready_.clear();
    auto next = ready_.find(next_write_);
    if (next != ready_.end()) {
      writing_ = true;
      current_ = std::move(next->second);
      ready_.erase(next);
      ++next_write_;
      lock.unlock();
      StartWrite(&current_);
      return;
    }
    if (reads_done_ && in_flight_ == 0 && ready_.empty()) {
      finished_ = true;
      lock.unlock();
      Finish(broken_ ? grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading") : grpc::Status::OK);
    }
  }

  GrpcFront::Impl* front_;
  pb::ModelInferRequest incoming_;
  pb::ModelStreamInferResponse current_;
  std::mutex mutex_;
  std::map<uint64_t, pb::ModelStreamInferResponse> ready_;
  uint64_t next_read_ = 0;
  uint64_t next_write_ = 0;
  uint64_t in_flight_ = 0;
  bool reads_done_ = false;
  bool writing_ = false;
  bool finished_ = false;
  bool broken_ = false;
  bool done_ = false;
};

}  // namespace

grpc::ServerBidiReactor<pb::ModelInferRequest, pb::ModelStreamInferResponse>* GrpcFront::Impl::ModelStreamInfer(
    grpc::CallbackServerContext*) {
  return new StreamInfer(this);
}

GrpcFront::GrpcFront(std::vector<ServedModel> models, FrontOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  for (ServedModel& served : models) {
    if (served.runners.empty())
      throw Error(ErrorKind::kInvalidArgument, "model '" + served.name + "' has no engine run to serve it");
    if (impl_->models.count(served.name))
      throw Error(ErrorKind::kInvalidArgument, "two models are named '" + served.name + "'");
    auto model = std::make_unique<Model>();
    model->batcher = std::make_unique<Batcher>(served.runners, served.batching);
    model->served = std::move(served);
    impl_->models.emplace(model->served.name, std::move(model));
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(impl_->options.address, grpc::InsecureServerCredentials(), &impl_->bound_port);
  builder.RegisterService(impl_.get());
  // A request's inputs may be as large as the server takes, plus the message's own fields.
  const uint64_t largest = impl_->options.max_request_bytes + (uint64_t{1} << 20);
  builder.SetMaxReceiveMessageSize(largest > INT32_MAX ? INT32_MAX : static_cast<int>(largest));
  builder.SetMaxSendMessageSize(-1);
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || impl_->bound_port == 0)
    throw Error(ErrorKind::kIo, "kiln serve: cannot listen for gRPC on " + impl_->options.address +
                                    " (is the port taken?)");
}

GrpcFront::~GrpcFront() { shutdown(); }

int GrpcFront::port() const { return impl_->bound_port; }

SharedMemoryRegions& GrpcFront::shared_memory() { return impl_->regions; }

void GrpcFront::shutdown(double grace_seconds) {
  std::lock_guard<std::mutex> lock(impl_->shutdown_mutex);
  if (impl_->shut_down) return;
  impl_->shut_down = true;
  // New calls are refused; calls in flight get until the deadline, their batches still running.
  impl_->server->Shutdown(std::chrono::system_clock::now() +
                          std::chrono::microseconds(static_cast<int64_t>(grace_seconds * 1e6)));
  // Every queued request runs (a cancelled call's answer goes nowhere), then the runs stop.
  for (auto& [_, model] : impl_->models) model->batcher.reset();
  impl_->server->Wait();
}

std::map<std::string, ModelStats> GrpcFront::stats() const {
  std::map<std::string, ModelStats> out;
  for (const auto& [name, model] : impl_->models) {
    ModelStats s;
    s.requests = model->requests.load(std::memory_order_relaxed);
    s.errors = model->errors.load(std::memory_order_relaxed);
    if (model->batcher) s.batching = model->batcher->stats();
    out[name] = s;
  }
  return out;
}

Tensors GrpcFront::run(const std::string& model_name, Tensors inputs, int64_t rows) {
  auto it = impl_->models.find(model_name);
  if (it == impl_->models.end() || !it->second->batcher)
    throw Error(ErrorKind::kInvalidArgument, "no model '" + model_name + "' is served here");
  Model& model = *it->second;
  model.requests.fetch_add(1, std::memory_order_relaxed);
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  Tensors out;
  std::string error;
  model.batcher->submit(std::move(inputs), rows, [&](const BatchResult& result) {
    Tensors mine;
    if (result.error.empty()) {
      for (const auto& [name, all] : *result.outputs) mine[name] = rows_of(all, result.first_row, result.rows);
    }
    std::lock_guard<std::mutex> lock(mutex);
    out = std::move(mine);
    error = result.error;
    done = true;
    finished.notify_one();
  });
  std::unique_lock<std::mutex> lock(mutex);
  finished.wait(lock, [&] { return done; });
  if (!error.empty()) {
    model.errors.fetch_add(1, std::memory_order_relaxed);
    throw Error(ErrorKind::kInvalidArgument, "model '" + model_name + "': " + error);
  }
  return out;
}

void GrpcFront::count(const std::string& model_name, uint64_t requests, uint64_t errors) {
  auto it = impl_->models.find(model_name);
  if (it == impl_->models.end()) throw Error(ErrorKind::kInvalidArgument, "no model '" + model_name + "' is served here");
  it->second->requests.fetch_add(requests, std::memory_order_relaxed);
  it->second->errors.fetch_add(errors, std::memory_order_relaxed);
}

}  // namespace kiln::serve
