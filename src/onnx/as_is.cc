// Importers of the ops taken as they are: each op and the opset from which its ONNX meaning is
// the one kiln implements (an older node is refused naming the op; models of opset 7 on import).
// Ops whose older forms need converting to the newest have importers of their own files
// (batchnorm.cc, cast.cc, constant.cc, normalization.cc, pad.cc, reduce.cc, split.cc,
// squeeze.cc, grid_sample.cc, roi_align.cc).
#include "ir/unary_ops.h"
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
    {"BitwiseAnd", 18}, {"BitwiseOr", 18}, {"BitwiseXor", 18}, {"BitwiseNot", 18}, {"SwiGLU", 28},
    // (The elementwise unary ops come from their table, src/ir/unary_ops.h.)
    // Cast (the `to` attribute has been an int since opset 6).
    {"Cast", 7}, {"CastLike", 15}, {"BitCast", 26},
    // Conv has meant the same since opset 1 (ConvTranspose's output shape rules settled in 11);
    // Gemm's C, required before opset 11, and MatMul are unchanged but for types.
    {"Conv", 7}, {"ConvTranspose", kMinOpset}, {"Gemm", 7}, {"MatMul", 7},
    // Pooling: later opsets only add attributes whose defaults keep the older meaning
    // (MaxPool's indices output in 8, ceil_mode in 10; AveragePool's count_include_pad in 7,
    // dilations in 19; LpPool's ceil_mode and dilations in 18).
    {"MaxPool", 8}, {"AveragePool", 7}, {"LpPool", 7}, {"GlobalAveragePool", 7},
    {"GlobalMaxPool", 7}, {"GlobalLpPool", 7}, {"MaxUnpool", 11},
    // Normalizations whose attributes have meant the same since they arrived.
    {"LayerNormalization", 17}, {"RMSNormalization", 23}, {"InstanceNormalization", 7},
    {"LpNormalization", 7}, {"LRN", 7}, {"MeanVarianceNormalization", 9},
    // GroupNormalization: opset 21 made scale and bias per channel (18's were per group).
    {"GroupNormalization", 21},
    // Shrink, and Col2Im (the inverse of im2col).
    {"Shrink", 9}, {"Col2Im", 18},
    // AffineGrid makes the sampling grid GridSample reads.
    {"AffineGrid", 20},
    // QuantizeLinear and DequantizeLinear: opset 10's forms are per tensor; 13 added `axis`, 21
    // `block_size` and `output_dtype`, with defaults that keep the older meaning.
    {"QuantizeLinear", 10}, {"DequantizeLinear", 10},
    // The integer products and dynamic quantization of ONNX Runtime's quantized models.
    {"MatMulInteger", 10}, {"QLinearMatMul", 10}, {"DynamicQuantizeLinear", 11}, {"ConvInteger", 10},
    {"QLinearConv", 10},
    // Data movement: later opsets added negative axes, DepthToSpace's mode (11) and Reshape's
    // allowzero (14), with defaults that keep the older meaning. Resize's opset 11 form is the
    // IR's (Upsample, removed in opset 10, has no importer); Pad, Slice and Clip, whose
    // parameters were attributes, have importers that convert (pad.cc).
    {"Concat", 7}, {"Expand", 8}, {"Tile", 7}, {"Gather", 7},
    {"GatherElements", kMinOpset}, {"GatherND", kMinOpset}, {"ScatterElements", kMinOpset},
    {"ScatterND", kMinOpset}, {"Compress", kMinOpset},
    {"ReverseSequence", 10}, {"CenterCropPad", 18}, {"Unique", kMinOpset},
    {"Transpose", 7}, {"DepthToSpace", 7}, {"SpaceToDepth", 7}, {"Reshape", 7},
    {"Flatten", 7}, {"Shape", 7}, {"Size", 7},
    // Generators and small ops (TopK's K has been an input since opset 10; ArgMax's
    // select_last_index, 12, defaults to the older meaning).
    {"ConstantOfShape", 9}, {"EyeLike", 9}, {"Range", kMinOpset}, {"TopK", 10},
    {"Trilu", 14}, {"CumSum", kMinOpset}, {"CumProd", 26}, {"OneHot", 9}, {"NonZero", 9},
    {"ArgMax", 7}, {"ArgMin", 7},
    // Attention (ops/attention_params.h has the semantics), rotary position embeddings and the
    // key/value cache update TensorScatter.
    {"Attention", 23}, {"RotaryEmbedding", 23}, {"TensorScatter", 24},
    // Detection: NonMaxSuppression's opset 11 only clarified opset 10's text; DeformConv's 22
    // added types only.
    {"NonMaxSuppression", 10}, {"DeformConv", 19},
    // Recurrent layers: opset 14 added `layout` (default: the older meaning), 22 types.
    {"RNN", 7}, {"GRU", 7}, {"LSTM", 7},
    // Linear algebra.
    {"Det", 11},
    // State-space and linear-attention decoders: the causal depthwise convolution that carries
    // its state between steps, and attention whose memory is a state matrix per head.
    {"CausalConvWithState", 27}, {"LinearAttention", 27},
    // Text features: n-gram counts of integer sequences (TfIdfVectorizer has had one form).
    {"TfIdfVectorizer", 9},
    // Window functions (signal processing).
    {"HannWindow", 17}, {"HammingWindow", 17}, {"BlackmanWindow", 17}, {"STFT", 17},
    // Einsum: later opsets added types only.
    {"Einsum", 12},
    // Losses: opsets 13 and 22 added types only.
    {"NegativeLogLikelihoodLoss", 12}, {"SoftmaxCrossEntropyLoss", 12},
};

}  // namespace

KILN_REGISTER_IMPORTERS(as_is) {
  for (const AsIs& a : kAsIs) registry.add({a.op, a.since_opset, nullptr});
  for (const ir::UnaryOpInfo& u : ir::kUnaryOps) registry.add({u.name, u.since_opset, nullptr});
}

}  // namespace kiln::onnx_import
