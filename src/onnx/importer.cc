#include "onnx/importer.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "ir/op_schema.h"
#include "ir/small_types.h"
#include "onnx.pb.h"

namespace kiln::onnx_import {

namespace fs = std::filesystem;

void ImportContext::fail(const std::string& message) const {
  throw node.error(ErrorKind::kInvalidModel, message);
}

void ImportContext::unsupported(const std::string& message) const {
  throw node.error(ErrorKind::kUnsupported, message);
}

void ImportContext::move_ints_attribute_to_input(const std::string& attr, size_t index) {
  if (!node.attrs.has(attr)) return;
  std::vector<int64_t> values = node.attrs.get_ints(attr);
  node.attrs.erase(attr);
  std::string name = graph.add_constant(node.name + "_" + attr,
                                        Tensor::from_vector<int64_t>({static_cast<int64_t>(values.size())}, values));
  if (node.inputs.size() <= index) node.inputs.resize(index + 1);
  node.inputs[index] = name;
}

namespace {

Error model_error(const std::string& file, const std::string& message) {
  Error e(ErrorKind::kInvalidModel, message);
  e.file(file);
  return e;
}

// One external data file, opened once: a regular file whose real path (links resolved) lies
// inside the model's folder, as the onnx package requires since CVE-2024-27318.
class ExternalFile {
 public:
  ExternalFile(const std::string& folder, const std::string& location, const std::string& tensor) {
    auto refuse = [&](ErrorKind kind, const std::string& why) {
      return Error(kind, "tensor '" + tensor + "': external data location '" + location + "' " + why);
    };
    const fs::path rel(location);
    if (rel.is_absolute() || std::any_of(rel.begin(), rel.end(), [](const fs::path& part) { return part == ".."; }))
      throw refuse(ErrorKind::kInvalidModel, "must be a relative path inside the model's folder");
    std::error_code ec;
    const fs::path folder_real = fs::canonical(folder, ec);
    if (ec) throw refuse(ErrorKind::kIo, "cannot be resolved: the model's folder '" + folder + "': " + ec.message());
    path_ = (fs::path(folder) / rel).string();
    // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0)
      throw refuse(ErrorKind::kIo, "cannot be opened ('" + path_ + "': " + std::strerror(errno) + ")")
          .hint("keep the data file next to the .onnx file");
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw refuse(ErrorKind::kInvalidModel, "is not a regular file");
    }
    size_ = static_cast<int64_t>(st.st_size);
    // The file actually opened, wherever links led: checked after opening, so that a link
    // changed in between cannot lead outside.
    fs::path real = fs::read_symlink("/proc/self/fd/" + std::to_string(fd_), ec);
    if (ec) real = fs::canonical(path_, ec);
    const fs::path inside = real.lexically_relative(folder_real);
    if (ec || inside.empty() || *inside.begin() == "..") {
      ::close(fd_);
      throw refuse(ErrorKind::kInvalidModel, "resolves to '" + real.string() + "', outside the model's folder '" +
                                                 folder_real.string() + "'")
          .hint("external data must lie in the model's folder; a symbolic link may not lead out of it");
    }
  }
  ~ExternalFile() { ::close(fd_); }
  ExternalFile(const ExternalFile&) = delete;
  ExternalFile& operator=(const ExternalFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  // Reads bytes [offset, offset + bytes), which the caller has checked against size().
  bool read(void* dst, int64_t offset, int64_t bytes) const {
    char* out = static_cast<char*>(dst);
    while (bytes > 0) {
      const ssize_t got = ::pread(fd_, out, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30)), offset);
      if (got <= 0) {
        if (got < 0 && errno == EINTR) continue;
        return false;
      }
      out += got;
      offset += got;
      bytes -= got;
    }
    return true;
  }

 private:
  int fd_ = -1;
  int64_t size_ = 0;
  std::string path_;
};

// Where external data lives: files beside the model, or an engine file's weights section.
struct DataSource {
  std::string base_dir;                  // "" refuses external data files
  const std::string* weights = nullptr;  // an engine file's weights (location "kiln:weights")
  // The files opened so far, by location: each is opened once per import.
  std::map<std::string, std::shared_ptr<const ExternalFile>>* files = nullptr;
};
thread_local DataSource data_source;  // set by import_model for the import it runs

constexpr char kEngineWeights[] = "kiln:weights";

std::shared_ptr<const ExternalFile> open_external(const std::string& folder, const std::string& location,
                                                  const std::string& tensor) {
  const bool shared = data_source.files && folder == data_source.base_dir;
  if (shared)
    if (auto it = data_source.files->find(location); it != data_source.files->end()) return it->second;
  auto file = std::make_shared<const ExternalFile>(folder, location, tensor);
  if (shared) (*data_source.files)[location] = file;
  return file;
}

// Reads a tensor's external data (a file region, or an engine file's weights section) into a
// new tensor of `dtype` and `shape` (`need` bytes), checking the bounds before allocating.
Tensor read_external(const onnx::TensorProto& proto, const std::string& base_dir, DType dtype,
                     const std::vector<int64_t>& shape, int64_t need) {
  std::string location;
  int64_t offset = 0;
  int64_t length = -1;
  for (const auto& kv : proto.external_data()) {
    try {
      if (kv.key() == "location") location = kv.value();
      else if (kv.key() == "offset") offset = std::stoll(kv.value());
      else if (kv.key() == "length") length = std::stoll(kv.value());
    } catch (const std::exception&) {
      throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "': external data " + kv.key() + " '" + kv.value() +
                                                "' is not a number");
    }
  }
  if (location.empty())
    throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "' has external data without a location");
  if (data_source.weights && location == kEngineWeights) {
    const int64_t size = static_cast<int64_t>(data_source.weights->size());
    if (length != need || offset < 0 || offset > size || need > size - offset)
      throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "': bytes " + std::to_string(offset) + " + " +
                                                std::to_string(length) + " of the weights section (" + std::to_string(size) +
                                                " bytes) do not hold its " + std::to_string(need) + " bytes");
    Tensor out = Tensor::uninitialized(dtype, shape);
    std::memcpy(out.raw(), data_source.weights->data() + offset, static_cast<size_t>(need));
    return out;
  }
  if (base_dir.empty())
    throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "' uses external data, which needs a model file path");
  if (length >= 0 && length != need)
    throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "': external data length " + std::to_string(length) +
                                              " does not match its shape (" + std::to_string(need) + " bytes)");
  const std::shared_ptr<const ExternalFile> file = open_external(base_dir, location, proto.name());
  const int64_t size = file->size();
  if (offset < 0 || offset > size || need > size - offset)
    throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "': external data file '" + file->path() +
                                              "' is too short (" + std::to_string(size) + " bytes, need " +
                                              std::to_string(offset) + " + " + std::to_string(need) + ")");
  Tensor out = Tensor::uninitialized(dtype, shape);
  if (!file->read(out.raw(), offset, need))
    throw Error(ErrorKind::kIo, "tensor '" + proto.name() + "': failed reading external data '" + file->path() + "'");
  return out;
}

// An engine file's constant that a backend holds packed (external data with a "kiln_layout"):
// `v` gets the pack's bytes, copied from the weights section with the layout named, and as its
// constant a tensor of the dtype and dims (checked as any tensor's) without storage; the backend
// checks the layout against them. False, `v` untouched, for any other tensor.
bool read_packed_constant(const onnx::TensorProto& proto, ir::Value& v) {
  if (!data_source.weights || proto.data_location() != onnx::TensorProto::EXTERNAL) return false;
  std::string layout;
  int64_t length = -1;
  for (const auto& kv : proto.external_data()) {
    if (kv.key() == "kiln_layout") layout = kv.value();
    try {
      if (kv.key() == "length") length = std::stoll(kv.value());
    } catch (const std::exception&) {
      length = -1;
    }
  }
  if (layout.empty()) return false;
  // Packs are of float32, int8 or uint8 matrices and filters (rank 2 and more), never of a tensor
  // whose values shape inference reads (shapes, scales): those must stay values.
  const bool packable_type = proto.data_type() == static_cast<int32_t>(DType::kFloat32) ||
                             proto.data_type() == static_cast<int32_t>(DType::kInt8) ||
                             proto.data_type() == static_cast<int32_t>(DType::kUInt8);
  if (!packable_type || proto.dims_size() < 2 || layout.size() > 64)
    throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "' is packed (layout '" + layout.substr(0, 64) +
                                              "'), but packs hold float32, int8 or uint8 tensors of rank 2 or more under a "
                                              "short layout name");
  Tensor shape_only;
  try {  // over_storage refuses negative dimensions and sizes past kMaxTensorBytes
    shape_only = Tensor::over_storage(static_cast<DType>(proto.data_type()),
                                      std::vector<int64_t>(proto.dims().begin(), proto.dims().end()), nullptr);
  } catch (const Error& e) {
    throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "': " + e.message());
  }
  if (length < 0)
    throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "' is packed without a valid external data length");
  auto packed = std::make_shared<ir::PackedConstant>();
  packed->layout = layout;
  packed->data = read_external(proto, "", DType::kUInt8, {length}, length);
  v.packed = std::move(packed);
  v.constant = std::move(shape_only);
  return true;
}

template <class Field>
void check_count(const onnx::TensorProto& proto, const Field& field, int64_t numel) {
  if (static_cast<int64_t>(field.size()) != numel)
    throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "' has " + std::to_string(field.size()) +
                                              " values for " + std::to_string(numel) + " elements");
}

}  // namespace

Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::string& base_dir) {
  if (proto.has_segment())
    throw Error(ErrorKind::kUnsupported, "tensor '" + proto.name() + "' is segmented");
  if (!is_known_dtype(proto.data_type()))
    throw Error(ErrorKind::kUnsupported, "tensor '" + proto.name() + "' has data type " +
                                             to_string(static_cast<DType>(proto.data_type())) +
                                             ", which kiln does not support");
  std::vector<int64_t> shape(proto.dims().begin(), proto.dims().end());
  for (int64_t d : shape)
    if (d < 0) throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "' has a negative dimension");
  DType dtype = static_cast<DType>(proto.data_type());
  // The size the shape implies, checked against the data before anything is allocated (a
  // malformed file may declare a huge shape over a few bytes).
  int64_t n = 0, need = 0;
  try {
    need = static_cast<int64_t>(shape_bytes(shape, dtype));
    n = shape_numel(shape);
  } catch (const Error& e) {
    throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "': " + e.message());
  }
  // Sub-byte types are packed in the file (two or four elements to a byte, one to an int32_data
  // entry's byte) and unpacked to a byte each.
  if (packed_bits(dtype)) {
    const int64_t bytes = packed_bytes(dtype, n);
    std::string packed;
    if (proto.data_location() == onnx::TensorProto::EXTERNAL) {
      const Tensor file = read_external(proto, base_dir.empty() ? data_source.base_dir : base_dir, DType::kUInt8, {bytes}, bytes);
      packed.assign(static_cast<const char*>(file.raw()), static_cast<size_t>(bytes));
    } else if (proto.has_raw_data()) {
      packed = proto.raw_data();
    } else {
      packed.reserve(static_cast<size_t>(proto.int32_data_size()));
      for (int32_t v : proto.int32_data()) packed.push_back(static_cast<char>(v));
    }
    if (static_cast<int64_t>(packed.size()) != bytes)
      throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "' has " + std::to_string(packed.size()) +
                                                " bytes of data, its shape " + shape_to_string(shape) + " of " +
                                                to_string(dtype) + " needs " + std::to_string(bytes) + " packed");
    Tensor t = Tensor::uninitialized(dtype, shape);
    unpack_elements(dtype, reinterpret_cast<const uint8_t*>(packed.data()), n, static_cast<uint8_t*>(t.raw()));
    return t;
  }
  if (proto.data_location() == onnx::TensorProto::EXTERNAL)
    return read_external(proto, base_dir.empty() ? data_source.base_dir : base_dir, dtype, shape, need);
  if (proto.has_raw_data()) {
    if (static_cast<int64_t>(proto.raw_data().size()) != need)
      throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "' has " + std::to_string(proto.raw_data().size()) +
                                                " bytes of raw data, its shape " + shape_to_string(shape) + " of " +
                                                to_string(dtype) + " needs " + std::to_string(need));
    Tensor t = Tensor::uninitialized(dtype, shape);
    if (n) std::memcpy(t.raw(), proto.raw_data().data(), static_cast<size_t>(need));
    return t;
  }
  // Typed fields: each holds one value per element (checked below before any is copied).
  const int64_t values = std::max({proto.float_data_size(), proto.double_data_size(), proto.int64_data_size(),
                                   proto.uint64_data_size(), proto.int32_data_size()});
  if (n > values)
    throw Error(ErrorKind::kInvalidModel, "tensor '" + proto.name() + "' has " + std::to_string(values) + " values for " +
                                              std::to_string(n) + " elements");
  Tensor t(dtype, shape);
  switch (dtype) {
    case DType::kFloat32:
      check_count(proto, proto.float_data(), n);
      std::copy(proto.float_data().begin(), proto.float_data().end(), t.data<float>());
      break;
    case DType::kFloat64:
      check_count(proto, proto.double_data(), n);
      std::copy(proto.double_data().begin(), proto.double_data().end(), t.data<double>());
      break;
    case DType::kInt64:
      check_count(proto, proto.int64_data(), n);
      std::copy(proto.int64_data().begin(), proto.int64_data().end(), t.data<int64_t>());
      break;
    case DType::kUInt32:
    case DType::kUInt64: {
      check_count(proto, proto.uint64_data(), n);
      for (int64_t i = 0; i < n; ++i) {
        if (dtype == DType::kUInt32) t.data<uint32_t>()[i] = static_cast<uint32_t>(proto.uint64_data(static_cast<int>(i)));
        else t.data<uint64_t>()[i] = proto.uint64_data(static_cast<int>(i));
      }
      break;
    }
    case DType::kInt32: case DType::kInt16: case DType::kUInt16: case DType::kInt8:
    case DType::kUInt8: case DType::kBool: case DType::kFloat16: case DType::kBFloat16: case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ: case DType::kFloat8E5M2: case DType::kFloat8E5M2FNUZ: {
      check_count(proto, proto.int32_data(), n);
      for (int64_t i = 0; i < n; ++i) {
        int32_t v = proto.int32_data(static_cast<int>(i));
        switch (dtype) {
          case DType::kInt32: t.data<int32_t>()[i] = v; break;
          case DType::kInt16: t.data<int16_t>()[i] = static_cast<int16_t>(v); break;
          case DType::kInt8: t.data<int8_t>()[i] = static_cast<int8_t>(v); break;
          case DType::kUInt8: t.data<uint8_t>()[i] = static_cast<uint8_t>(v); break;
          case DType::kFloat8E4M3FN: case DType::kFloat8E4M3FNUZ: case DType::kFloat8E5M2: case DType::kFloat8E5M2FNUZ:
            static_cast<uint8_t*>(t.raw())[i] = static_cast<uint8_t>(v);  // bit pattern
            break;
          case DType::kBool: static_cast<uint8_t*>(t.raw())[i] = v ? 1 : 0; break;
          default: static_cast<uint16_t*>(t.raw())[i] = static_cast<uint16_t>(v); break;  // 16-bit bit patterns
        }
      }
      break;
    }
    default:
      throw Error(ErrorKind::kUnsupported, "tensor '" + proto.name() + "' of type " + to_string(dtype));
  }
  return t;
}

Tensor read_tensor_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot open '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  onnx::TensorProto proto;
  if (!proto.ParseFromString(ss.str())) throw model_error(path, "not a serialized ONNX TensorProto");
  try {
    return tensor_from_proto(proto, fs::path(path).parent_path().string());
  } catch (Error& e) {
    e.file(path);
    throw;
  }
}

namespace {

ir::TensorType type_from_proto(const onnx::TypeProto& type, const std::string& value_name) {
  ir::TensorType t;
  if (!type.has_tensor_type())
    throw Error(ErrorKind::kUnsupported, "value '" + value_name + "' is not a tensor (sequences, maps and optionals are not supported)");
  const auto& tt = type.tensor_type();
  if (tt.elem_type() != 0) {
    if (!is_known_dtype(tt.elem_type()))
      throw Error(ErrorKind::kUnsupported, "value '" + value_name + "' has data type " +
                                               to_string(static_cast<DType>(tt.elem_type())) + ", which kiln does not support");
    t.dtype = static_cast<DType>(tt.elem_type());
  }
  if (tt.has_shape()) {
    ir::Dims dims;
    for (const auto& d : tt.shape().dim()) {
      if (d.has_dim_value()) {
        if (d.dim_value() < 0)
          throw Error(ErrorKind::kInvalidModel, "value '" + value_name + "' has a negative dimension");
        dims.push_back(ir::Dim(d.dim_value()));
      } else if (d.has_dim_param() && !d.dim_param().empty()) {
        dims.push_back(ir::Dim::named(d.dim_param()));
      } else {
        dims.push_back(ir::Dim::unknown());
      }
    }
    ir::check_shape_size(dims, t.dtype, "value '" + value_name + "'");
    t.shape = std::move(dims);
  }
  return t;
}

ir::AttrValue attribute_from_proto(const onnx::AttributeProto& a, const std::string& base_dir,
                                   const ir::Node& node) {
  using AP = onnx::AttributeProto;
  AP::AttributeType type = a.type();
  if (type == AP::UNDEFINED) {  // old writers leave the type out: guess from what is set
    if (a.has_f()) type = AP::FLOAT;
    else if (a.has_i()) type = AP::INT;
    else if (a.has_s()) type = AP::STRING;
    else if (a.has_t()) type = AP::TENSOR;
    else if (a.floats_size()) type = AP::FLOATS;
    else if (a.ints_size()) type = AP::INTS;
    else if (a.strings_size()) type = AP::STRINGS;
  }
  switch (type) {
    case AP::INT: return static_cast<int64_t>(a.i());
    case AP::FLOAT: return a.f();
    case AP::STRING: return a.s();
    case AP::INTS: return std::vector<int64_t>(a.ints().begin(), a.ints().end());
    case AP::FLOATS: return std::vector<float>(a.floats().begin(), a.floats().end());
    case AP::STRINGS: return std::vector<std::string>(a.strings().begin(), a.strings().end());
    case AP::TENSOR: return tensor_from_proto(a.t(), base_dir);
    default:
      throw node.error(ErrorKind::kUnsupported,
                       "attribute '" + a.name() + "' has type " + AP::AttributeType_Name(type) +
                           " (subgraphs, sparse tensors and type protos are not supported)");
  }
}

struct UnsupportedOp {
  std::vector<std::string> nodes;
  std::set<int> opsets;
  std::string reason;
};

}  // namespace

namespace {

ir::Graph import_model(const std::string& bytes, const std::string& name, const DataSource& source, bool kiln_ops) {
  // Tensors read during this import find their external data here.
  struct Scope {
    explicit Scope(const DataSource& s) : saved(data_source) { data_source = s; }
    ~Scope() { data_source = saved; }
    DataSource saved;
  } scope(source);
  std::map<std::string, std::shared_ptr<const ExternalFile>> files;
  if (!data_source.files) data_source.files = &files;
  const std::string& base_dir = source.base_dir;
  onnx::ModelProto model;
  {
    google::protobuf::io::ArrayInputStream raw(bytes.data(), static_cast<int>(bytes.size()));
    google::protobuf::io::CodedInputStream coded(&raw);
    coded.SetTotalBytesLimit(INT32_MAX);
    if (bytes.empty() || !model.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage())
      throw model_error(name, "not a valid ONNX model (protobuf parsing failed: the file is truncated, corrupted, or not ONNX)");
  }
  if (!model.has_graph() || model.ir_version() <= 0)
    throw model_error(name, "not a valid ONNX model (no graph or no IR version: is this an ONNX file?)");

  // Opsets by domain.
  std::map<std::string, int> opsets;
  for (const auto& o : model.opset_import()) {
    std::string domain = o.domain() == "ai.onnx" ? "" : o.domain();
    opsets[domain] = static_cast<int>(o.version());
  }
  int opset = opsets.count("") ? opsets[""] : 0;
  if (opset == 0 && model.ir_version() < 3) opset = 1;
  if (opset < kOldestOpset || opset > kMaxOpset)
    throw Error(ErrorKind::kUnsupported, "the model uses ONNX opset " + std::to_string(opset) + "; kiln reads opsets " +
                                             std::to_string(kOldestOpset) + " to " + std::to_string(kMaxOpset))
        .file(name)
        .hint(opset < kOldestOpset ? "convert it with onnx.version_converter.convert_version(model, 17), or re-export with opset_version=17"
                                   : "re-export with an older opset_version");

  const onnx::GraphProto& gp = model.graph();
  ir::Graph graph;
  graph.name = gp.name();
  graph.opset = opset;

  try {
    // Initializers.
    for (const auto& init : gp.initializer()) {
      if (init.name().empty()) throw model_error(name, "an initializer has no name");
      ir::Value v;
      v.name = init.name();
      if (!read_packed_constant(init, v)) v.constant = tensor_from_proto(init, base_dir);
      v.type.dtype = v.constant->dtype();
      v.type.shape = ir::dims_of(v.constant->shape());
      if (v.constant->rank() <= 1 && is_integer(v.type.dtype) && v.constant->numel() <= 64)
        v.symbolic_value = ir::dims_of(v.constant->to_int_vector());
      graph.set_value(std::move(v));
    }
    if (gp.sparse_initializer_size())
      throw Error(ErrorKind::kUnsupported, "sparse initializers are not supported");

    // Inputs (older exporters list initializers as inputs too: those stay constants).
    for (const auto& in : gp.input()) {
      if (in.name().empty()) throw model_error(name, "a graph input has no name");
      if (graph.has_value(in.name())) continue;
      ir::Value v;
      v.name = in.name();
      v.type = type_from_proto(in.type(), in.name());
      if (v.type.dtype == DType::kUndefined) throw model_error(name, "graph input '" + in.name() + "' has no data type");
      if (!v.type.shape) throw Error(ErrorKind::kUnsupported, "graph input '" + in.name() + "' has no shape (not even a rank)");
      graph.inputs.push_back(v.name);
      graph.set_value(std::move(v));
    }
    // Declared types of intermediate values and outputs fill in what inference cannot know.
    for (const auto& vi : gp.value_info()) {
      if (vi.name().empty() || graph.has_value(vi.name()) || !vi.has_type() || !vi.type().has_tensor_type()) continue;
      ir::Value v;
      v.name = vi.name();
      v.type = type_from_proto(vi.type(), vi.name());
      graph.set_value(std::move(v));
    }
    for (const auto& out : gp.output()) {
      if (out.name().empty()) throw model_error(name, "a graph output has no name");
      if (std::find(graph.outputs.begin(), graph.outputs.end(), out.name()) != graph.outputs.end())
        throw model_error(name, "graph output '" + out.name() + "' is listed twice");
      graph.outputs.push_back(out.name());
      if (graph.has_value(out.name())) continue;
      ir::Value v;
      v.name = out.name();
      if (out.has_type()) v.type = type_from_proto(out.type(), out.name());
      graph.set_value(std::move(v));
    }

    // Every unsupported op, reported together.
    std::map<std::string, UnsupportedOp> unsupported;
    const ImporterRegistry& registry = ImporterRegistry::instance();
    for (int i = 0; i < gp.node_size(); ++i) {
      const auto& np = gp.node(i);
      std::string domain = np.domain() == "ai.onnx" ? "" : np.domain();
      std::string node_name = np.name().empty() ? np.op_type() + "_" + std::to_string(i) : np.name();
      int node_opset = opsets.count(domain) ? opsets[domain] : 0;
      std::string key = (domain.empty() ? "" : domain + "::") + np.op_type();
      const OpImporter* imp = domain.empty() ? registry.find(np.op_type()) : nullptr;
      std::string reason;
      if (kiln_ops && domain == "kiln") {
        // kiln's own ops (engine files only): as the passes made them, if this kiln knows them.
        if (!ir::OpRegistry::instance().find(np.op_type(), "kiln")) reason = "not an op of this kiln";
      } else if (!domain.empty()) reason = "domain '" + domain + "' is not supported";
      else if (!imp) reason = "no importer";
      else if (node_opset < imp->since_opset) reason = "supported from opset " + std::to_string(imp->since_opset);
      if (!reason.empty()) {
        auto& u = unsupported[key];
        u.nodes.push_back(node_name);
        u.opsets.insert(node_opset);
        u.reason = reason;
      }
    }
    if (!unsupported.empty()) {
      std::string msg = std::to_string(unsupported.size()) + " unsupported operator type(s): ";
      bool first = true;
      for (const auto& [op, u] : unsupported) {
        if (!first) msg += "; ";
        first = false;
        msg += op + " (opset";
        for (int o : u.opsets) msg += " " + std::to_string(o);
        msg += ", " + u.reason + ") at node(s) ";
        for (size_t k = 0; k < u.nodes.size() && k < 8; ++k) msg += (k ? ", " : "") + u.nodes[k];
        if (u.nodes.size() > 8) msg += " and " + std::to_string(u.nodes.size() - 8) + " more";
      }
      throw Error(ErrorKind::kUnsupported, msg).file(name).hint("see docs/operators.md for what kiln supports");
    }

    // Convert. Each value has one producer (ONNX graphs are in SSA form): a node output that is
    // a graph input or another node's output is refused here, before anything runs on it.
    std::map<std::string, std::string> produced_by;  // value -> the node that writes it
    std::set<std::string> node_names;
    for (int i = 0; i < gp.node_size(); ++i) {
      const auto& np = gp.node(i);
      ir::Node node;
      node.name = np.name().empty() ? np.op_type() + "_" + std::to_string(i) : np.name();
      while (node_names.count(node.name)) node.name += "_" + std::to_string(i);
      node_names.insert(node.name);
      node.op = np.op_type();
      node.inputs.assign(np.input().begin(), np.input().end());
      node.outputs.assign(np.output().begin(), np.output().end());
      for (const auto& a : np.attribute()) {
        if (a.name().empty()) throw node.error(ErrorKind::kInvalidModel, "an attribute has no name");
        if (!a.ref_attr_name().empty())
          throw node.error(ErrorKind::kUnsupported, "attribute references (functions) are not supported");
        // Subgraphs (If's branches) are read from the NodeProto by the op's importer; an op
        // without one (Scan) is refused as unsupported before this.
        if (a.type() == onnx::AttributeProto::GRAPH || a.type() == onnx::AttributeProto::GRAPHS) continue;
        node.attrs.set(a.name(), attribute_from_proto(a, base_dir, node));
      }
      for (const std::string& out : node.outputs) {
        if (out.empty()) continue;
        if (graph.find_value(out) && graph.find_value(out)->constant)
          throw node.error(ErrorKind::kInvalidModel, "output '" + out + "' overwrites an initializer");
        if (std::find(graph.inputs.begin(), graph.inputs.end(), out) != graph.inputs.end())
          throw node.error(ErrorKind::kInvalidModel, "output '" + out + "' overwrites a graph input");
        if (auto [it, fresh] = produced_by.emplace(out, node.name); !fresh)
          throw node.error(ErrorKind::kInvalidModel, "output '" + out + "' is also produced by node '" + it->second + "'");
      }
      if (kiln_ops && (np.domain() == "kiln")) {
        node.domain = "kiln";
        graph.nodes.push_back(std::move(node));
        continue;
      }
      const OpImporter* imp = registry.find(np.op_type());
      ImportContext ctx{np, graph, opsets[""], std::move(node)};
      if (imp->convert) imp->convert(ctx);
      else ctx.emit_as_is();
    }

    graph.topological_sort();
    ir::infer_shapes(graph);
    for (const std::string& out : graph.outputs) {
      const ir::Value* v = graph.find_value(out);
      if (!v || (graph.producer(out) < 0 && !v->constant &&
                 std::find(graph.inputs.begin(), graph.inputs.end(), out) == graph.inputs.end()))
        throw Error(ErrorKind::kInvalidModel, "graph output '" + out + "' is not produced by any node");
    }
  } catch (Error& e) {
    if (e.file_path().empty()) e.file(name);
    throw;
  } catch (const std::exception& e) {
    throw model_error(name, std::string("failed to import: ") + e.what());
  }
  return graph;
}

}  // namespace

ir::Graph import_bytes(const std::string& bytes, const std::string& name, const std::string& base_dir) {
  return import_model(bytes, name, DataSource{base_dir, nullptr}, false);
}

ir::Graph import_engine_graph(const std::string& graph, const std::string& weights, const std::string& name) {
  return import_model(graph, name, DataSource{"", &weights}, true);
}

ir::Graph import_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(ErrorKind::kIo, "file not found").file(path);
  if (fs::is_directory(path, ec)) throw Error(ErrorKind::kIo, "is a directory, not an ONNX file").file(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot open the file").file(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string base = fs::path(path).parent_path().string();
  if (base.empty()) base = ".";
  return import_bytes(ss.str(), path, base);
}

}  // namespace kiln::onnx_import
