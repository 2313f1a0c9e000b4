// The ONNX backend node tests of the compute ops (Conv, ConvTranspose, Gemm, MatMul,
// BatchNormalization) through the importer and the CPU engine, against ONNX's expected outputs.
// (test_convtranspose_with_kernel is left out: it is opset 8, below what kiln reads.)
#include <gtest/gtest.h>

#include <filesystem>

#include "compute_test_util.h"
#include "onnx/importer.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
const char* const kNodeTests = "/usr/share/libonnx-testdata/data/node";

void run_case(const std::string& name) {
  SCOPED_TRACE(name);
  fs::path dir = fs::path(kNodeTests) / name;
  ASSERT_TRUE(fs::exists(dir / "model.onnx")) << "missing ONNX test data at " << dir;
  ir::Graph graph = onnx_import::import_file((dir / "model.onnx").string());
  std::vector<std::string> inputs = graph.inputs, outputs = graph.outputs;
  cpu::CpuEngine engine(std::move(graph));
  fs::path data = dir / "test_data_set_0";
  std::map<std::string, Tensor> feed;
  for (size_t i = 0; i < inputs.size(); ++i)
    feed[inputs[i]] = onnx_import::read_tensor_file((data / ("input_" + std::to_string(i) + ".pb")).string());
  std::map<std::string, Tensor> got = engine.run(feed);
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor want = onnx_import::read_tensor_file((data / ("output_" + std::to_string(i) + ".pb")).string());
    EXPECT_TRUE(testing::all_close(got.at(outputs[i]), want)) << "output " << outputs[i];
  }
}

TEST(ComputeOnnxCases, MatchExpectedOutputs) {
  for (const char* name :
       {"test_basic_conv_with_padding", "test_basic_conv_without_padding", "test_conv_with_autopad_same",
        "test_conv_with_strides_and_asymmetric_padding", "test_conv_with_strides_no_padding",
        "test_conv_with_strides_padding", "test_convtranspose", "test_convtranspose_1d", "test_convtranspose_3d",
        "test_convtranspose_autopad_same", "test_convtranspose_dilations", "test_convtranspose_kernel_shape",
        "test_convtranspose_output_shape", "test_convtranspose_pad", "test_convtranspose_pads",
        "test_gemm_all_attributes", "test_gemm_alpha", "test_gemm_beta",
        "test_gemm_default_matrix_bias", "test_gemm_default_no_bias", "test_gemm_default_scalar_bias",
        "test_gemm_default_single_elem_vector_bias", "test_gemm_default_vector_bias", "test_gemm_default_zero_bias",
        "test_gemm_transposeA", "test_gemm_transposeB", "test_matmul_2d", "test_matmul_3d", "test_matmul_4d",
        "test_batchnorm_epsilon", "test_batchnorm_example"})
    run_case(name);
}

TEST(ComputeOnnxCases, TrainingModeBatchNormIsRefusedWithReason) {
  for (const char* name : {"test_batchnorm_epsilon_training_mode", "test_batchnorm_example_training_mode"}) {
    SCOPED_TRACE(name);
    try {
      onnx_import::import_file((fs::path(kNodeTests) / name / "model.onnx").string());
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("training"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln
