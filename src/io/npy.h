// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0).
//
// kiln reads and writes little-endian, C-order arrays of float16/32/64, int8/16/32/64,
// uint8/16/32/64 and bool: what np.save writes for those dtypes on every machine kiln runs
// on. Anything else (big-endian, Fortran order, object or string arrays, truncated files) is
// refused with a kiln::Error that names the file and says why.
#pragma once

#include <string>

#include "kiln/tensor.h"

namespace kiln::io {

// Parses the contents of a .npy file; `name` is used in error messages.
Tensor parse_npy(const std::string& bytes, const std::string& name);
Tensor read_npy(const std::string& path);

// The .npy bytes of a tensor (version 1.0 unless the header needs more room).
std::string to_npy(const Tensor& tensor);
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace kiln::io
