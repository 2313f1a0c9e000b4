// Calibration caches: the INT8 scale of each activation tensor, saved so that the next build
// skips calibration.
//
// kiln's own format is readable text, tied to the model it was calibrated on:
//   kiln-calibration 1
//   model: 8c4e0d7f2a91b3c5          (FNV-1a 64 of the ONNX file's bytes, hex)
//   algorithm: entropy
//   batches: 16
//   <tensor name>: <scale>           (decimal, %.9g: float32 exactly; threshold = 127 * scale)
// Reading it for another model is refused with a message (a stale cache).
//
// TensorRT's format ("TRT-<version>-<calibrator>" then "<tensor name>: <scale as the hex of
// its float32 bits>" per line) is read and written too, so caches move between the two;
// it carries no model fingerprint.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace kiln::calibration {

struct CalibrationCache {
  std::string model_fingerprint;  // kiln format only; empty for TensorRT caches
  std::string algorithm;          // "entropy", ... (TensorRT: the calibrator name, e.g. "EntropyCalibration2")
  int batches = 0;                // kiln format only
  std::map<std::string, float> scales;
};

// The fingerprint of a model's bytes (FNV-1a 64, 16 hex digits).
std::string model_fingerprint(const std::string& onnx_bytes);

std::string to_kiln_text(const CalibrationCache& cache);
std::string to_tensorrt_text(const CalibrationCache& cache);
// Either format, recognised by its first line. Throws kInvalidModel naming `name` and the
// line on anything malformed (a missing ':', a scale that is not a finite positive number).
CalibrationCache parse_calibration_cache(const std::string& text, const std::string& name);

// Reads a cache file and checks it belongs to the model (kiln format; TensorRT caches are
// accepted as they are). Throws kIo (unreadable) or kInvalidArgument (stale: another model).
CalibrationCache read_calibration_cache(const std::string& path, const std::string& fingerprint);
// Writes kiln's format, or TensorRT's when the path ends in ".trt" or tensorrt is true.
void write_calibration_cache(const std::string& path, const CalibrationCache& cache, bool tensorrt = false);

}  // namespace kiln::calibration
