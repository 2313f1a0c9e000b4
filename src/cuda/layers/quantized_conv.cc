// The CUDA layer of kiln::QConv (src/ops/quantized_conv.cc): an INT8 convolution on cuDNN's
// graph API, int8 NHWC in, int32 products on the tensor cores, and the requantizing epilogue
// fused as pointwise ops (cuda/kernels/conv_graph.h):
//   Y = act((acc * scale + bias + Z) * z_mult) * out_mult
// The op's constants fold into the per-channel vectors so that the epilogue is as short as
// the case allows:
//   - an int8 residual is added in its own units: scale = x_scale * w_scales / z_scale,
//     bias = B / z_scale, then z_mult = z_scale brings the sum back to real units;
//   - for an activation that commutes with a positive factor (none, Relu, LeakyRelu) the
//     output's 1 / y_scale moves in front of it (into z_mult, or scale and bias), so there is
//     no out_mult; otherwise out_mult = 1 / y_scale after the activation.
// cuDNN converts the last float value to int8 with rounding to nearest even and saturation.
// Measured on an H100 (bench/results/probes/probe_b128.txt): these engines run ResNet-50's
// 3x3 and 1x1 convolutions at 1.7-2.1x the speed of the float16 graph engines, except the
// 64-channel layers at 56x56. kiln's own INT8 kernel (cuda/kernels/int8_conv.h), which computes the
// epilogue as the CPU reference does, is timed against them as more tactics.
// 1x1 convolutions of stride 1 (matrix products) also time CUTLASS's INT8/FP8 GEMMs with the
// whole epilogue fused (cuda/kernels/quantized_gemm.h) and, in FP8, cuBLASLt's FP8 GEMMs
// (cuda/kernels/fp8_gemm.h). TacticOptions::quantized_conv = kernel, cudnn, cublaslt or cutlass
// limits the choice to one of them, kernel:NAME to kiln's kernel tactic NAME where the layer has
// it, cutlass:NAME to CUTLASS's kernel NAME (for tests and diagnosis).
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <vector>

#include "cuda/kernels/conv_graph.h"
#include "cuda/kernels/fp8_gemm.h"
#include "cuda/kernels/int8_conv.h"
#include "cuda/kernels/int8_depthwise.h"
#include "cuda/kernels/int8_stem.h"
#include "cuda/kernels/quantized_gemm.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/engine.h"
#include "ir/activation.h"
#include "ops/conv_geometry.h"

namespace kiln::cuda {

namespace {

// The activation the libraries' epilogues (cuDNN's graph, cuBLASLt's FP8 products) are asked for:
// erf GELU in its tanh form, as CUTLASS's kernels (quantized_gemm_cutlass.cuh) and the float16
// products (matmul.cu) run it. With erf GELU, cuDNN's INT8 engine took 0.28 ms for ViT-B/16's
// first feed-forward product at batch 128, 2.4 times its time per operation on the product before
// it, which has no activation (docs/design/int8.md, "GELU in cuDNN's INT8 epilogue"). The tanh
// form is at most 4.7e-4 from erf's: under a float16 rounding where that difference peaks (GELU
// near 2), and under an int8 or E4M3 step at the scales GELU's outputs calibrate to.
ir::Activation library_activation(ir::Activation act) {
  if (act.kind == ir::ActivationKind::kGelu) act.kind = ir::ActivationKind::kGeluTanh;
  return act;
}

struct QConvParams {
  std::vector<int64_t> x, w, y;
  std::vector<int64_t> pads, strides, dilations;
  ir::Activation act;
  bool has_z = false, z_int8 = false, y_int8 = false;
  DType y_storage = DType::kInt8, z_storage = DType::kInt8;
  Int8ConvGeometry geometry;  // for kiln's kernel
  bool depthwise = false;     // group = channels: kiln's depthwise kernel (cuDNN has no INT8 grouped engines)
  bool stem = false;          // 1 to 4 input channels: kiln's stem kernel, int8 NCHW input (int8_stem.h)
  int group_width = 0;        // > 0: other grouped convolutions, kiln's grouped kernel (int8_depthwise.h)
  DType quantized = DType::kInt8;  // X's (and an 8-bit Y's and Z's) type: int8 or float8e4m3fn
};

bool homogeneous(const ir::Activation& act) { return act.none() || act.kind == ir::ActivationKind::kRelu || act.kind == ir::ActivationKind::kLeakyRelu; }

// "" when this node can run here, else why not.
std::string plan(const LayerRequest& r, QConvParams& p) {
  if (r.inputs.empty() || !r.has_input(0) || r.input_shape(0).size() != 4) return "only 2-D INT8 convolutions run on the GPU";
  if (!r.is_constant(1)) return "the weights must be a constant";
  if (r.has_input(2) && !r.is_constant(2)) return "the bias must be a constant";
  const ir::Node& n = r.node;
  const int64_t group = n.attrs.get_int("group", 1);
  p.quantized = r.input_dtypes[0];
  if (p.quantized == DType::kFloat8E4M3FN) {
    // FP8 runs on cuDNN's FP8 graph engines only: group 1, channels in multiples of 16.
    if (group != 1) return "grouped FP8 convolutions are not supported on the GPU";
    if (r.input_shape(0)[1] % 16 != 0 || r.output_shapes[0][1] % 16 != 0) return "FP8 convolutions need multiples of 16 channels";
  } else if (p.quantized != DType::kInt8) {
    return "the input of a quantized convolution must be int8 or float8e4m3fn";
  }
  if (group != 1) {
    const std::vector<int64_t>& ws = r.constants[1]->shape();
    if (ws.size() != 4 || ws[0] % group != 0) return "a grouped convolution's weights must be [M, C / group, kh, kw]";
    p.depthwise = ws[1] == 1 && ws[0] == group && r.input_shape(0)[1] == group;
    if (!p.depthwise) p.group_width = static_cast<int>(ws[1]);
  }
  p.act = ir::Activation::from_node(n);
  // cuDNN's pointwise ops lack some activations (HardSwish, HardSigmoid): INT8 layers then run
  // on kiln's kernels or CUTLASS (choose_engine leaves cuDNN out); FP8 has only cuDNN's engines.
  if (p.quantized == DType::kFloat8E4M3FN && !conv_graph_supports(p.act))
    return std::string("activation ") + p.act.name() + " has no FP8 epilogue on the GPU";
  p.x = r.input_shape(0);
  p.w = r.constants[1]->shape();
  p.y = r.output_shapes[0];
  p.stem = group == 1 && p.x[1] < 16;
  if ((!p.stem && p.x[1] % 16 != 0) || p.y[1] % 16 != 0)
    return "INT8 convolutions need multiples of 16 channels (or 1 to 4 input channels)";
  std::vector<int64_t> wk(p.w.begin() + 2, p.w.end()), in(p.x.begin() + 2, p.x.end());
  ir::ConvGeometry g = ir::conv_geometry(n, 2, wk, in, false);
  for (int i = 0; i < 2; ++i) {
    if (g.pad_begin[static_cast<size_t>(i)] != g.pad_end[static_cast<size_t>(i)])
      return "asymmetric padding is not supported for INT8 convolutions";
    p.pads.push_back(g.pad_begin[static_cast<size_t>(i)]);
    p.strides.push_back(g.strides[static_cast<size_t>(i)]);
    p.dilations.push_back(g.dilations[static_cast<size_t>(i)]);
  }
  Int8ConvGeometry& geo = p.geometry;
  geo.batch = p.x[0], geo.c = static_cast<int>(p.x[1]), geo.h = static_cast<int>(p.x[2]), geo.w = static_cast<int>(p.x[3]);
  geo.k = static_cast<int>(p.y[1]), geo.oh = static_cast<int>(p.y[2]), geo.ow = static_cast<int>(p.y[3]);
  geo.r = static_cast<int>(p.w[2]), geo.s = static_cast<int>(p.w[3]);
  geo.pad_h = static_cast<int>(p.pads[0]), geo.pad_w = static_cast<int>(p.pads[1]);
  geo.stride_h = static_cast<int>(p.strides[0]), geo.stride_w = static_cast<int>(p.strides[1]);
  geo.dil_h = static_cast<int>(p.dilations[0]), geo.dil_w = static_cast<int>(p.dilations[1]);
  p.has_z = r.has_input(3);
  p.z_int8 = p.has_z && n.attrs.get_float("z_scale", 0.f) > 0.f;
  p.y_int8 = n.attrs.get_float("y_scale", 0.f) > 0.f;
  p.y_storage = p.y_int8 ? p.quantized : r.float_storage();
  p.z_storage = p.z_int8 ? p.quantized : r.float_storage();
  const DType z_storage = p.has_z ? p.z_storage : DType::kUndefined;
  if (std::string why; p.depthwise && !int8_depthwise_supported(geo, p.y_storage, z_storage, &why))
    return "depthwise INT8 convolution: " + why;
  if (std::string why; p.group_width && !int8_grouped_supported(geo, p.group_width, p.y_storage, z_storage, &why))
    return "grouped INT8 convolution: " + why;
  if (std::string why; p.stem && !int8_stem_supported(geo, p.y_storage, z_storage, &why))
    return "INT8 convolution of " + std::to_string(geo.c) + " input channels: " + why;
  if (std::string why; !conv_graph_supports(p.act) && !p.depthwise && !p.stem && !p.group_width &&
                       int8_conv_tactics(geo, p.y_storage, z_storage, p.act, 0, &why).empty())
    return std::string("activation ") + p.act.name() + ": cuDNN's pointwise ops lack it, and kiln's INT8 kernels do not " +
           "run this convolution: " + why;
  return "";
}

cudnnDataType_t cudnn_type(DType d) {
  return d == DType::kInt8             ? CUDNN_DATA_INT8
         : d == DType::kFloat8E4M3FN ? CUDNN_DATA_FP8_E4M3
         : d == DType::kFloat16      ? CUDNN_DATA_HALF
                                     : CUDNN_DATA_FLOAT;
}

class QConvLayer final : public Layer {
 public:
  QConvLayer(const LayerRequest& r, const QConvParams& p, BuildServices& services) : p_(p) {
    const ir::Node& n = r.node;
    const int64_t K = p.w[0], C = p.w[1], R = p.w[2], S = p.w[3];
    const int8_t* w = static_cast<const int8_t*>(r.constants[1]->raw());  // int8 or E4M3 bytes
    if (p.depthwise) {
      // Depthwise weights [K, 1, R, S] -> tap-major [R * S][K].
      const std::vector<int8_t> taps = depthwise_weights(w, static_cast<int>(K), static_cast<int>(R), static_cast<int>(S));
      weights_ = services.upload(taps.data(), taps.size());
    } else if (p.group_width) {
      const std::vector<int8_t> grouped = grouped_weights(w, static_cast<int>(K), p.group_width, static_cast<int>(R), static_cast<int>(S));
      weights_ = services.upload(grouped.data(), grouped.size());
    } else if (p.stem) {
      const std::vector<int8_t> padded = stem_weights(w, static_cast<int>(K), static_cast<int>(C), static_cast<int>(R), static_cast<int>(S));
      weights_ = services.upload(padded.data(), padded.size());
    } else {
      // Weights: int8 [K, C, R, S] -> KRSC.
      std::vector<int8_t> krsc(static_cast<size_t>(K * C * R * S));
      for (int64_t k = 0; k < K; ++k)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t i = 0; i < R * S; ++i) krsc[static_cast<size_t>((k * R * S + i) * C + c)] = w[(k * C + c) * R * S + i];
      weights_ = services.upload(krsc.data(), krsc.size());
    }

    // The epilogue's per-channel vectors (see the file comment).
    const float x_scale = n.attrs.get_float("x_scale", 0.f);
    const float z_scale = n.attrs.get_float("z_scale", 0.f);
    const float y_scale = n.attrs.get_float("y_scale", 0.f);
    const std::vector<float> w_scales = n.attrs.get_floats("w_scales");
    if (static_cast<int64_t>(w_scales.size()) != K)
      throw n.error(ErrorKind::kInvalidModel, "w_scales has " + std::to_string(w_scales.size()) + " entries for " +
                                                  std::to_string(K) + " output channels");
    const float* bias = r.has_input(2) ? r.constants[2]->data<float>() : nullptr;
    const bool fold_output = p.y_int8 && homogeneous(p.act);
    std::vector<float> scale(static_cast<size_t>(K)), b(static_cast<size_t>(K)), z_mult, out_mult;
    for (int64_t k = 0; k < K; ++k) {
      float s = x_scale * w_scales[static_cast<size_t>(k)], bk = bias ? bias[k] : 0.f;
      if (p.z_int8) s /= z_scale, bk /= z_scale;
      else if (fold_output && !p.has_z) s /= y_scale, bk /= y_scale;
      scale[static_cast<size_t>(k)] = s;
      b[static_cast<size_t>(k)] = bk;
    }
    if (p.z_int8) z_mult.assign(static_cast<size_t>(K), fold_output ? z_scale / y_scale : z_scale);
    else if (fold_output && p.has_z) z_mult.assign(static_cast<size_t>(K), 1.f / y_scale);
    if (p.y_int8 && !fold_output) out_mult.assign(static_cast<size_t>(K), 1.f / y_scale);
    auto upload = [&](const std::vector<float>& v) {
      return v.empty() ? nullptr : services.upload(v.data(), v.size() * sizeof(float));
    };
    args_.w = weights_;
    args_.scale = upload(scale);
    args_.bias = upload(b);
    args_.z_mult = upload(z_mult);
    args_.out_mult = upload(out_mult);

    // kiln's kernel takes the op's constants as they are (the CPU reference's arithmetic).
    std::vector<float> mult(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) mult[static_cast<size_t>(k)] = x_scale * w_scales[static_cast<size_t>(k)];
    kernel_args_.w = static_cast<const int8_t*>(weights_);
    kernel_args_.mult = static_cast<const float*>(upload(mult));
    if (bias) kernel_args_.bias = static_cast<const float*>(services.upload(bias, static_cast<size_t>(K) * sizeof(float)));
    kernel_args_.z_scale = p.z_int8 ? z_scale : 1.f;
    kernel_args_.y_scale = p.y_int8 ? y_scale : 0.f;
    kernel_args_.programmatic_launch = services.tactics().programmatic_launch;
    if (p.depthwise || p.stem || p.group_width) {
      // One kernel, nothing to choose. Launched once now, outside any graph capture: the stem
      // kernel's first launch raises its limits.
      const LayerIO& io = services.scratch_io();
      launch_own_kernel(io.inputs[0], p.has_z ? io.inputs[3] : nullptr, io.outputs[0], services.stream());
      return;
    }

    spec_.x = p.x;
    spec_.w = p.w;
    spec_.y = p.y;
    spec_.pads = p.pads;
    spec_.strides = p.strides;
    spec_.dilations = p.dilations;
    spec_.nhwc = true;
    spec_.int8 = true;
    spec_.quant_type = cudnn_type(p.quantized);
    spec_.y_type = cudnn_type(p.y_storage);
    spec_.z_type = cudnn_type(p.z_storage);
    spec_.has_bias = true;
    spec_.has_z = p.has_z;
    spec_.has_z_mult = !z_mult.empty();
    spec_.has_out_mult = !out_mult.empty();
    spec_.act = library_activation(p.act);
    // A 1x1 convolution of stride 1 is a matrix product over the pixels (tokens); the GEMM
    // libraries take a float16 residual and write float16 or the input's 8-bit type.
    const bool pointwise = R == 1 && S == 1 && p.strides == std::vector<int64_t>{1, 1} && p.pads == std::vector<int64_t>{0, 0};
    const bool gemm_io = !p.z_int8 && (!p.has_z || p.z_storage == DType::kFloat16) && (p.y_storage == DType::kFloat16 || p.y_int8);
    if (pointwise && gemm_io) {
      cutlass_product_.m = p.y[0] * p.y[2] * p.y[3];
      cutlass_product_.n = K;
      cutlass_product_.k = C;
      cutlass_product_.input = p.quantized;
      cutlass_product_.output = p.y_int8 ? p.quantized : DType::kFloat16;
      cutlass_product_.alpha = mult;
      if (bias) cutlass_product_.bias.assign(bias, bias + K);
      cutlass_product_.has_z = p.has_z;
      cutlass_product_.act = p.act;
      cutlass_product_.out_scale = p.y_int8 ? 1.f / y_scale : 1.f;
      offer_cutlass_ = quantized_gemm_unsupported(cutlass_product_, services.device()).empty();
    }
    if (p.quantized == DType::kFloat8E4M3FN && pointwise && gemm_io) {
      product_.m = p.y[0] * p.y[2] * p.y[3];
      product_.n = K;
      product_.k = C;
      product_.x_scale = x_scale;
      product_.w_scales = w_scales;
      if (bias) product_.bias.assign(bias, bias + K);
      product_.has_z = p.has_z;
      product_.act = library_activation(p.act);
      product_.y_scale = p.y_int8 ? y_scale : 0.f;
      offer_product_ = fp8_gemm_unsupported(product_).empty();
    }
    choose_engine(services);
  }

  void enqueue(const LayerIO& io, cudaStream_t stream) const override {
    if (p_.depthwise || p_.stem || p_.group_width) {
      launch_own_kernel(io.inputs[0], p_.has_z ? io.inputs[3] : nullptr, io.outputs[0], stream);
      return;
    }
    if (kernel_) {
      launch_kernel(io.inputs[0], p_.has_z ? io.inputs[3] : nullptr, io.outputs[0], *kernel_, stream);
      return;
    }
    if (product_gemm_) {
      product_gemm_->run(io.cublaslt, io.inputs[0], p_.has_z ? io.inputs[3] : nullptr, io.outputs[0], io.workspace, stream);
      return;
    }
    if (cutlass_gemm_) {
      cutlass_gemm_->run(io.inputs[0], p_.has_z ? io.inputs[3] : nullptr, io.outputs[0], io.workspace, stream);
      return;
    }
    KILN_CUDNN_CHECK(cudnnSetStream(io.cudnn, stream));
    ConvGraphArgs a = args_;
    a.x = io.inputs[0];
    a.z = p_.has_z ? io.inputs[3] : nullptr;
    a.y = io.outputs[0];
    graph_->execute(io.cudnn, a, io.workspace);
  }
  size_t workspace_bytes() const override {
    return product_gemm_   ? product_gemm_->workspace_bytes()
           : cutlass_gemm_ ? cutlass_gemm_->workspace_bytes()
           : graph_        ? graph_->workspace_bytes()
                           : 0;
  }
  bool uses_cudnn() const override {
    return !(p_.depthwise || p_.stem || p_.group_width) && !kernel_ && !product_gemm_ && !cutlass_gemm_;
  }
  std::string tactic() const override {
    if (p_.depthwise) return "kernel:int8 depthwise";
    if (p_.stem) return "kernel:int8 stem";
    if (p_.group_width) return "kernel:int8 grouped";
    if (kernel_) return "kernel:int8 " + kernel_->str();
    if (product_gemm_) return product_gemm_->name();
    if (cutlass_gemm_) return cutlass_gemm_->name();
    return std::string(p_.quantized == DType::kInt8 ? "cudnn:int8 graph " : "cudnn:fp8 graph ") +
           (graph_ ? graph_->engine_name() : std::string("none"));
  }

 private:
  // The layers that one kernel of kiln's runs: depthwise, grouped, the stem.
  void launch_own_kernel(const void* x, const void* z, void* y, cudaStream_t stream) const {
    Int8ConvArgs a = kernel_args_;
    a.x = static_cast<const int8_t*>(x);
    a.z = z;
    a.y = y;
    if (p_.depthwise) launch_int8_depthwise(p_.geometry, p_.y_storage, z_type(), a, p_.act, stream);
    else if (p_.group_width) launch_int8_grouped(p_.geometry, p_.group_width, p_.y_storage, a, p_.act, stream);
    else launch_int8_stem(p_.geometry, p_.y_storage, a, p_.act, stream);
  }
  void launch_kernel(const void* x, const void* z, void* y, const Int8ConvTactic& tactic, cudaStream_t stream) const {
    Int8ConvArgs a = kernel_args_;
    a.x = static_cast<const int8_t*>(x);
    a.z = z;
    a.y = y;
    launch_int8_conv(p_.geometry, p_.y_storage, z_type(), a, p_.act, tactic, stream);
  }
  DType z_type() const { return p_.has_z ? p_.z_storage : DType::kUndefined; }

  std::string key() const {
    std::ostringstream k;
    auto dims = [&](const std::vector<int64_t>& d) {
      for (int64_t v : d) k << v << ',';
      k << ';';
    };
    k << (p_.quantized == DType::kInt8 ? "qconv:" : "qconv-fp8:");
    dims(p_.x), dims(p_.w), dims(p_.y), dims(p_.pads), dims(p_.strides), dims(p_.dilations);
    k << "act=" << p_.act.name() << ";z=" << (p_.has_z ? to_string(p_.z_storage) : "none") << ";y=" << to_string(p_.y_storage)
      << ";zm=" << spec_.has_z_mult << ";om=" << spec_.has_out_mult;
    if (library_activation(p_.act).kind != p_.act.kind) k << ";as-tanh";
    return k.str();
  }

  // Times kiln's kernels, the engines cuDNN's heuristics offer, CUTLASS's INT8/FP8 products and
  // cuBLASLt's FP8 products (or takes the timing cache's choice: "kernel:TACTIC", "graph:INDEX",
  // "cutlass:INDEX" or "cublaslt:INDEX").
  void choose_engine(BuildServices& services) {
    const std::string k = key();
    const TacticOptions& options = services.tactics();
    const std::string& only = options.quantized_conv;  // "": every family
    std::string kernel_why;
    std::vector<Int8ConvTactic> kernels =
        int8_conv_tactics(p_.geometry, p_.y_storage, z_type(), p_.act, options.int8_k_splits, &kernel_why);
    if (p_.quantized != DType::kInt8) kernels.clear(), kernel_why = "kiln's kernels are INT8";
    // Split K runs in thread-block clusters, which GPUs before Hopper do not have.
    if (!kernels.empty() && !hopper_features()) {
      std::erase_if(kernels, [](const Int8ConvTactic& t) { return t.k_splits > 1; });
      if (kernels.empty()) kernel_why = "split K needs thread-block clusters (Hopper)";
    }
    if (only == "cudnn") kernels.clear();
    // Experiments and tests narrow kiln's kernels to those `keep` accepts, where the layer has any.
    auto narrow = [&](auto keep) {
      std::vector<Int8ConvTactic> kept;
      for (const Int8ConvTactic& t : kernels)
        if (keep(t)) kept.push_back(t);
      if (!kept.empty()) kernels = kept;
    };
    // int8_k_splits: the implicit GEMM split K this many ways (int8_conv_tactics offers it only
    // then).
    if (options.int8_k_splits > 0)
      narrow([&](const Int8ConvTactic& t) { return t.kernel == Int8ConvKernel::kImplicitGemm && t.k_splits == options.int8_k_splits; });
    // kernel:NAME: kiln's kernel tactic NAME ("small-m:64/k4"); a layer without it gets kiln's
    // other kernels (as "kernel").
    const std::string only_kernel = only.rfind("kernel:", 0) == 0 ? only.substr(7) : "";
    if (!only_kernel.empty()) narrow([&](const Int8ConvTactic& t) { return t.str() == only_kernel; });
    const bool kernel_ok = !kernels.empty();
    const bool product_offered = offer_product_ && (only.empty() || only == "cublaslt");
    // cutlass:NAME: CUTLASS's kernel NAME only ("64x128x128 pingpong").
    const std::string only_cutlass = only.rfind("cutlass:", 0) == 0 ? only.substr(8) : "";
    const bool cutlass_only = only == "cutlass" || !only_cutlass.empty();
    const bool cutlass_offered = offer_cutlass_ && (only.empty() || cutlass_only);
    if (only == "cublaslt" || cutlass_only) kernels.clear();
    std::string last_error = "no candidate ran";
    if (product_offered) {
      try {
        product_gemm_ = std::make_unique<Fp8Gemm>(product_, weights_, services);
      } catch (const Error& e) {
        last_error = e.what();
      }
    }
    if (cutlass_offered) {
      try {
        cutlass_gemm_ = std::make_unique<QuantizedGemm>(cutlass_product_, weights_, services, only_cutlass);
      } catch (const Error& e) {
        last_error = e.what();
      }
    }
    if (only == "cublaslt" && !product_gemm_)
      throw Error(ErrorKind::kUnsupported, "the tactic options ask for cuBLASLt only, but cuBLASLt does not run " + k + ": " +
                                               (product_offered ? last_error : "not an FP8 matrix product it takes"));
    if (cutlass_only && !cutlass_gemm_)
      throw Error(ErrorKind::kUnsupported,
                  "the tactic options ask for CUTLASS only, but CUTLASS does not run " + k + ": " +
                      (cutlass_offered ? last_error
                       : cutlass_product_.m > 0
                           ? quantized_gemm_unsupported(cutlass_product_, services.device())
                           : std::string("not a matrix product with a float16 residual and a float16 or 8-bit output")));
    const bool cudnn_has_act = conv_graph_supports(p_.act);
    if (only == "cudnn" && !cudnn_has_act)
      throw Error(ErrorKind::kUnsupported, "the tactic options ask for cuDNN only, but cuDNN's pointwise ops lack " +
                                               std::string(p_.act.name()) + " (" + k + ")");
    const bool cudnn_ok = (only.empty() || only == "cudnn") && cudnn_has_act;
    if (!cudnn_ok && !kernel_ok && !product_gemm_ && !cutlass_gemm_)
      throw Error(ErrorKind::kUnsupported,
                  (only.empty() ? std::string("cuDNN's pointwise ops lack ") + p_.act.name() + ", and kiln's INT8 kernels"
                                : "the tactic options ask for " + only + ", but kiln's INT8 kernels") +
                      " do not run " + k + ": " + kernel_why);
    // cuDNN's candidates are made only when they may be used: making them creates the build's
    // cuDNN handle (device memory an engine of kiln's kernels alone never needs) and asks
    // cuDNN's heuristics.
    auto make_graph = [&] {
      if (!cudnn_ok || graph_) return;
      try {
        graph_ = std::make_unique<ConvGraph>(services.cudnn(), spec_);
      } catch (const Error& e) {
        if (!kernel_ok && !product_gemm_ && !cutlass_gemm_) throw;
        last_error = e.what();
      }
    };
    const std::optional<std::string> cached = services.cached_tactic(k);
    if (!cached || cached->rfind("graph:", 0) == 0) make_graph();
    if (cached) {
      Int8ConvTactic tactic;
      if (cached->rfind("kernel:", 0) == 0 && kernel_ok && Int8ConvTactic::parse(cached->substr(7), tactic)) {
        for (const Int8ConvTactic& t : kernels) {
          if (t.kernel != tactic.kernel || t.tile_n != tactic.tile_n || t.k_splits != tactic.k_splits) continue;
          // Launched once now, outside any graph capture (it raises the kernel's limits).
          const LayerIO& io = services.scratch_io();
          launch_kernel(io.inputs[0], p_.has_z ? io.inputs[3] : nullptr, io.outputs[0], tactic, services.stream());
          kernel_ = tactic;
          graph_.reset();
          product_gemm_.reset();
          cutlass_gemm_.reset();
          return;
        }
      }
      if (cached->rfind("graph:", 0) == 0 && graph_ && graph_->select(services.cudnn(), std::atoi(cached->c_str() + 6))) {
        graph_->drop_other_plans();
        product_gemm_.reset();
        cutlass_gemm_.reset();
        return;
      }
      if (const int index = cached->rfind("cublaslt:", 0) == 0 ? std::atoi(cached->c_str() + 9) : -1;
          product_gemm_ && index >= 0 && index < product_gemm_->candidate_count()) {
        product_gemm_->select(index);
        graph_.reset();
        cutlass_gemm_.reset();
        return;
      }
      if (const int index = cached->rfind("cutlass:", 0) == 0 ? std::atoi(cached->c_str() + 8) : -1;
          cutlass_gemm_ && index >= 0 && index < cutlass_gemm_->candidate_count()) {
        cutlass_gemm_->select(index);
        graph_.reset();
        product_gemm_.reset();
        return;
      }
    }
    make_graph();
    const bool log = options.log_candidates;
    auto log_time = [&](const std::string& what, float ms) {
      char t[32];
      std::snprintf(t, sizeof t, " %.4f ms", ms);
      services.log("  tactic " + k + ": " + what + t);
    };
    const LayerIO& io = services.scratch_io();
    float best = 1e30f;
    std::string best_tactic;
    for (const Int8ConvTactic& tactic : kernels) {
      try {
        const float ms = services.time_ms([&](cudaStream_t s) {
          launch_kernel(io.inputs[0], p_.has_z ? io.inputs[3] : nullptr, io.outputs[0], tactic, s);
        });
        if (log) log_time("kernel " + tactic.str(), ms);
        if (ms < best) best = ms, best_tactic = "kernel:" + tactic.str();
      } catch (const Error& e) {
        last_error = e.what();
        cudaGetLastError();
      }
    }
    int best_graph = -1;
    float best_graph_ms = 1e30f;
    if (graph_) {
      ConvGraphArgs a = args_;
      a.x = io.inputs[0];
      a.z = p_.has_z ? io.inputs[3] : nullptr;
      a.y = io.outputs[0];
      const int tried = std::min(graph_->candidate_count(), kCandidates);
      for (int i = 0; i < tried; ++i) {
        if (!graph_->select(services.cudnn(), i) || graph_->workspace_bytes() > (size_t{1} << 30)) continue;
        void* ws = graph_->workspace_bytes() ? services.scratch(graph_->workspace_bytes()) : nullptr;
        try {
          const float ms = services.time_ms([&](cudaStream_t s) {
            KILN_CUDNN_CHECK(cudnnSetStream(services.cudnn(), s));
            graph_->execute(services.cudnn(), a, ws);
          });
          if (log) log_time("graph #" + std::to_string(i) + " " + graph_->engine_name(), ms);
          if (ms < best_graph_ms) best_graph_ms = ms, best_graph = i;
        } catch (const Error& e) {
          last_error = e.what();
          cudaGetLastError();
        }
      }
      if (best_graph >= 0 && best_graph_ms < best) best = best_graph_ms, best_tactic = "graph:" + std::to_string(best_graph);
    }
    if (product_gemm_) {
      for (int i = 0; i < product_gemm_->candidate_count(); ++i) {
        product_gemm_->select(i);
        void* ws = services.scratch(product_gemm_->workspace_bytes());  // each algorithm's own
        try {
          const float ms = services.time_ms([&](cudaStream_t s) {
            product_gemm_->run(services.cublaslt(), io.inputs[0], p_.has_z ? io.inputs[3] : nullptr, io.outputs[0], ws, s);
          });
          if (log) log_time(product_gemm_->name(), ms);
          if (ms < best) best = ms, best_tactic = "cublaslt:" + std::to_string(i);
        } catch (const Error& e) {
          last_error = e.what();
          cudaGetLastError();
        }
      }
    }
    if (cutlass_gemm_) {
      for (int i = 0; i < cutlass_gemm_->candidate_count(); ++i) {
        cutlass_gemm_->select(i);
        void* ws = cutlass_gemm_->workspace_bytes() ? services.scratch(cutlass_gemm_->workspace_bytes()) : nullptr;
        try {
          const float ms = services.time_ms([&](cudaStream_t s) {
            cutlass_gemm_->run(io.inputs[0], p_.has_z ? io.inputs[3] : nullptr, io.outputs[0], ws, s);
          });
          if (log) log_time(cutlass_gemm_->name(), ms);
          if (ms < best) best = ms, best_tactic = "cutlass:" + std::to_string(i);
        } catch (const Error& e) {
          last_error = e.what();
          cudaGetLastError();
        }
      }
    }
    if (best_tactic.empty()) throw Error(ErrorKind::kUnsupported, "nothing ran this INT8 convolution (" + k + "): " + last_error);
    if (Int8ConvTactic tactic; best_tactic.rfind("kernel:", 0) == 0 && Int8ConvTactic::parse(best_tactic.substr(7), tactic)) {
      kernel_ = tactic;
      graph_.reset();
      product_gemm_.reset();
      cutlass_gemm_.reset();
    } else if (best_tactic.rfind("cublaslt:", 0) == 0) {
      product_gemm_->select(std::atoi(best_tactic.c_str() + 9));
      graph_.reset();
      cutlass_gemm_.reset();
    } else if (best_tactic.rfind("cutlass:", 0) == 0) {
      cutlass_gemm_->select(std::atoi(best_tactic.c_str() + 8));
      graph_.reset();
      product_gemm_.reset();
    } else {
      product_gemm_.reset();
      cutlass_gemm_.reset();
      if (!graph_->select(services.cudnn(), best_graph))
        throw Error(ErrorKind::kDevice, "cuDNN engine " + std::to_string(best_graph) + " failed to finalize again (" + k + ")");
      graph_->drop_other_plans();
    }
    services.record_tactic(k, best_tactic);
    if (log) log_time("chose " + tactic() + " at", best);
  }

  QConvParams p_;
  ConvGraphSpec spec_;
  ConvGraphArgs args_;
  const void* weights_ = nullptr;
  std::unique_ptr<ConvGraph> graph_;  // null when kiln's kernel runs the layer
  Int8ConvArgs kernel_args_;
  std::optional<Int8ConvTactic> kernel_;  // set when kiln's kernel runs the layer
  Fp8GemmSpec product_;                   // the layer as a matrix product (FP8 1x1 convolutions)
  bool offer_product_ = false;            // cuBLASLt's FP8 product is a candidate
  std::unique_ptr<Fp8Gemm> product_gemm_; // set when cuBLASLt runs the layer
  QuantizedGemmSpec cutlass_product_;     // the layer as a matrix product (1x1 convolutions)
  bool offer_cutlass_ = false;            // CUTLASS's product is a candidate
  std::unique_ptr<QuantizedGemm> cutlass_gemm_;  // set when CUTLASS runs the layer
  // Each candidate is a runtime-compiled engine (about 0.2 s to finalize): ResNet-50's INT8
  // build took 91 s timing 8 per layer, and the winner was always among cuDNN's first picks
  // (docs/design/int8.md, "Which INT8 path: cuDNN's engines measured first").
  static constexpr int kCandidates = 3;
};

}  // namespace

KILN_REGISTER_CUDA_LAYERS(quantized_conv) {
  LayerEntry e;
  e.op = "QConv";
  e.domain = "kiln";
  e.check = [](const LayerRequest& r) {
    QConvParams p;
    return plan(r, p);
  };
  e.formats = [](const LayerRequest& r) {
    QConvParams p;
    plan(r, p);
    LayerFormats f;
    f.inputs.resize(r.inputs.size());  // weights and bias: read at create time
    f.inputs[0] = Format{p.quantized, p.stem ? Layout::kLinear : Layout::kNHWC};  // the stem kernel reads NCHW
    if (p.has_z) f.inputs[3] = Format{p.z_storage, Layout::kNHWC};
    f.outputs = {Format{p.y_storage, Layout::kNHWC}};
    return f;
  };
  e.create = [](const LayerRequest& r, const LayerFormats&, BuildServices& s) -> std::unique_ptr<Layer> {
    QConvParams p;
    const std::string why = plan(r, p);
    if (!why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
    return std::make_unique<QConvLayer>(r, p, s);
  };
  e.dtypes = "int8 -> int8, float16 (NHWC; kiln's implicit GEMM or cuDNN's graph API; depthwise, grouped and 1-4 input channels: "
             "kiln's kernels); float8e4m3fn -> float8e4m3fn, float16 (cuDNN's FP8 graph engines; 1x1: also cuBLASLt's FP8 "
             "GEMMs)";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
