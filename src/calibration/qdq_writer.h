// Writing a calibrated model as a QDQ ONNX model (explicit quantization), the form ONNX
// Runtime's quantizer produces and TensorRT and kiln import: every Conv, Gemm and MatMul gets
//   - its activation inputs through QuantizeLinear -> DequantizeLinear, int8, symmetric (zero
//     point 0), with the calibrated per-tensor scale;
//   - its float32 weights stored as int8, symmetric per output channel (scale = max|w| / 127
//     of the channel), behind a DequantizeLinear with `axis`.
// Biases stay float32. Activations without a calibrated scale stay float and are counted.
#pragma once

#include <string>

#include "calibration/calibration_cache.h"

namespace kiln::calibration {

struct QdqReport {
  int layers = 0;                 // Conv/Gemm/MatMul nodes with quantized inputs
  int activations = 0;            // distinct activation tensors given a Q/DQ pair
  int weights = 0;                // weight tensors stored as int8
  int missing_scales = 0;         // activation inputs left in float: no scale in the cache
  int64_t float_weight_bytes = 0;  // size of the weights replaced, before ...
  int64_t int8_weight_bytes = 0;   // ... and after (int8 data + scales + zero points)
};

// onnx_bytes: a serialized ModelProto (default-domain opset >= 13, for per-axis
// DequantizeLinear); returns the QDQ model serialized. Throws kInvalidModel / kUnsupported
// naming `name`.
std::string write_qdq_model(const std::string& onnx_bytes, const std::string& name, const CalibrationCache& cache,
                            QdqReport& report);

}  // namespace kiln::calibration
