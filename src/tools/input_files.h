// Input data from files, for the commands that feed a model (kiln run, kiln bench): which file
// feeds which input, and a tensor file (.npy, .pb) read as the input's dtype.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/tensor.h"
#include "kiln/types.h"

namespace kiln::tools {

// Names for a message: "a, b, c".
std::string name_list(const std::vector<std::string>& names);

// Which file feeds which input, from `specs` as --input takes them: "NAME=FILE" names the input;
// a bare FILE takes the next input in `input_names` (the model's order) that no spec named.
// Throws naming the spec: an unknown name, an input given twice, more files than inputs.
std::map<std::string, std::string> assign_input_files(const std::vector<std::string>& specs,
                                                      const std::vector<std::string>& input_names);

// `t` as another numeric dtype (NumPy writes float64 by default, for one): floats take any
// value; integers and bools only values they hold exactly, else an error naming the input.
Tensor cast_input(const Tensor& t, DType dtype, const std::string& input_name);

// True for the files read_tensor_input reads (.npy, .pb), by extension.
bool is_tensor_file(const std::string& path);

// The tensor in `path` (.npy or an ONNX TensorProto .pb) as the file holds it.
Tensor read_tensor_input(const std::string& path);

// The tensor in `path` (.npy or an ONNX TensorProto .pb) as `desc`'s dtype, converted (with a
// note on standard output) where the file holds another: floats take any value; integers and
// bools only values they hold exactly, else an error naming the input, the value and its index.
Tensor read_tensor_input(const std::string& path, const TensorDesc& desc);

}  // namespace kiln::tools
