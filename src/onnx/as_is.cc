// Importers of the ops taken as they are: each op and the opset from which its ONNX meaning is
// the one kiln implements (an older node is refused naming the op; kMinOpset is where kiln's
// reading of most ops starts). Ops whose older forms need converting to the newest have
// importers of their own files (batchnorm.cc, cast.cc, constant.cc, normalization.cc,
// reduce.cc, split.cc, squeeze.cc, grid_sample.cc).
#include "onnx/importer.h"

namespace kiln::onnx_import {

namespace {

struct AsIs {
  const char* op;
  int since_opset;
};

constexpr AsIs kAsIs[] = {
    // Broadcasting elementwise ops: numpy broadcasting since opset 7 (8 for the variadic Max,
    // Min, Sum and Mean); later opsets only added types.
    {"Add", 7}, {"Sub", 7}, {"Mul", 7}, {"Div", 7}, {"Pow", 7}, {"PRelu", 7}, {"Equal", 7}, {"Less", 7},
    {"Greater", 7}, {"And", 7}, {"Or", 7}, {"Xor", 7}, {"Max", 8}, {"Min", 8}, {"Sum", 8}, {"Mean", 8},
    {"Where", 9}, {"Mod", 10}, {"BitShift", 11}, {"LessOrEqual", 12}, {"GreaterOrEqual", 12},
    // Elementwise unary ops.
    {"Relu", kMinOpset}, {"Sigmoid", kMinOpset}, {"Tanh", kMinOpset}, {"Exp", kMinOpset}, {"Log", kMinOpset},
    {"Sqrt", kMinOpset}, {"Reciprocal", kMinOpset}, {"Erf", kMinOpset}, {"Abs", kMinOpset}, {"Neg", kMinOpset},
    {"Floor", kMinOpset}, {"Ceil", kMinOpset}, {"Round", kMinOpset}, {"Sin", kMinOpset}, {"Cos", kMinOpset},
    {"Elu", kMinOpset}, {"LeakyRelu", kMinOpset}, {"Selu", kMinOpset}, {"Softplus", kMinOpset},
    {"Softsign", kMinOpset}, {"HardSigmoid", kMinOpset}, {"Sign", kMinOpset}, {"Celu", kMinOpset},
    {"Mish", kMinOpset}, {"ThresholdedRelu", kMinOpset}, {"Identity", kMinOpset}, {"Not", kMinOpset},
    {"Tan", kMinOpset}, {"Asin", kMinOpset}, {"Acos", kMinOpset}, {"Atan", kMinOpset}, {"Sinh", kMinOpset},
    {"Cosh", kMinOpset}, {"Asinh", kMinOpset}, {"Acosh", kMinOpset}, {"Atanh", kMinOpset}, {"IsNaN", kMinOpset},
    {"IsInf", kMinOpset}, {"HardSwish", 14}, {"Gelu", 20},
    // Cast; Clip takes min and max as inputs since opset 11.
    {"Cast", kMinOpset}, {"CastLike", 15}, {"Clip", kMinOpset},
    // Conv and ConvTranspose: their opset 11 forms are the IR's; Gemm's C is optional since 11;
    // MatMul is unchanged since 9 apart from types.
    {"Conv", kMinOpset}, {"ConvTranspose", kMinOpset}, {"Gemm", kMinOpset}, {"MatMul", kMinOpset},
    // Pooling: opsets 11 to 28 only add attributes whose defaults keep the older meaning
    // (AveragePool dilations in 19, LpPool ceil_mode and dilations in 18).
    {"MaxPool", kMinOpset}, {"AveragePool", kMinOpset}, {"LpPool", kMinOpset}, {"GlobalAveragePool", kMinOpset},
    {"GlobalMaxPool", kMinOpset}, {"GlobalLpPool", kMinOpset},
    // Normalizations whose attributes have meant the same since they arrived.
    {"LayerNormalization", 17}, {"RMSNormalization", 23}, {"InstanceNormalization", kMinOpset},
    {"LpNormalization", kMinOpset},
    // QuantizeLinear and DequantizeLinear: opset 10's forms are per tensor; 13 added `axis`, 21
    // `block_size` and `output_dtype`, with defaults that keep the older meaning.
    {"QuantizeLinear", kMinOpset}, {"DequantizeLinear", kMinOpset},
    // Data movement. Pad, Slice and Resize take their parameters as inputs since opset 10/11, as
    // the IR does (Upsample, removed in opset 10, has no importer); Reshape's allowzero (14) and
    // the scatters' reduction (16) default to the older meaning; Shape's start and end (15) are
    // attributes.
    {"Concat", kMinOpset}, {"Expand", kMinOpset}, {"Tile", kMinOpset}, {"Gather", kMinOpset},
    {"GatherElements", kMinOpset}, {"GatherND", kMinOpset}, {"ScatterElements", kMinOpset},
    {"ScatterND", kMinOpset}, {"Pad", kMinOpset}, {"Slice", kMinOpset}, {"Resize", kMinOpset},
    {"Transpose", kMinOpset}, {"DepthToSpace", kMinOpset}, {"SpaceToDepth", kMinOpset}, {"Reshape", kMinOpset},
    {"Flatten", kMinOpset}, {"Shape", kMinOpset}, {"Size", kMinOpset},
    // Generators and small ops (TopK's K has been an input since opset 10).
    {"ConstantOfShape", kMinOpset}, {"EyeLike", kMinOpset}, {"Range", kMinOpset}, {"TopK", kMinOpset},
    {"Trilu", 14}, {"CumSum", kMinOpset}, {"OneHot", kMinOpset}, {"NonZero", kMinOpset},
    {"ArgMax", kMinOpset}, {"ArgMin", kMinOpset},
    // Attention (ops/attention_params.h has the semantics).
    {"Attention", 23},
};

}  // namespace

KILN_REGISTER_IMPORTERS(as_is) {
  for (const AsIs& a : kAsIs) registry.add({a.op, a.since_opset, nullptr});
}

}  // namespace kiln::onnx_import
