// kiln._kiln: the C++ API (include/kiln/kiln.h) for Python, through pybind11. The Python
// package (python/kiln/__init__.py) adds the conveniences on top: Builder, torch tensors,
// calibration from any iterable.
//
// Tensors cross as numpy arrays: inputs are copied in (C-contiguous, the engine's dtype:
// a wrong dtype is kiln's own error, never a silent conversion), outputs are numpy arrays over
// kiln's storage (no copy). GPU buffers of a Context leave as DLPack capsules (the package's
// DeviceTensor hands them out through the protocol), which torch, CuPy and JAX read without a
// copy; Context.bind() takes the caller's GPU memory in (any object with __dlpack__: a torch
// tensor, a CuPy or JAX array) for zero-copy runs.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <iostream>
#include <map>
#include <type_traits>

#include "kiln/kiln.h"
#include "arrays.h"
#include "calibration/calibrate_model.h"
#include "calibration/calibration_cache.h"
#include "cpu/engine.h"

namespace py = pybind11;

namespace kiln::python {
namespace {

// numpy's name of each kiln dtype that numpy has.
const char* numpy_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kFloat64: return "float64";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kUInt16: return "uint16";
    case DType::kUInt32: return "uint32";
    case DType::kUInt64: return "uint64";
    case DType::kBool: return "bool";
    default: return nullptr;
  }
}

DType dtype_of_numpy(const py::dtype& dt, const std::string& what) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt8, DType::kInt16, DType::kInt32,
                  DType::kInt64, DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64, DType::kBool})
    if (dt.is(py::dtype(numpy_name(d)))) return d;
  throw Error(ErrorKind::kInvalidArgument, what + " has numpy dtype " + py::str(dt).cast<std::string>() +
                                               ", which kiln does not take");
}

// How an input array becomes a Tensor: a copy into kiln's 64-byte-aligned storage, or the array's
// own memory, borrowed (for runs that only read their inputs and copy them to the GPU: a context's,
// a GPU engine's). A borrowed tensor holds a reference to the array until the run ends.
enum class InputMemory { kCopy, kBorrow };

// The memory of a CPU engine's input copies, reused from run to run (cpu::BufferPool, as the
// engine's intermediates are). Fresh memory for a large input costs a page fault every 4 KB on
// each run: a run over a 38 MB batch of images took 35 to 41 ms with fresh copies and 10 to 11 ms
// with reused ones on a 2-core VM (bench/cpu_run_input_sizes.py). Engine.profile gives its copies
// back after the run (Engine.run reads the arrays in place); the pool takes only buffers nothing
// else holds (an output over an input's memory keeps it).
cpu::BufferPool& input_pool() {
  static auto* pool = new cpu::BufferPool(0);  // never destroyed: Tensors may outlive static destruction
  return *pool;
}
constexpr size_t kPooledInputBytes = size_t{1} << 20;  // smaller copies come from malloc's own free lists

Tensor to_tensor(const py::handle& object, const std::string& what, InputMemory memory = InputMemory::kCopy) {
  // np.asarray(order="C"): numpy arrays as they are (a copy where not C-contiguous), CPU torch
  // tensors and lists through __array__, and 0-d arrays kept 0-d (np.ascontiguousarray makes them
  // 1-d, which a scalar input then refuses).
  py::array array = py::module_::import("numpy").attr("asarray")(object, py::arg("order") = "C");
  const DType dtype = dtype_of_numpy(array.dtype(), what);
  std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
  if (memory == InputMemory::kBorrow && array.nbytes() > 0) {
    // The deleter runs wherever the last Tensor copy goes (after the run, GIL held or not).
    auto* keep = new py::object(array);
    std::shared_ptr<unsigned char[]> storage(
        static_cast<unsigned char*>(const_cast<void*>(array.data())), [keep](unsigned char*) {
          py::gil_scoped_acquire gil;
          delete keep;
        });
    return Tensor::over_storage(dtype, std::move(shape), std::move(storage));
  }
  const size_t bytes = static_cast<size_t>(array.nbytes());
  Tensor t = bytes >= kPooledInputBytes ? Tensor::over_storage(dtype, std::move(shape), input_pool().take(bytes))
                                        : Tensor::uninitialized(dtype, std::move(shape));
  if (t.nbytes()) std::memcpy(t.raw(), array.data(), t.nbytes());
  return t;
}

// Returns a run's input copies to input_pool() (those nothing else holds: see BufferPool::give).
void give_back(std::map<std::string, Tensor>& inputs) {
  for (auto& [name, t] : inputs) input_pool().give(t);
}

// Outputs whose memory lies in a borrowed input's: copied, so they own their memory.
void copy_outputs_over_inputs(std::map<std::string, Tensor>& outputs, const std::map<std::string, Tensor>& inputs) {
  for (auto& [name, t] : outputs) {
    if (!t.defined() || t.nbytes() == 0) continue;
    const auto* begin = static_cast<const unsigned char*>(t.raw());
    for (const auto& [input_name, x] : inputs) {
      const auto* x_begin = static_cast<const unsigned char*>(x.raw());
      if (x.nbytes() > 0 && begin < x_begin + x.nbytes() && x_begin < begin + t.nbytes()) {
        t = t.clone();
        break;
      }
    }
  }
}

py::array to_numpy(const Tensor& t) {
  const char* name = numpy_name(t.dtype());
  if (!name) throw Error(ErrorKind::kUnsupported, "an output of dtype " + to_string(t.dtype()) + " has no numpy dtype");
  // The array keeps a copy of the Tensor (shared storage) alive: no data is copied.
  auto* owner = new Tensor(t);
  py::capsule keep(owner, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  if (!owner->raw()) return py::array(py::dtype(name), shape);  // empty tensor
  return py::array(py::dtype(name), shape, {}, owner->raw(), keep);
}

std::map<std::string, Tensor> to_tensors(const py::dict& inputs, InputMemory memory = InputMemory::kCopy) {
  std::map<std::string, Tensor> out;
  for (const auto& [key, value] : inputs) {
    const std::string name = py::str(key).cast<std::string>();
    out.emplace(name, to_tensor(value, "input '" + name + "'", memory));
  }
  return out;
}

py::dict to_dict(const std::map<std::string, Tensor>& tensors) {
  py::dict out;
  for (const auto& [name, t] : tensors) out[py::str(name)] = to_numpy(t);
  return out;
}

// Engine.profile and Context.profile: one dict per layer (name, op, tactic, ms, flops, bytes).
py::list timing_rows(const std::vector<LayerTiming>& timings) {
  py::list rows;
  for (const LayerTiming& t : timings) {
    py::dict d;
    d["name"] = t.name, d["op"] = t.op, d["tactic"] = t.tactic, d["ms"] = t.ms, d["flops"] = t.flops;
    d["bytes"] = t.bytes;
    rows.append(d);
  }
  return rows;
}

Precision parse_precision(const std::string& p) {
  for (Precision x : {Precision::kFp32, Precision::kTf32, Precision::kFp16, Precision::kBest, Precision::kInt8, Precision::kFp8,
                      Precision::kBf16})
    if (p == to_string(x)) return x;
  throw Error(ErrorKind::kInvalidArgument, "unknown precision '" + p + "' (fp32, tf32, fp16, best, int8, fp8 or bf16)");
}

Device parse_device(const std::string& d) {
  if (d == "cpu") return Device::kCpu;
  if (d == "cuda" || d == "gpu") return Device::kCuda;
  throw Error(ErrorKind::kInvalidArgument, "unknown device '" + d + "' (cpu or cuda)");
}

// DLPack, as the standard defines it (dlpack.h v0.8 layout), for the GPU buffers of a Context.
struct DLDevice { int32_t device_type; int32_t device_id; };
struct DLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor {
  void* data; DLDevice device; int32_t ndim; DLDataType dtype; int64_t* shape; int64_t* strides; uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor; void* manager_ctx; void (*deleter)(DLManagedTensor*);
};
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kDLCUDAManaged = 13;
// DLPack 1.0's versioned form, which producers may hand out.
struct DLPackVersion { uint32_t major; uint32_t minor; };
struct DLManagedTensorVersioned {
  DLPackVersion version; void* manager_ctx; void (*deleter)(DLManagedTensorVersioned*); uint64_t flags; DLTensor dl_tensor;
};
constexpr uint64_t kDLFlagReadOnly = 1;

DLDataType dlpack_dtype(DType d) {
  enum : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBool = 6 };
  const uint8_t bits = static_cast<uint8_t>(element_size(d) * 8);
  if (d == DType::kBool) return {kBool, 8, 1};
  if (d == DType::kBFloat16) return {4, 16, 1};  // kDLBfloat
  if (is_float(d) && d != DType::kBFloat16) return {kFloat, bits, 1};
  if (d == DType::kUInt8 || d == DType::kUInt16 || d == DType::kUInt32 || d == DType::kUInt64) return {kUInt, bits, 1};
  if (is_integer(d)) return {kInt, bits, 1};
  throw Error(ErrorKind::kUnsupported, "no DLPack form for dtype " + to_string(d));
}

// A DLPack capsule over a device buffer: "dltensor" (DLPack 0.x, what every consumer reads) or
// "dltensor_versioned" (1.0, for consumers that ask with max_version). `keep` (the Context)
// outlives the capsule's consumers because the managed tensor holds a reference to it.
struct DlpackOwner {
  std::vector<int64_t> shape;
  py::object keep;
};

template <class Managed>
constexpr const char* capsule_name() {
  return std::is_same_v<Managed, DLManagedTensorVersioned> ? "dltensor_versioned" : "dltensor";
}

template <class Managed>
py::capsule owned_capsule(const DLTensor& tensor, DlpackOwner* owner) {
  auto* m = new Managed{};
  if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>) m->version = {1, 0};
  m->dl_tensor = tensor;
  m->manager_ctx = owner;
  m->deleter = [](Managed* self) {
    py::gil_scoped_acquire gil;
    delete static_cast<DlpackOwner*>(self->manager_ctx);
    delete self;
  };
  // The consumer renames a used capsule ("used_dltensor", "used_dltensor_versioned") and calls
  // the deleter itself; an unused one is freed here.
  return py::capsule(m, capsule_name<Managed>(), [](PyObject* capsule) {
    if (PyCapsule_IsValid(capsule, capsule_name<Managed>())) {
      auto* self = static_cast<Managed*>(PyCapsule_GetPointer(capsule, capsule_name<Managed>()));
      self->deleter(self);
    }
  });
}

py::capsule dlpack_capsule(void* data, int gpu, DType dtype, std::vector<int64_t> shape, py::object keep,
                           bool versioned) {
  auto* owner = new DlpackOwner{std::move(shape), std::move(keep)};
  const DLTensor tensor{data, {kDLCUDA, gpu}, static_cast<int32_t>(owner->shape.size()), dlpack_dtype(dtype),
                        owner->shape.data(), nullptr, 0};
  return versioned ? owned_capsule<DLManagedTensorVersioned>(tensor, owner) : owned_capsule<DLManagedTensor>(tensor, owner);
}

const TensorDesc& find_desc(const std::vector<TensorDesc>& list, const std::string& name, const char* what) {
  for (const TensorDesc& d : list)
    if (d.name == name) return d;
  throw Error(ErrorKind::kInvalidArgument, std::string("the engine has no ") + what + " '" + name + "'");
}

// A DLPack capsule over one of a Context's (`self`'s) input or output buffers, at the context's
// current shapes.
py::capsule buffer_dlpack(py::object self, const Engine& engine, const std::string& name, bool output, bool versioned) {
  Context& c = self.cast<Context&>();
  if (output)
    return dlpack_capsule(c.output_buffer(name), engine.gpu(), find_desc(engine.outputs(), name, "output").dtype,
                          c.output_shape(name), self, versioned);
  return dlpack_capsule(c.input_buffer(name), engine.gpu(), find_desc(engine.inputs(), name, "input").dtype,
                        c.input_shape(name), self, versioned);
}

// GPU memory that an object exports through DLPack, as Context.bind() takes it.
struct ExportedMemory {
  void* address = nullptr;
  size_t bytes = 0;
  std::vector<int64_t> shape;
  DLDataType dtype{};
  int device_type = 0, device = 0;
  bool read_only = false;
};

// Reads an object's DLPack export (the protocol's __dlpack__, without stream synchronization:
// the caller orders its work and the runs) and hands the capsule back to its producer at once;
// the caller keeps `object` alive, and with it the memory. Throws naming `what` for memory that
// is not dense row-major.
ExportedMemory exported_memory(const py::handle& object, const std::string& what) {
  if (!py::hasattr(object, "__dlpack__"))
    throw Error(ErrorKind::kInvalidArgument, what + " is a " + py::str(py::type::of(object).attr("__name__")).cast<std::string>() +
                                                 ", which has no __dlpack__")
        .hint("give a CUDA tensor or array: torch, CuPy, JAX, or anything with __dlpack__");
  py::object capsule;
  try {
    capsule = object.attr("__dlpack__")(py::arg("stream") = -1);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = object.attr("__dlpack__")();  // a producer without the stream argument
  }
  PyObject* c = capsule.ptr();
  const DLTensor* t = nullptr;
  std::function<void()> release;
  ExportedMemory m;
  if (PyCapsule_IsValid(c, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
    PyCapsule_SetName(c, "used_dltensor");
    t = &managed->dl_tensor;
    release = [managed] { if (managed->deleter) managed->deleter(managed); };
  } else if (PyCapsule_IsValid(c, "dltensor_versioned")) {
    auto* managed = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(c, "dltensor_versioned"));
    PyCapsule_SetName(c, "used_dltensor_versioned");
    t = &managed->dl_tensor;
    m.read_only = (managed->flags & kDLFlagReadOnly) != 0;
    release = [managed] { if (managed->deleter) managed->deleter(managed); };
  } else {
    throw Error(ErrorKind::kInvalidArgument, what + ": __dlpack__ returned no DLPack capsule");
  }
  struct Release {
    std::function<void()> f;
    ~Release() { f(); }
  } released{release};
  m.device_type = t->device.device_type;
  m.device = t->device.device_id;
  m.dtype = t->dtype;
  if (t->ndim < 0 || t->ndim > 64)
    throw Error(ErrorKind::kInvalidArgument, what + " has rank " + std::to_string(t->ndim));
  m.shape.assign(t->shape, t->shape + t->ndim);
  // Dense row-major: strides absent, or each the product of the dimensions after it (a
  // dimension of size 1 may have any stride).
  if (t->strides) {
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      if (m.shape[static_cast<size_t>(i)] != 1 && t->strides[i] != expected)
        throw Error(ErrorKind::kInvalidArgument, what + " is not dense and row-major (dimension " + std::to_string(i) +
                                                     " has stride " + std::to_string(t->strides[i]) + ", not " +
                                                     std::to_string(expected) + ")")
            .hint("bind a contiguous copy (tensor.contiguous())");
      expected *= m.shape[static_cast<size_t>(i)];
    }
  }
  if (t->dtype.lanes != 1 || t->dtype.bits % 8 != 0 || t->dtype.bits == 0)
    throw Error(ErrorKind::kInvalidArgument, what + " has a DLPack dtype of " + std::to_string(t->dtype.bits) + " bits in " +
                                                 std::to_string(t->dtype.lanes) + " lanes");
  const size_t elements = static_cast<size_t>(shape_numel(m.shape));  // checked: throws past kiln's limits
  m.bytes = elements * (t->dtype.bits / 8);
  m.address = static_cast<char*>(t->data) + t->byte_offset;
  return m;
}

// Context.bind(): `object`'s memory for an input or output of the context (`self`); an input
// takes the object's shape. The Context keeps `object` (its `_bound` dict) until bound again.
void bind_memory(py::object self, const std::string& name, const py::handle& object) {
  Context& context = self.cast<Context&>();
  const Engine& engine = self.attr("engine").cast<const Engine&>();
  const TensorDesc* desc = nullptr;
  bool is_input = false;
  for (const TensorDesc& d : engine.inputs())
    if (d.name == name) desc = &d, is_input = true;
  if (!desc)
    for (const TensorDesc& d : engine.outputs())
      if (d.name == name) desc = &d;
  if (!desc) throw Error(ErrorKind::kInvalidArgument, "the engine has no input or output named '" + name + "'");
  const std::string what = std::string(is_input ? "input" : "output") + " '" + name + "'";
  const ExportedMemory m = exported_memory(object, "memory for " + what);
  if (m.device_type != kDLCUDA && m.device_type != kDLCUDAManaged)
    throw Error(ErrorKind::kInvalidArgument, "memory for " + what + " is not on a CUDA device (DLPack device type " +
                                                 std::to_string(m.device_type) + ")")
        .hint("bind GPU memory; host data goes through run()");
  if (m.device != engine.gpu())
    throw Error(ErrorKind::kInvalidArgument, "memory for " + what + " is on GPU " + std::to_string(m.device) +
                                                 ", the engine runs on GPU " + std::to_string(engine.gpu()));
  const DLDataType want = dlpack_dtype(desc->dtype);
  if (m.dtype.code != want.code || m.dtype.bits != want.bits)
    throw Error(ErrorKind::kInvalidArgument, "memory for " + what + " holds DLPack dtype code " + std::to_string(m.dtype.code) +
                                                 " of " + std::to_string(m.dtype.bits) + " bits; the engine's is " +
                                                 to_string(desc->dtype));
  if (!is_input && m.read_only)
    throw Error(ErrorKind::kInvalidArgument, "memory for " + what + " is read-only");
  {
    py::gil_scoped_release release;
    if (is_input && m.shape != context.input_shape(name)) context.set_input_shape(name, m.shape);
    context.set_tensor_address(name, m.address, m.bytes);
  }
  py::object held = py::getattr(self, "_bound", py::none());
  if (held.is_none()) {
    held = py::dict();
    py::setattr(self, "_bound", held);
  }
  held[py::str(name)] = object;
}

py::dict engine_info(const Engine& engine) {
  const EngineInfo info = engine.info();
  py::list layers;
  for (const LayerInfo& l : info.layers) {
    py::dict d;
    d["name"] = l.name, d["op"] = l.op, d["tactic"] = l.tactic, d["precision"] = l.precision;
    d["cpu_fallback"] = l.cpu_fallback, d["flops"] = l.flops;
    d["members"] = l.members;  // a fused group's nodes (GPU FusedElementwise), else empty
    layers.append(d);
  }
  py::dict d;
  d["backend"] = info.backend, d["device"] = info.device, d["gpu"] = info.gpu, d["precision"] = info.precision;
  d["layers"] = layers;
  d["weight_bytes"] = info.weight_bytes, d["activation_bytes"] = info.activation_bytes;
  d["workspace_bytes"] = info.workspace_bytes, d["fp32_layers"] = info.fp32_layers;
  d["int8_kept_float"] = info.int8_kept_float, d["has_cpu_fallback"] = info.has_cpu_fallback;
  d["data_dependent_nodes"] = info.data_dependent_nodes;
  d["io_bytes"] = info.io_bytes, d["planned_shapes"] = info.planned_shapes;
  d["device_memory_bytes"] = info.device_memory_bytes;
  py::list profiles;
  for (const ProfileInfo& p : info.profiles) {
    py::dict pd;
    pd["ranges"] = p.ranges;
    pd["activation_bytes"] = p.activation_bytes, pd["workspace_bytes"] = p.workspace_bytes;
    profiles.append(pd);
  }
  d["profiles"] = profiles;
  return d;
}

}  // namespace

std::map<std::string, Tensor> tensors_of(const py::dict& arrays) { return to_tensors(arrays, InputMemory::kCopy); }
py::dict tensors_to_dict(const std::map<std::string, Tensor>& tensors) { return to_dict(tensors); }

PYBIND11_MODULE(_kiln, m) {
  m.doc() = "kiln's C++ engine (include/kiln/kiln.h); use the kiln package, which wraps it.";
  m.attr("__version__") = KILN_VERSION;
#if KILN_WITH_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif

  // kiln::Error -> kiln.Error (a RuntimeError) with the message kiln prints, or the subclass of
  // its kind, carrying what kiln::Error carries: kind, message, file, node, op_type,
  // input_index and hint (empty strings and -1 where kiln did not say).
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  struct KindClass {
    ErrorKind kind;
    const char* name;
    const char* id;
    PyObject* extra_base;
  };
  static const KindClass kind_classes[] = {
      {ErrorKind::kInvalidModel, "InvalidModelError", "invalid_model", nullptr},
      {ErrorKind::kUnsupported, "UnsupportedError", "unsupported", nullptr},
      {ErrorKind::kInvalidArgument, "InvalidArgumentError", "invalid_argument", PyExc_ValueError},
      {ErrorKind::kIo, "IoError", "io", nullptr},
      {ErrorKind::kDevice, "DeviceError", "device", nullptr},
      {ErrorKind::kInternal, "InternalError", "internal", nullptr},
  };
  // Class attributes: what an Error raised by the package's Python code says.
  for (const char* field : {"kind", "message", "file", "node", "op_type", "hint"}) error.attr(field) = "";
  error.attr("input_index") = -1;
  // Never destroyed: the classes live as long as the interpreter, which outlives static destructors' order.
  static auto& error_classes = *new std::map<ErrorKind, py::object>();
  for (const KindClass& k : kind_classes) {
    py::tuple bases = k.extra_base ? py::tuple(py::make_tuple(error, py::handle(k.extra_base)))
                                   : py::tuple(py::make_tuple(error));
    const std::string qualified = std::string("kiln._kiln.") + k.name;
    PyObject* cls = PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr);
    if (!cls) throw py::error_already_set();
    error_classes[k.kind] = py::reinterpret_steal<py::object>(cls);
    error_classes[k.kind].attr("kind") = k.id;
    m.attr(k.name) = error_classes[k.kind];
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      auto it = error_classes.find(e.kind());
      py::object cls = it != error_classes.end() ? it->second : py::object(error);
      py::object instance = cls(e.what());
      instance.attr("message") = e.message();
      instance.attr("file") = e.file_path();
      instance.attr("node") = e.node_name();
      instance.attr("op_type") = e.op_type();
      instance.attr("input_index") = e.input_index();
      instance.attr("hint") = e.hint_text();
      PyErr_SetObject(cls.ptr(), instance.ptr());
    }
  });

  py::class_<TensorDesc>(m, "TensorDesc")
      .def_readonly("name", &TensorDesc::name)
      .def_property_readonly("dtype", [](const TensorDesc& d) { return to_string(d.dtype); })
      .def_readonly("shape", &TensorDesc::shape, "dimensions; -1 where dynamic")
      .def_readonly("dim_names", &TensorDesc::dim_names)
      .def("__repr__", [](const TensorDesc& d) {
        return "TensorDesc(" + d.name + ", " + to_string(d.dtype) + ", [" + shape_to_string(d.shape) + "])";
      });

  py::class_<ShapeRange>(m, "ShapeRange", "min, opt and max shapes of one input in an optimization profile")
      .def(py::init([](std::vector<int64_t> min, std::vector<int64_t> opt, std::vector<int64_t> max) {
             return ShapeRange{std::move(min), std::move(opt), std::move(max)};
           }),
           py::arg("min"), py::arg("opt"), py::arg("max"))
      .def_readwrite("min", &ShapeRange::min)
      .def_readwrite("opt", &ShapeRange::opt)
      .def_readwrite("max", &ShapeRange::max)
      .def("__repr__", [](const ShapeRange& r) {
        return "ShapeRange(min=[" + shape_to_string(r.min) + "], opt=[" + shape_to_string(r.opt) + "], max=[" +
               shape_to_string(r.max) + "])";
      });

  py::class_<BuildOptions>(m, "BuildOptions")
      .def(py::init<>())
      .def_readwrite("optimize", &BuildOptions::optimize)
      .def_property(
          "device", [](const BuildOptions& o) { return std::string(o.device == Device::kCpu ? "cpu" : "cuda"); },
          [](BuildOptions& o, const std::string& d) { o.device = parse_device(d); })
      .def_property(
          "precision", [](const BuildOptions& o) { return std::string(to_string(o.precision)); },
          [](BuildOptions& o, const std::string& p) { o.precision = parse_precision(p); })
      .def_readwrite("input_shapes", &BuildOptions::input_shapes)
      .def_readwrite("profiles", &BuildOptions::profiles, "list of {input name: ShapeRange} (GPU dynamic shapes)")
      .def_property(
          "input_values", [](const BuildOptions& o) { return to_dict(o.input_values); },
          [](BuildOptions& o, const py::dict& values) { o.input_values = to_tensors(values); },
          "GPU engines: {input name: array} for inputs that set parameters (axes, sizes, k, ...): planned for these values")
      .def_readwrite("profile_timing_step", &BuildOptions::profile_timing_step)
      .def_readwrite("timing_cache", &BuildOptions::timing_cache)
      .def_readwrite("allow_cpu_fallback", &BuildOptions::allow_cpu_fallback)
      .def_readwrite("gpu_row_stages", &BuildOptions::gpu_row_stages,
                     "GPU builds with a CPU tail: its per-region heads (box, mask heads) on the GPU")
      .def_readwrite("mark_outputs", &BuildOptions::mark_outputs)
      .def_readwrite("max_memory", &BuildOptions::max_memory,
                     "bytes a run may allocate (0: the machine's memory, or the GPU's); more is refused up front")
      .def_readwrite("gpu", &BuildOptions::gpu,
                     "GPU engines: the GPU built on and run on (CUDA's device index in this process)")
      .def_readwrite("int8_scales", &BuildOptions::int8_scales)
      .def_readwrite("float_layers", &BuildOptions::float_layers)
      .def_readwrite("fp32_layers", &BuildOptions::fp32_layers,
                     "GPU fp16 (best, int8, fp8) builds: layers kept in float32 storage and math, by name")
      .def_readwrite("quantized_where_faster", &BuildOptions::quantized_where_faster,
                     "int8 and fp8 GPU builds: quantized only in layers where it times faster than fp16 (else every "
                     "eligible layer)")
      .def_readwrite("log", &BuildOptions::log);

  py::class_<Engine>(m, "Engine")
      .def_static(
          "from_onnx",
          [](const std::string& path, const BuildOptions& options) {
            py::gil_scoped_release release;
            return Engine::from_onnx(path, options);
          },
          py::arg("path"), py::arg("options") = BuildOptions{})
      .def_static(
          "load",
          [](const std::string& path, size_t max_memory, int gpu) {
            py::gil_scoped_release release;
            LoadOptions options;
            options.max_memory = max_memory;
            options.gpu = gpu;
            return Engine::load(path, options);
          },
          py::arg("path"), py::arg("max_memory") = 0, py::arg("gpu") = 0)
      .def("save", &Engine::save, py::arg("path"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("inputs", &Engine::inputs)
      .def_property_readonly("outputs", &Engine::outputs)
      .def_property_readonly("profiles", &Engine::profiles)
      .def_property_readonly("backend", &Engine::backend)
      .def_property_readonly("gpu", &Engine::gpu, "GPU engines: the GPU they run on; CPU engines: -1")
      .def_property_readonly("layer_count", &Engine::layer_count)
      .def("info", &engine_info)
      .def("create_context",
           [](const Engine& engine, bool use_cuda_graph, bool share_activation_memory) {
             ContextOptions options;
             options.use_cuda_graph = use_cuda_graph;
             options.share_activation_memory = share_activation_memory;
             return engine.create_context(options);
           },
           py::arg("use_cuda_graph") = true, py::arg("share_activation_memory") = false)
      .def("run", [](const Engine& engine, const py::dict& inputs) {
        // The arrays are read in place: no engine writes its inputs (a GPU engine copies them to
        // the device, a CPU engine's kernels read them with unaligned loads). An output over an
        // input's memory (an Identity or Reshape of it) is copied, so that no output shares memory
        // with the caller's arrays.
        std::map<std::string, Tensor> in = to_tensors(inputs, InputMemory::kBorrow);
        std::map<std::string, Tensor> out;
        {
          py::gil_scoped_release release;
          out = engine.run(in);
          copy_outputs_over_inputs(out, in);
        }
        return to_dict(out);
      })
      .def("profile", [](const Engine& engine, const py::dict& inputs) {
        std::map<std::string, Tensor> in = to_tensors(inputs, InputMemory::kCopy);
        std::vector<LayerTiming> timings;
        {
          py::gil_scoped_release release;
          timings = engine.profile(in);
        }
        give_back(in);
        return timing_rows(timings);
      });

  // The Context keeps its Engine alive (Engine's shared Impl): py::keep_alive ties the Python
  // objects too, so an engine's owner may drop it while contexts run.
  py::class_<Context>(m, "Context", py::dynamic_attr())
      .def("run",
           [](Context& context, const py::dict& inputs) {
             // A context (GPU engines only) copies its inputs to the device: no copy here first.
             std::map<std::string, Tensor> in = to_tensors(inputs, InputMemory::kBorrow);
             std::map<std::string, Tensor> out;
             {
               py::gil_scoped_release release;
               out = context.run(in);
             }
             return to_dict(out);
           })
      .def("run_concatenated",
           [](Context& context, const py::dict& pieces, int64_t zero_rows) {
             std::map<std::string, std::vector<Tensor>> in;
             for (const auto& [key, value] : pieces) {
               const std::string name = py::str(key).cast<std::string>();
               if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value))
                 throw Error(ErrorKind::kInvalidArgument, "input '" + name + "': give a list of arrays (its pieces)");
               for (const py::handle& piece : value)
                 in[name].push_back(to_tensor(piece, "a piece of input '" + name + "'", InputMemory::kBorrow));
             }
             std::map<std::string, Tensor> out;
             {
               py::gil_scoped_release release;
               out = context.run_concatenated(in, zero_rows);
             }
             return to_dict(out);
           },
           py::arg("pieces"), py::arg("zero_rows") = 0,
           "run() of inputs given as lists of arrays, one after another along the first dimension, then "
           "zero_rows rows of zeros; each piece is copied once, into the context's transfer buffer")
      .def("enqueue",
           [](Context& context, uintptr_t stream) { context.enqueue(reinterpret_cast<void*>(stream)); },
           py::arg("cuda_stream") = 0, py::call_guard<py::gil_scoped_release>(),
           "Runs on a CUDA stream (an int, as torch.cuda.Stream.cuda_stream), asynchronously")
      .def("set_input_shape", &Context::set_input_shape, py::arg("name"), py::arg("shape"),
           py::call_guard<py::gil_scoped_release>(), "The shape of an input for the next runs (within the profile)")
      .def("input_shape", &Context::input_shape, py::arg("name"))
      .def(
          "set_input_values",
          [](Context& c, const std::string& name, const py::handle& values) {
            Tensor t = to_tensor(values, "values for input '" + name + "'");
            py::gil_scoped_release release;
            c.set_input_values(name, t);
          },
          py::arg("name"), py::arg("values"),
          "The values of an input planned by value (Builder(input_values=...)) for the next enqueue()s")
      .def("output_shape", &Context::output_shape, py::arg("name"), py::call_guard<py::gil_scoped_release>())
      .def_property("optimization_profile", &Context::optimization_profile, &Context::set_optimization_profile)
      .def("input_pointer", [](const Context& c, const std::string& name) {
        return reinterpret_cast<uintptr_t>(c.input_buffer(name));
      })
      .def("output_pointer", [](const Context& c, const std::string& name) {
        return reinterpret_cast<uintptr_t>(c.output_buffer(name));
      })
      .def(
          "input_dlpack",
          [](py::object self, const Engine& engine, const std::string& name, bool versioned) {
            return buffer_dlpack(self, engine, name, false, versioned);
          },
          py::arg("engine"), py::arg("name"), py::arg("versioned") = false)
      .def(
          "output_dlpack",
          [](py::object self, const Engine& engine, const std::string& name, bool versioned) {
            return buffer_dlpack(self, engine, name, true, versioned);
          },
          py::arg("engine"), py::arg("name"), py::arg("versioned") = false)
      .def(
          "wait_for_last_run",
          [](Context& context, uintptr_t stream) { context.wait_for_last_run(reinterpret_cast<void*>(stream)); },
          py::arg("cuda_stream"), py::call_guard<py::gil_scoped_release>(),
          "Makes work queued on a CUDA stream from now on wait until the last enqueue() or run() has written its "
          "outputs")
      .def("bind", &bind_memory, py::arg("name"), py::arg("memory"),
           "Zero-copy I/O: enqueue() reads the input, or writes the output, `name` in `memory` (a CUDA tensor or "
           "array with __dlpack__: torch, CuPy, JAX; dense, row-major, the engine's dtype, on its GPU, 256-byte "
           "aligned) instead of the context's buffer; an input takes memory's shape. The context holds `memory` "
           "until bound again or unbind(name). The caller orders its work on the memory with the runs (streams).")
      .def(
          "unbind",
          [](py::object self, const std::string& name) {
            self.cast<Context&>().set_tensor_address(name, nullptr, 0);
            py::object held = py::getattr(self, "_bound", py::none());
            if (!held.is_none()) held.attr("pop")(py::str(name), py::none());
          },
          py::arg("name"), "The context's own buffer for `name` again")
      .def(
          "set_tensor_address",
          [](Context& c, const std::string& name, uintptr_t pointer, size_t nbytes) {
            c.set_tensor_address(name, reinterpret_cast<void*>(pointer), nbytes);
          },
          py::arg("name"), py::arg("pointer"), py::arg("nbytes"),
          "bind() by raw device pointer (0 unbinds): the caller keeps the memory alive while runs use it")
      .def("tensor_address", [](const Context& c, const std::string& name) {
        return reinterpret_cast<uintptr_t>(c.tensor_address(name));
      }, py::arg("name"), "The device address enqueue() uses for an input or output: the bound memory's, else the context's")
      .def("profile", [](Context& c, uintptr_t stream) {
        std::vector<LayerTiming> timings;
        {
          py::gil_scoped_release release;
          timings = c.profile(reinterpret_cast<void*>(stream));
        }
        return timing_rows(timings);
      }, py::arg("cuda_stream") = 0);

  // Host memory pinned for the GPU, read through the buffer protocol: arrays over it (numpy's
  // frombuffer) keep it pinned, and it keeps the memory it was made from exported, so neither
  // goes while a run may still copy from it.
  struct PinnedBuffer {
    py::buffer owner;
    py::buffer_info view;
    std::unique_ptr<PinnedHostMemory> pin;  // last: unregistered before the view is released
  };
  py::class_<PinnedBuffer>(m, "PinnedHostMemory", py::buffer_protocol(),
                           "Host memory page-locked for the GPU while this object lives: Context.run and "
                           "run_concatenated copy inputs lying in it (arrays over it: numpy.frombuffer) straight to "
                           "the device. Made from a writable buffer (an mmap, a bytearray, a numpy array); it reads "
                           "as that buffer's bytes")
      .def(py::init([](py::buffer memory, int gpu) {
             auto b = std::make_unique<PinnedBuffer>();
             b->owner = memory;
             b->view = memory.request(true);
             const size_t bytes = static_cast<size_t>(b->view.size) * static_cast<size_t>(b->view.itemsize);
             bool dense = true;
             ssize_t stride = b->view.itemsize;
             for (ssize_t d = b->view.ndim - 1; d >= 0; --d) {
               if (b->view.shape[static_cast<size_t>(d)] > 1 && b->view.strides[static_cast<size_t>(d)] != stride) dense = false;
               stride *= b->view.shape[static_cast<size_t>(d)];
             }
             if (!dense) throw Error(ErrorKind::kInvalidArgument, "memory to pin must be contiguous");
             {
               py::gil_scoped_release release;
               b->pin = std::make_unique<PinnedHostMemory>(b->view.ptr, bytes, gpu);
             }
             return b;
           }),
           py::arg("memory"), py::arg("gpu") = 0)
      .def_buffer([](PinnedBuffer& b) {
        return py::buffer_info(b.pin->data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<ssize_t>(b.pin->size())}, {static_cast<ssize_t>(1)}, false);
      })
      .def("__len__", [](const PinnedBuffer& b) { return b.pin->size(); })
      .def_property_readonly("address", [](const PinnedBuffer& b) { return reinterpret_cast<uintptr_t>(b.pin->data()); });

  m.def(
      "model_inputs",
      [](const std::string& path) {
        py::gil_scoped_release release;
        return model_inputs(path);
      },
      py::arg("onnx_path"), "The model's inputs as its file declares them (-1 where a dim is dynamic), without a build");

  m.def(
      "set_cpu_threads",
      [](int threads) {
        py::gil_scoped_release release;  // waits for a loop running on another thread
        set_cpu_threads(threads);
      },
      py::arg("threads"),
      "Threads of the CPU engine's parallel loops, for the whole process (0: the CPUs this process may run on)");
  m.def("cpu_threads", &cpu_threads, "Threads of the CPU engine's parallel loops, the calling thread included");

  m.def(
      "simplify_onnx",
      [](const std::string& in, const std::string& out) {
        SimplifyResult r;
        {
          py::gil_scoped_release release;
          r = simplify_onnx(in, out);
        }
        return py::make_tuple(r.nodes_before, r.nodes_after);
      },
      py::arg("onnx_path"), py::arg("output_path"),
      "Writes the model after kiln's folding passes as ONNX; returns (nodes before, nodes after)");

  // Calibration from Python batches: `next_batch()` returns the next batch (a dict of numpy
  // arrays by input name, or one array for a model of one input) or None when there are no
  // more. Returns {tensor name: scale}.
  m.def(
      "calibrate",
      [](const std::string& model, py::function next_batch, const std::string& algorithm, double percentile,
         int max_batches, const std::string& device, int gpu, bool progress) {
        calibration::CalibrationOptions o;
        o.data = "the Python batches";
        o.algorithm = calibration::parse_calibration_algorithm(algorithm);
        o.percentile = percentile;
        o.max_batches = max_batches;
        o.device = parse_device(device);
        o.gpu = gpu;
        const std::vector<TensorDesc> inputs = model_inputs(model);
        size_t count = 0;
        o.next_batch = [&](calibration::Feeds& batch) {
          py::gil_scoped_acquire gil;
          py::object b = next_batch();
          if (b.is_none()) return false;
          const std::string what = "calibration batch " + std::to_string(++count);
          if (py::isinstance<py::dict>(b)) {
            for (const auto& [name, t] : to_tensors(b.cast<py::dict>())) batch.emplace(name, t);
          } else {
            if (inputs.size() != 1)
              throw Error(ErrorKind::kInvalidArgument, what + " is one array, but " + model + " has " + std::to_string(inputs.size()) +
                                                           " inputs")
                  .hint("give each batch as a dict {input name: array}");
            batch.emplace(inputs[0].name, to_tensor(b, what));
          }
          return true;
        };
        if (progress)
          o.progress = [](size_t done, size_t, size_t tensors) {
            std::cerr << "\rkiln: calibration batch " << done << ", " << tensors << " tensors" << std::flush;
          };
        calibration::CalibrationResult r;
        {
          py::gil_scoped_release release;
          r = calibration::calibrate_model(model, o);
        }
        if (progress) std::cerr << "\n";
        return r.cache.scales;
      },
      py::arg("model"), py::arg("next_batch"), py::arg("algorithm") = "entropy", py::arg("percentile") = 99.99,
      py::arg("max_batches") = 0, py::arg("device") = "cpu", py::arg("gpu") = 0, py::arg("progress") = true);

#if KILN_WITH_NATIVE_GRPC
  m.attr("has_native_grpc") = true;
  bind_serve(m);
#else
  m.attr("has_native_grpc") = false;
#endif
}

}  // namespace kiln::python
