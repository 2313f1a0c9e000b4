// What the binding's files share: numpy arrays to kiln Tensors and back (module.cc defines them).
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <string>

#include "kiln/tensor.h"

namespace kiln::python {

// The arrays of a dict, by name, copied into Tensors. A wrong dtype or a non-array is
// kiln::Error naming the input.
std::map<std::string, Tensor> tensors_of(const pybind11::dict& arrays);
// Tensors as a dict of numpy arrays over their storage (no copy).
pybind11::dict tensors_to_dict(const std::map<std::string, Tensor>& tensors);

// kiln._kiln.GrpcFront (serve.cc), in builds with the native gRPC front.
void bind_serve(pybind11::module_& m);

}  // namespace kiln::python
