// kiln._kiln.GrpcFront: kiln serve's native gRPC front (src/serve/grpc_front.h) for the Python
// side of kiln serve, which loads the models and hands their engine runs over: a GPU model's
// contexts (each run on a thread of its own), or a CPU engine.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "kiln/kiln.h"
#include "serve/grpc_front.h"

namespace py = pybind11;

namespace kiln::python {

namespace {

// A model as kiln serve describes it: name, version, engine (its inputs and outputs), runs
// [(device, Engine or Context)], max_batch, max_queue_delay_us, batch_sizes and (optional) max_queue.
serve::ServedModel served_model(const py::dict& d) {
  serve::ServedModel m;
  m.name = d["name"].cast<std::string>();
  m.version = d.contains("version") ? d["version"].cast<std::string>() : "";
  for (const py::handle& item : d["runs"].cast<py::list>()) {
    auto pair = item.cast<py::tuple>();
    if (pair.size() != 2) throw Error(ErrorKind::kInvalidArgument, "model '" + m.name + "': a run is (device, engine or context)");
    serve::Runner runner;
    runner.device = pair[0].cast<std::string>();
    py::handle target = pair[1];
    if (py::isinstance<Context>(target)) {
      Context context = target.cast<Context>();
      runner.run = [context](const std::map<std::string, std::vector<Tensor>>& pieces, int64_t zero_rows) mutable {
        // One request, unpadded: its inputs as they are (a model whose inputs have no batch
        // dimension, scalars included, always runs so).
        bool single = zero_rows == 0;
        for (const auto& [name, list] : pieces) single = single && list.size() == 1;
        if (!single) return context.run_concatenated(pieces, zero_rows);
        std::map<std::string, Tensor> inputs;
        for (const auto& [name, list] : pieces) inputs.emplace(name, list.front());
        return context.run(inputs);
      };
    } else {
      Engine engine = target.cast<Engine>();
      runner.run = [engine](const std::map<std::string, std::vector<Tensor>>& pieces, int64_t zero_rows) {
        return engine.run(serve::joined(pieces, zero_rows));
      };
    }
    m.runners.push_back(std::move(runner));
  }
  const Engine engine = d["engine"].cast<Engine>();
  m.inputs = engine.inputs();
  m.outputs = engine.outputs();
  m.batching.max_batch = d["max_batch"].cast<int64_t>();
  m.batching.max_queue_delay = std::chrono::microseconds(d["max_queue_delay_us"].cast<int64_t>());
  m.batching.batch_sizes = d["batch_sizes"].cast<std::vector<int64_t>>();
  m.batching.max_queue = d.contains("max_queue") ? d["max_queue"].cast<int64_t>() : 0;
  return m;
}

}  // namespace

void bind_serve(py::module_& m) {
  // (a request GrpcFront.run's batcher did not take: --max-queue requests waiting, or shutting down)
  py::register_exception<serve::Unavailable>(m, "Unavailable", PyExc_RuntimeError);
  py::class_<serve::GrpcFront>(m, "GrpcFront",
                               "kiln serve's native gRPC front: the Open Inference Protocol's gRPC service in C++")
      .def(py::init([](const std::string& address, const py::list& models, uint64_t max_request_bytes, int pin_gpu,
                       const std::string& server_version, uint64_t pinned_input_bytes) {
             std::vector<serve::ServedModel> served;
             for (const py::handle& d : models) served.push_back(served_model(d.cast<py::dict>()));
             serve::FrontOptions options;
             options.address = address;
             options.max_request_bytes = max_request_bytes;
             options.pin_gpu = pin_gpu;
             options.server_version = server_version;
             options.pinned_input_bytes = pinned_input_bytes;
             py::gil_scoped_release release;
             return std::make_unique<serve::GrpcFront>(std::move(served), options);
           }),
           py::arg("address"), py::arg("models"), py::arg("max_request_bytes"), py::arg("pin_gpu") = -1,
           py::arg("server_version") = "", py::arg("pinned_input_bytes") = serve::FrontOptions{}.pinned_input_bytes)
      .def_property_readonly("port", &serve::GrpcFront::port)
      .def("shutdown", &serve::GrpcFront::shutdown, py::arg("grace_seconds") = 30.0,
           py::call_guard<py::gil_scoped_release>())
      .def("stats",
           [](const serve::GrpcFront& front) {
             // (a histogram: {"buckets": [(upper bound, observations at most that)], "count", "sum"})
             auto histogram = [](const serve::Histogram& h) {
               py::list buckets;
               for (size_t i = 0; i < h.bounds.size(); ++i) buckets.append(py::make_tuple(h.bounds[i], h.at_most[i]));
               py::dict d;
               d["buckets"] = buckets, d["count"] = h.count, d["sum"] = h.sum;
               return d;
             };
             py::dict out;
             for (const auto& [name, s] : front.stats()) {
               py::dict d;
               d["requests"] = s.requests, d["errors"] = s.errors, d["runs"] = s.batching.runs;
               d["rows"] = s.batching.rows, d["batched_requests"] = s.batching.requests;
               d["failed_runs"] = s.batching.failed_runs;
               d["batch_rows"] = histogram(s.batching.batch_rows);
               d["queue_seconds"] = histogram(s.batching.queue_seconds);
               d["compute_seconds"] = histogram(s.batching.compute_seconds);
               py::dict devices;
               for (const auto& [device, runs] : s.batching.runs_by_device) devices[py::str(device)] = runs;
               d["runs_by_device"] = devices;
               out[py::str(name)] = d;
             }
             return out;
           })
      .def("count", &serve::GrpcFront::count, py::arg("model"), py::arg("requests"), py::arg("errors"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "run",
          [](serve::GrpcFront& front, const std::string& model, const py::dict& inputs, int64_t rows) {
            // (copies: the batcher's threads then never wait for the GIL to let go of an array)
            std::map<std::string, Tensor> in = tensors_of(inputs);
            std::map<std::string, Tensor> out;
            {
              py::gil_scoped_release release;
              out = front.run(model, std::move(in), rows);
            }
            return tensors_to_dict(out);
          },
          py::arg("model"), py::arg("inputs"), py::arg("rows"),
          "One request (checked already) through the model's batcher, as the gRPC requests go; waits")
      // The front's shared-memory regions, for the HTTP front (kiln/shared_memory.py, NativeRegions).
      // An unknown region is KeyError, any other refusal kiln.Error.
      .def("register_region",
           [](serve::GrpcFront& front, const std::string& name, const std::string& key, uint64_t offset,
              uint64_t byte_size) { front.shared_memory().register_region(name, key, offset, byte_size); },
           py::arg("name"), py::arg("key"), py::arg("offset"), py::arg("byte_size"),
           py::call_guard<py::gil_scoped_release>())
      .def("unregister_region", [](serve::GrpcFront& front, const std::string& name) {
             front.shared_memory().unregister(name);
           }, py::arg("name"))
      .def("region_status",
           [](serve::GrpcFront& front, const std::string& name) {
             std::vector<serve::RegionStatus> found;
             try {
               found = front.shared_memory().status(name);
             } catch (const serve::RegionNotFound& e) {
               throw py::key_error(e.what());
             }
             py::list out;
             for (const serve::RegionStatus& r : found) {
               py::dict d;
               d["name"] = r.name, d["key"] = r.key, d["offset"] = r.offset, d["byte_size"] = r.byte_size;
               out.append(d);
             }
             return out;
           },
           py::arg("name"))
      .def("region_bytes",
           [](serve::GrpcFront& front, const std::string& region, uint64_t offset, uint64_t byte_size,
              const std::string& what) {
             serve::RegionSpan span;
             try {
               span = front.shared_memory().span(region, offset, byte_size, what);
             } catch (const serve::RegionNotFound& e) {
               throw py::key_error(e.what());
             }
             // The array keeps the region's mapping alive (a request in flight outlives an unregister).
             auto* keep = new serve::RegionSpan(span);
             py::capsule owner(keep, [](void* p) { delete static_cast<serve::RegionSpan*>(p); });
             return py::array(py::dtype("uint8"), {static_cast<py::ssize_t>(span.bytes)}, {}, span.data, owner);
           },
           py::arg("region"), py::arg("offset"), py::arg("byte_size"), py::arg("what"),
           "byte_size bytes from offset in a registered region, as a writable uint8 array over them");
}

}  // namespace kiln::python
