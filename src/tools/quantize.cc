// kiln quantize model.onnx --calib DATA -o model.qdq.onnx: calibrates the model (or reads a
// calibration cache) and writes it as a QDQ ONNX model: int8 weights per output channel and
// Quantize/DequantizeLinear pairs on the activations of every Conv, Gemm and MatMul (see
// calibration/qdq_writer.h). ONNX Runtime, TensorRT and kiln read such models.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "calibration_flags.h"
#include "commands.h"
#include "kiln/kiln.h"
#include "calibration/calibrate_model.h"
#include "calibration/qdq_writer.h"

namespace kiln::tools {

namespace {

struct QuantizeOptions {
  std::string model, output, cache;
  CalibrationFlags calibration;
};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot read " + path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

int quantize(const QuantizeOptions& o) {
  const std::string bytes = read_bytes(o.model);
  calibration::CalibrationCache cache;
  std::ifstream existing(o.cache);
  if (!o.cache.empty() && existing.good()) {
    cache = calibration::read_calibration_cache(o.cache, calibration::model_fingerprint(bytes));
    std::printf("scales of %zu tensors from %s\n", cache.scales.size(), o.cache.c_str());
  } else {
    if (o.calibration.data.empty())
      throw Error(ErrorKind::kInvalidArgument, "kiln quantize needs --calib DATA, or --calib-cache FILE of an earlier run");
    cache = calibration::calibrate_model(o.model, o.calibration.options("kiln quantize", o.model)).cache;
    if (!o.cache.empty()) calibration::write_calibration_cache(o.cache, cache);
  }
  calibration::QdqReport report;
  const std::string qdq = calibration::write_qdq_model(bytes, o.model, cache, report);
  const std::string out = o.output.empty() ? o.model.substr(0, o.model.rfind(".onnx")) + ".qdq.onnx" : o.output;
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  if (!(f << qdq)) throw Error(ErrorKind::kIo, "cannot write " + out);
  std::printf("quantized %d layers: %d activations, %d weight tensors (%.1f MB float32 -> %.1f MB int8)", report.layers,
              report.activations, report.weights, report.float_weight_bytes / 1e6, report.int8_weight_bytes / 1e6);
  if (report.missing_scales) std::printf("; %d activation inputs left float (no scale)", report.missing_scales);
  std::printf(" -> %s\n", out.c_str());
  return 0;
}

}  // namespace

void add_quantize_command(CLI::App& app, std::function<int()>& action) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand("quantize", "Calibrate a model and write it as a QDQ (int8) ONNX model");
  cmd->add_option("model", o->model, "ONNX model file (one input; opset 13 or later)")->required();
  cmd->add_option("--output,-o", o->output, "QDQ model to write (default MODEL.qdq.onnx)");
  cmd->add_option("--calib-cache", o->cache, "Calibration cache: read if it exists (and matches the model), else written");
  o->calibration.add_to(cmd, /*data_required=*/false);
  cmd->callback([o, &action] { action = [o] { return quantize(*o); }; });
}

}  // namespace kiln::tools
