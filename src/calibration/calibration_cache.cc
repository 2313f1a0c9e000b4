// Calibration cache files (see calibration_cache.h).
#include "calibration/calibration_cache.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ir/hash.h"
#include "kiln/error.h"

namespace kiln::calibration {

namespace {

constexpr const char* kKilnHeader = "kiln-calibration 1";

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

Error malformed(const std::string& name, int line, const std::string& why) {
  return Error(ErrorKind::kInvalidModel,
               "calibration cache " + name + ", line " + std::to_string(line) + ": " + why);
}

float checked_scale(double v, const std::string& name, int line, const std::string& text) {
  if (!(v > 0) || !std::isfinite(v) || v > 3.4e38)
    throw malformed(name, line, "the scale '" + text + "' is not a finite positive number");
  return static_cast<float>(v);
}

}  // namespace

std::string model_fingerprint(const std::string& bytes) { return ir::hex64(ir::fnv1a(bytes.data(), bytes.size())); }

std::string to_kiln_text(const CalibrationCache& cache) {
  std::ostringstream s;
  s << kKilnHeader << "\n";
  s << "model: " << cache.model_fingerprint << "\n";
  s << "algorithm: " << cache.algorithm << "\n";
  s << "batches: " << cache.batches << "\n";
  char value[32];
  for (const auto& [tensor, scale] : cache.scales) {
    std::snprintf(value, sizeof value, "%.9g", static_cast<double>(scale));
    s << tensor << ": " << value << "\n";
  }
  return s.str();
}

std::string to_tensorrt_text(const CalibrationCache& cache) {
  std::ostringstream s;
  // TensorRT 8.6's header; TensorRT reads caches of its own version, kiln any.
  s << "TRT-8601-" << (cache.algorithm == "minmax" ? "MinMaxCalibration" : "EntropyCalibration2") << "\n";
  char value[16];
  for (const auto& [tensor, scale] : cache.scales) {
    uint32_t bits;
    std::memcpy(&bits, &scale, sizeof bits);
    std::snprintf(value, sizeof value, "%08x", bits);
    s << tensor << ": " << value << "\n";
  }
  return s.str();
}

CalibrationCache parse_calibration_cache(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line))
    throw Error(ErrorKind::kInvalidModel, "calibration cache " + name + " is empty");
  line = trim(line);
  CalibrationCache cache;
  bool kiln = line == kKilnHeader;
  if (!kiln) {
    // TRT-<digits>-<calibrator name>
    const size_t dash = line.find('-', 4);
    if (line.rfind("TRT-", 0) != 0 || dash == std::string::npos || dash == 4 || dash + 1 >= line.size() ||
        line.find_first_not_of("0123456789", 4) != dash)
      throw Error(ErrorKind::kInvalidModel, "calibration cache " + name +
                                                " is neither kiln's (first line '" + kKilnHeader +
                                                "') nor TensorRT's ('TRT-<version>-<calibrator>')");
    cache.algorithm = line.substr(dash + 1);
  }
  int number = 1;
  while (std::getline(in, line)) {
    ++number;
    line = trim(line);
    if (line.empty()) continue;
    const size_t colon = line.rfind(':');
    if (colon == std::string::npos || colon == 0) throw malformed(name, number, "expected '<tensor name>: <value>'");
    const std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (value.empty()) throw malformed(name, number, "no value after '" + key + ":'");
    if (kiln && key == "model") { cache.model_fingerprint = value; continue; }
    if (kiln && key == "algorithm") { cache.algorithm = value; continue; }
    if (kiln && key == "batches") {
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (*end != 0 || v < 0 || v > 1000000000) throw malformed(name, number, "batches must be a count, not '" + value + "'");
      cache.batches = static_cast<int>(v);
      continue;
    }
    char* end = nullptr;
    float scale;
    if (kiln) {
      const double v = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != 0) throw malformed(name, number, "the scale '" + value + "' is not a number");
      scale = checked_scale(v, name, number, value);
    } else {
      if (value.size() > 8 || value.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        throw malformed(name, number, "the scale '" + value + "' is not 8 hex digits (float32 bits)");
      const uint32_t bits = static_cast<uint32_t>(std::strtoul(value.c_str(), &end, 16));
      float v;
      std::memcpy(&v, &bits, sizeof v);
      scale = checked_scale(v, name, number, value);
    }
    if (!cache.scales.emplace(key, scale).second) throw malformed(name, number, "tensor '" + key + "' appears twice");
  }
  return cache;
}

CalibrationCache read_calibration_cache(const std::string& path, const std::string& fingerprint) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot read calibration cache " + path);
  std::stringstream buffer;
  buffer << f.rdbuf();
  CalibrationCache cache = parse_calibration_cache(buffer.str(), path);
  if (!cache.model_fingerprint.empty() && cache.model_fingerprint != fingerprint)
    throw Error(ErrorKind::kInvalidArgument, "calibration cache " + path + " was made for another model (fingerprint " +
                                                 cache.model_fingerprint + ", this model's is " + fingerprint +
                                                 "): delete it or pass another --calib-cache to calibrate again");
  return cache;
}

void write_calibration_cache(const std::string& path, const CalibrationCache& cache, bool tensorrt) {
  const bool trt = tensorrt || (path.size() > 4 && path.compare(path.size() - 4, 4, ".trt") == 0);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(ErrorKind::kIo, "cannot write calibration cache " + path);
  f << (trt ? to_tensorrt_text(cache) : to_kiln_text(cache));
  if (!f) throw Error(ErrorKind::kIo, "cannot write calibration cache " + path);
}

}  // namespace kiln::calibration
