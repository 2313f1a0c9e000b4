// Decodes fuzzer bytes into a well-formed ONNX model, for the graph-level fuzzer
// (fuzz_graph.cc) and its bounded run in every build (tests/unit/fuzz_smoke_test.cc).
//
// What a model holds: opset 13 to 21 mostly (the newer ones kiln reads one time in four); 1-3
// graph inputs of random dtypes and shapes (small dims mostly; 0, symbolic, unknown and huge
// ones sometimes); 1-8 nodes whose op types come
// from kiln's op registry (those the ONNX importer reads, plus Constant); each node's inputs
// wired to earlier values of a plausible type, or to new initializers built for the op
// (shapes, axes, pads, repeats, indices, K, scales, weights ...); attributes drawn from the
// table below of the attributes kiln's importers, schemas and kernels read; and graph
// outputs. Any integer drawn may be replaced by an extreme one (0, -1, 2^31, 2^62,
// INT64_MAX, INT64_MIN ...), any float by NaN, infinity or a huge value.
//
// Each node is checked as it is drafted, with the importer's conversion, the op's schema and
// the CPU kernel's check (the steps import and the engine build take), so that most models
// get past import and run; a node that fails is dropped, or once in a while kept as the last
// node so that the refusals are exercised too. Those checks run under the same sanitizers:
// a crash while generating is a finding like any other.
//
// The generator reads its choices from a Source with FuzzedDataProvider's
// `template <class T> T ConsumeIntegralInRange(T min, T max)`; when the bytes run out, every
// choice is the first of its range, which is always the plain case.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "cpu/kernel.h"
#include "ir/op_schema.h"
#include "onnx.pb.h"
#include "onnx/importer.h"

namespace kiln::fuzz {

// What an input of an op takes.
enum class Role {
  kData,           // a value of `kind` (the op's main input when it is the anchor)
  kSame,           // the anchor's dtype, a shape that broadcasts to the anchor's
  kBoolLike,       // bool, broadcasting to the anchor
  kNumericLike,    // any numeric dtype, broadcasting to the anchor (Pow's exponent)
  kAnyValue,       // any value at all (CastLike's target)
  kConcatPeer,     // the anchor's dtype and shape but for the concat axis
  kScalarSame,     // a scalar of the anchor's dtype (Clip min/max, Pad's constant)
  kShapeVector,    // int64 dims of a new tensor (ConstantOfShape)
  kReshapeShape,   // int64 target of Reshape: the anchor's element count, -1 and 0 sometimes
  kExpandShape,    // int64 target that the anchor broadcasts to
  kRepeats,        // int64, one per anchor dim (Tile)
  kAxes,           // int64 distinct axes of the anchor (Reduce*)
  kSqueezeAxes,    // int64 axes of size-1 dims
  kUnsqueezeAxes,  // int64 axes of the output rank
  kPads,           // int64 begins and ends, per axis or per kPadAxes entry
  kPadAxes,        // Pad's axes (decided with kPads)
  kStarts,         // Slice starts (decides the count and axes)
  kEnds,
  kSliceAxes,
  kSteps,
  kIndices,        // Gather indices, in range of the axis attribute's dim
  kElementIndices, // GatherElements / ScatterElements indices: the anchor's rank
  kUpdates,        // ScatterElements updates: indices' shape, the anchor's dtype
  kNdIndices,      // GatherND indices
  kK,              // TopK's K: int64 [1]
  kSplitSizes,     // Split sizes, one per output
  kRoi,            // Resize roi
  kScales,         // Resize scales (or, when sizes are drawn, omitted)
  kSizes,          // Resize sizes
  kConvWeight,     // Conv [M, C/group, k...] / ConvTranspose [C, M/group, k...], float
  kConvBias,       // [M]
  kGemmB,          // Gemm B, matching A and transA/transB
  kGemmC,          // Gemm C, broadcasting to [M, N]
  kMatMulB,        // MatMul B
  kChannel,        // [C] of the anchor's dtype (BatchNormalization, InstanceNormalization)
  kNormParam,      // LayerNormalization scale/bias: the anchor's dims from axis on
  kQuantScale,     // float32 scalar or per-channel [C] along axis
  kQuantZeroPoint, // QuantizeLinear: int8/uint8/...; DequantizeLinear: the anchor's dtype
  kAxisScalar,     // CumSum's axis: int64 scalar
  kIntScalar,      // int64 scalar (Trilu's k)
  kDepth,          // OneHot depth
  kOneHotValues,   // OneHot [off, on]
  kRangeArg,       // Range start/limit/delta: scalars of one dtype
  kRatio,          // Dropout ratio: float scalar
  kTrainingMode,   // Dropout training_mode: bool scalar
  kSameShape,      // the anchor's dtype and shape (Attention's K and V)
  kGrid,           // GridSample's grid: [N, H..., r] of the anchor's float type, values near [-1, 1]
  kScatterIndices, // ScatterND indices: int64 [..., k], each tuple in range of the anchor's dims
  kScatterUpdates, // ScatterND updates: the indices' dims but the last, then the anchor's from k on
};

// Which dtypes a kData input accepts.
enum class Kind { kAny, kFloat, kNumeric, kBool, kIndex, kUnsigned, kQuantized };

// How an attribute's value is drawn (r: the anchor's rank, s: its spatial dims, r - 2).
enum class AttrKind {
  kAxis,        // -r-1 .. r
  kFlag,        // 0 or 1
  kSmallInt,    // -2 .. 3
  kFloat,       // small floats, sometimes NaN, infinity, huge
  kChoice,      // one of `choices` (or, rarely, a junk string)
  kDType,       // an ONNX dtype code (known, unknown or absurd)
  kSpatial,     // s positive ints (kernel_shape, strides, dilations)
  kSpatialPads, // 2s non-negative ints
  kSpatialZero, // s ints 0 or 1 (output_padding)
  kOutputShape, // s ints (ConvTranspose output_shape)
  kGroup,       // 1, the channel count, or a divisor of it
  kPerm,        // a permutation of r axes (or not quite)
  kAxesList,    // distinct axes of r (Resize's axes)
  kBlocksize,   // 1 .. 3
  kValueTensor, // a one-element tensor of some dtype (ConstantOfShape's value)
  kIntInRange,  // lo .. hi
};

struct InputSpec {
  Role role;
  Kind kind = Kind::kAny;
  bool optional = false;
  int min_rank = 0, max_rank = 4;  // for the anchor
};

struct AttrSpec {
  const char* name;
  AttrKind kind;
  std::vector<const char*> choices = {};
  int64_t lo = 0, hi = 0;  // kIntInRange
  bool required = false;
};

struct OpSpec {
  std::vector<InputSpec> inputs;
  std::vector<AttrSpec> attrs;
  size_t anchor = 0;       // the input drafted first; the others follow its type
  bool variadic = false;   // 1-4 inputs, each like input 1's spec
};

// The attributes each op reads (src/onnx, src/ops and src/cpu) and what its inputs take.
// An op of the registry without an entry gets its inputs wired at random and no attributes.
inline const std::map<std::string, OpSpec>& op_specs() {
  static const std::map<std::string, OpSpec> specs = [] {
    std::map<std::string, OpSpec> s;
    const InputSpec float_x{Role::kData, Kind::kFloat};
    const AttrSpec alpha{"alpha", AttrKind::kFloat};
    for (const char* op : {"Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Floor", "Ceil",
                           "Round", "Sin", "Cos", "Softplus", "Softsign", "HardSwish", "Mish", "Tan", "Asin", "Acos",
                           "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "IsNaN"})
      s[op] = {{float_x}, {}};
    for (const char* op : {"Elu", "LeakyRelu", "Celu", "ThresholdedRelu"}) s[op] = {{float_x}, {alpha}};
    s["Selu"] = {{float_x}, {alpha, {"gamma", AttrKind::kFloat}}};
    s["HardSigmoid"] = {{float_x}, {alpha, {"beta", AttrKind::kFloat}}};
    s["Gelu"] = {{float_x}, {{"approximate", AttrKind::kChoice, {"none", "tanh"}}}};
    s["IsInf"] = {{float_x}, {{"detect_negative", AttrKind::kFlag}, {"detect_positive", AttrKind::kFlag}}};
    for (const char* op : {"Abs", "Neg", "Sign"}) s[op] = {{{Role::kData, Kind::kNumeric}}, {}};
    s["Not"] = {{{Role::kData, Kind::kBool}}, {}};
    s["Identity"] = {{{Role::kData}}, {}};

    const InputSpec num_x{Role::kData, Kind::kNumeric}, same{Role::kSame};
    for (const char* op : {"Add", "Sub", "Mul", "Div", "PRelu", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
      s[op] = {{num_x, same}, {}};
    s["Mod"] = {{num_x, same}, {{"fmod", AttrKind::kFlag}}};
    s["Pow"] = {{num_x, {Role::kNumericLike}}, {}};
    s["BitShift"] = {{{Role::kData, Kind::kUnsigned}, same}, {{"direction", AttrKind::kChoice, {"LEFT", "RIGHT"}, 0, 0, true}}};
    for (const char* op : {"And", "Or", "Xor"}) s[op] = {{{Role::kData, Kind::kBool}, same}, {}};
    for (const char* op : {"Max", "Min", "Sum", "Mean"}) s[op] = {{num_x, same}, {}, 0, true};
    s["Where"] = {{{Role::kBoolLike}, {Role::kData}, same}, {}, 1};

    s["Cast"] = {{{Role::kData}}, {{"to", AttrKind::kDType, {}, 0, 0, true}, {"saturate", AttrKind::kFlag}}};
    s["CastLike"] = {{{Role::kData}, {Role::kAnyValue}}, {{"saturate", AttrKind::kFlag}}};
    s["Clip"] = {{num_x, {Role::kScalarSame, Kind::kAny, true}, {Role::kScalarSame, Kind::kAny, true}}, {}};
    s["Dropout"] = {{{Role::kData}, {Role::kRatio, Kind::kAny, true}, {Role::kTrainingMode, Kind::kAny, true}},
                    {{"seed", AttrKind::kSmallInt}}};
    s["Concat"] = {{{Role::kData, Kind::kAny, false, 1}, {Role::kConcatPeer}}, {{"axis", AttrKind::kAxis, {}, 0, 0, true}}, 0, true};
    s["ConstantOfShape"] = {{{Role::kShapeVector}}, {{"value", AttrKind::kValueTensor}}};
    s["EyeLike"] = {{{Role::kData, Kind::kAny, false, 2, 2}}, {{"dtype", AttrKind::kDType}, {"k", AttrKind::kSmallInt}}};
    s["Range"] = {{{Role::kRangeArg}, {Role::kRangeArg}, {Role::kRangeArg}}, {}};

    const std::vector<AttrSpec> conv_attrs = {
        {"kernel_shape", AttrKind::kSpatial}, {"strides", AttrKind::kSpatial}, {"dilations", AttrKind::kSpatial},
        {"pads", AttrKind::kSpatialPads}, {"group", AttrKind::kGroup},
        {"auto_pad", AttrKind::kChoice, {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"}}};
    const InputSpec image{Role::kData, Kind::kFloat, false, 3, 5};
    s["Conv"] = {{image, {Role::kConvWeight}, {Role::kConvBias, Kind::kAny, true}}, conv_attrs};
    std::vector<AttrSpec> convt_attrs = conv_attrs;
    convt_attrs.push_back({"output_padding", AttrKind::kSpatialZero});
    convt_attrs.push_back({"output_shape", AttrKind::kOutputShape});
    s["ConvTranspose"] = {{image, {Role::kConvWeight}, {Role::kConvBias, Kind::kAny, true}}, convt_attrs};

    s["Expand"] = {{{Role::kData}, {Role::kExpandShape}}, {}};
    s["Tile"] = {{{Role::kData}, {Role::kRepeats}}, {}};
    const InputSpec ranked{Role::kData, Kind::kAny, false, 1};
    s["Gather"] = {{ranked, {Role::kIndices}}, {{"axis", AttrKind::kAxis}}};
    s["GatherElements"] = {{ranked, {Role::kElementIndices}}, {{"axis", AttrKind::kAxis}}};
    s["GatherND"] = {{ranked, {Role::kNdIndices}}, {{"batch_dims", AttrKind::kIntInRange, {}, 0, 1}}};
    s["ScatterElements"] = {{ranked, {Role::kElementIndices}, {Role::kUpdates}},
                            {{"axis", AttrKind::kAxis}, {"reduction", AttrKind::kChoice, {"none", "add", "mul", "max", "min"}}}};

    s["Gemm"] = {{{Role::kData, Kind::kFloat, false, 2, 2}, {Role::kGemmB}, {Role::kGemmC, Kind::kAny, true}},
                 {{"alpha", AttrKind::kFloat}, {"beta", AttrKind::kFloat}, {"transA", AttrKind::kFlag}, {"transB", AttrKind::kFlag}}};
    s["MatMul"] = {{{Role::kData, Kind::kFloat, false, 1, 4}, {Role::kMatMulB}}, {}};

    const AttrSpec axis{"axis", AttrKind::kAxis}, epsilon{"epsilon", AttrKind::kFloat};
    for (const char* op : {"Softmax", "LogSoftmax"}) s[op] = {{float_x}, {axis}};
    s["LpNormalization"] = {{float_x}, {axis, {"p", AttrKind::kIntInRange, {}, 0, 3}}};
    s["LayerNormalization"] = {{{Role::kData, Kind::kFloat, false, 1}, {Role::kNormParam}, {Role::kNormParam, Kind::kAny, true}},
                               {axis, epsilon, {"stash_type", AttrKind::kDType}}};
    s["InstanceNormalization"] = {{image, {Role::kChannel}, {Role::kChannel}}, {epsilon}};
    s["BatchNormalization"] = {{{Role::kData, Kind::kFloat, false, 2, 5}, {Role::kChannel}, {Role::kChannel}, {Role::kChannel}, {Role::kChannel}},
                               {epsilon, {"momentum", AttrKind::kFloat}, {"training_mode", AttrKind::kFlag}}};

    s["Pad"] = {{{Role::kData}, {Role::kPads}, {Role::kScalarSame, Kind::kAny, true}, {Role::kPadAxes, Kind::kAny, true}},
                {{"mode", AttrKind::kChoice, {"constant", "reflect", "edge", "wrap"}}}};

    const std::vector<AttrSpec> window = {{"kernel_shape", AttrKind::kSpatial, {}, 0, 0, true}, {"strides", AttrKind::kSpatial},
                                          {"dilations", AttrKind::kSpatial}, {"pads", AttrKind::kSpatialPads},
                                          {"auto_pad", AttrKind::kChoice, {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"}},
                                          {"ceil_mode", AttrKind::kFlag}};
    std::vector<AttrSpec> max_pool = window, avg_pool = window, lp_pool = window;
    max_pool.push_back({"storage_order", AttrKind::kFlag});
    avg_pool.push_back({"count_include_pad", AttrKind::kFlag});
    lp_pool.push_back({"p", AttrKind::kIntInRange, {}, 1, 3});
    s["MaxPool"] = {{image}, max_pool};
    s["AveragePool"] = {{image}, avg_pool};
    s["LpPool"] = {{image}, lp_pool};
    s["GlobalAveragePool"] = {{image}, {}};
    s["GlobalMaxPool"] = {{image}, {}};
    s["GlobalLpPool"] = {{image}, {{"p", AttrKind::kIntInRange, {}, 1, 3}}};

    s["QuantizeLinear"] = {{{Role::kData, Kind::kFloat}, {Role::kQuantScale}, {Role::kQuantZeroPoint, Kind::kAny, true}},
                           {axis, {"saturate", AttrKind::kFlag}, {"output_dtype", AttrKind::kDType}, {"block_size", AttrKind::kIntInRange, {}, 0, 2}}};
    s["DequantizeLinear"] = {{{Role::kData, Kind::kQuantized}, {Role::kQuantScale}, {Role::kQuantZeroPoint, Kind::kAny, true}},
                             {axis, {"block_size", AttrKind::kIntInRange, {}, 0, 2}}};

    for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})
      s[op] = {{num_x, {Role::kAxes, Kind::kAny, true}}, {{"keepdims", AttrKind::kFlag}, {"noop_with_empty_axes", AttrKind::kFlag}}};
    for (const char* op : {"ArgMax", "ArgMin"})
      s[op] = {{num_x}, {axis, {"keepdims", AttrKind::kFlag}, {"select_last_index", AttrKind::kFlag}}};

    s["Reshape"] = {{{Role::kData}, {Role::kReshapeShape}}, {{"allowzero", AttrKind::kFlag}}};
    s["Flatten"] = {{{Role::kData}}, {axis}};
    s["Resize"] = {{{Role::kData, Kind::kAny, false, 1}, {Role::kRoi, Kind::kAny, true}, {Role::kScales, Kind::kAny, true},
                    {Role::kSizes, Kind::kAny, true}},
                   {{"mode", AttrKind::kChoice, {"nearest", "linear", "cubic"}},
                    {"coordinate_transformation_mode", AttrKind::kChoice,
                     {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                      "tf_crop_and_resize", "tf_half_pixel_for_nn"}},
                    {"nearest_mode", AttrKind::kChoice, {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}},
                    {"cubic_coeff_a", AttrKind::kFloat}, {"exclude_outside", AttrKind::kFlag},
                    {"extrapolation_value", AttrKind::kFloat},
                    {"keep_aspect_ratio_policy", AttrKind::kChoice, {"stretch", "not_larger", "not_smaller"}},
                    {"axes", AttrKind::kAxesList}, {"antialias", AttrKind::kFlag}}};
    s["Shape"] = {{{Role::kData}}, {{"start", AttrKind::kAxis}, {"end", AttrKind::kAxis}}};
    s["Size"] = {{{Role::kData}}, {}};
    s["Slice"] = {{ranked, {Role::kStarts}, {Role::kEnds}, {Role::kSliceAxes, Kind::kAny, true}, {Role::kSteps, Kind::kAny, true}}, {}};
    s["Split"] = {{ranked, {Role::kSplitSizes, Kind::kAny, true}}, {axis, {"num_outputs", AttrKind::kIntInRange, {}, 1, 3}}};
    s["Squeeze"] = {{{Role::kData}, {Role::kSqueezeAxes, Kind::kAny, true}}, {}};
    s["Unsqueeze"] = {{{Role::kData}, {Role::kUnsqueezeAxes}}, {}};
    s["TopK"] = {{{Role::kData, Kind::kNumeric, false, 1}, {Role::kK}},
                 {{"axis", AttrKind::kAxis}, {"largest", AttrKind::kFlag}, {"sorted", AttrKind::kFlag}}};
    s["Trilu"] = {{{Role::kData, Kind::kAny, false, 2}, {Role::kIntScalar, Kind::kAny, true}}, {{"upper", AttrKind::kFlag}}};
    s["CumSum"] = {{num_x, {Role::kAxisScalar}}, {{"exclusive", AttrKind::kFlag}, {"reverse", AttrKind::kFlag}}};
    s["OneHot"] = {{{Role::kData, Kind::kNumeric}, {Role::kDepth}, {Role::kOneHotValues}}, {axis}};
    s["NonZero"] = {{{Role::kData}}, {}};
    s["ScatterND"] = {{ranked, {Role::kScatterIndices}, {Role::kScatterUpdates}},
                      {{"reduction", AttrKind::kChoice, {"none", "add", "mul", "max", "min"}}}};
    s["GridSample"] = {{image, {Role::kGrid}},
                       {{"mode", AttrKind::kChoice, {"linear", "nearest", "cubic", "bilinear", "bicubic"}},
                        {"padding_mode", AttrKind::kChoice, {"zeros", "border", "reflection"}},
                        {"align_corners", AttrKind::kFlag}}};
    s["RMSNormalization"] = {{{Role::kData, Kind::kFloat, false, 1}, {Role::kNormParam}}, {axis, epsilon, {"stash_type", AttrKind::kDType}}};
    s["Attention"] = {{{Role::kData, Kind::kFloat, false, 3, 4}, {Role::kSameShape}, {Role::kSameShape}},
                      {{"is_causal", AttrKind::kFlag}, {"q_num_heads", AttrKind::kIntInRange, {}, 1, 2},
                       {"kv_num_heads", AttrKind::kIntInRange, {}, 1, 2}, {"scale", AttrKind::kFloat},
                       {"softcap", AttrKind::kFloat}, {"qk_matmul_output_mode", AttrKind::kIntInRange, {}, 0, 3},
                       {"left_window_size", AttrKind::kIntInRange, {}, -1, 2},
                       {"right_window_size", AttrKind::kIntInRange, {}, -1, 2}}};
    s["Transpose"] = {{{Role::kData}}, {{"perm", AttrKind::kPerm}}};
    const InputSpec nchw{Role::kData, Kind::kAny, false, 4, 4};
    s["DepthToSpace"] = {{nchw}, {{"blocksize", AttrKind::kBlocksize, {}, 0, 0, true}, {"mode", AttrKind::kChoice, {"DCR", "CRD"}}}};
    s["SpaceToDepth"] = {{nchw}, {{"blocksize", AttrKind::kBlocksize, {}, 0, 0, true}}};
    return s;
  }();
  return specs;
}

// Ops that often follow an op in exported models, so that the passes find the patterns they
// rewrite: a convolution or matrix product with its bias, batch norm and activation
// (fuse_epilogue, fold_batchnorm), and shape arithmetic ending in a Reshape, Expand, Tile or
// ConstantOfShape (simplify_shape_chains, probe_symbolic_values, fold_constants). One time in
// three the next node is one of these, reading the last node's output: as its main input, or
// as its shape parameter when `as_parameter`.
struct FollowUp {
  const char* op;
  bool as_parameter = false;
};

inline const std::map<std::string, std::vector<FollowUp>>& follow_ups() {
  static const std::map<std::string, std::vector<FollowUp>> table = [] {
    std::map<std::string, std::vector<FollowUp>> t;
    const std::vector<FollowUp> activations = {{"Relu"}, {"Clip"}, {"Sigmoid"}, {"LeakyRelu"}, {"HardSigmoid"}, {"HardSwish"},
                                               {"Tanh"}, {"Elu"}, {"Gelu"}, {"Selu"}, {"Mish"}};
    std::vector<FollowUp> epilogue = activations;
    epilogue.insert(epilogue.end(), {{"Add"}, {"Add"}, {"Add"}, {"Mul"}, {"BatchNormalization"}, {"BatchNormalization"}});
    for (const char* op : {"Conv", "ConvTranspose", "Gemm", "MatMul"}) t[op] = epilogue;
    std::vector<FollowUp> after_add = activations;
    after_add.push_back({"Add"});
    for (const char* op : {"Add", "Mul", "BatchNormalization"}) t[op] = after_add;
    const std::vector<FollowUp> shape_math = {{"Gather"}, {"Slice"}, {"Concat"}, {"Cast"}, {"Mul"}, {"Div"}, {"Add"},
                                              {"Unsqueeze"}, {"Squeeze"}, {"ReduceProd"}};
    const std::vector<FollowUp> shape_uses = {{"Reshape", true}, {"Expand", true}, {"Tile", true}, {"ConstantOfShape", true},
                                              {"Range", true}};
    t["Shape"] = shape_math;
    for (const char* op : {"Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Div", "ReduceProd"}) {
      t[op] = shape_math;
      t[op].insert(t[op].end(), shape_uses.begin(), shape_uses.end());
    }
    return t;
  }();
  return table;
}

// Counts of what the generator made, for the fuzzer's statistics.
struct GeneratorStats {
  uint64_t nodes_kept = 0;
  uint64_t nodes_dropped = 0;        // failed their check and were left out
  uint64_t nodes_kept_invalid = 0;   // failed their check and were kept, to exercise refusals
  std::map<std::string, uint64_t>* reasons = nullptr;  // when set: why nodes failed, counted
};

template <class Source>
class GraphGenerator {
 public:
  explicit GraphGenerator(Source& source, GeneratorStats* stats = nullptr) : src_(source), stats_(stats) {}

  onnx::ModelProto generate() {
    // Opsets 13-21 mostly; the newer ones kiln reads (Attention and RMSNormalization are 23+)
    // one time in four.
    opset_ = static_cast<int>(one_in(4) ? range(22, onnx_import::kMaxOpset) : range(13, 21));
    shadow_.opset = opset_;
    model_.set_ir_version(opset_ <= 18 ? 8 : opset_ <= 21 ? 10 : 11);
    model_.set_producer_name("kiln-fuzz-graph");
    model_.add_opset_import()->set_version(opset_);
    graph().set_name("fuzz");
    const int inputs = static_cast<int>(range(1, 3));
    for (int i = 0; i < inputs; ++i) add_graph_input(random_dtype(Kind::kAny), random_rank(0, 4));
    const std::vector<std::string> ops = candidate_ops();
    const int nodes = static_cast<int>(range(1, 8));
    for (int i = 0; i < nodes && !stop_; ++i) {
      std::string op = ops[static_cast<size_t>(range(0, static_cast<int64_t>(ops.size()) - 1))];
      auto next = follow_ups().find(last_op_);
      if (next != follow_ups().end() && !last_outputs_.empty() && one_in(3)) {
        const FollowUp& f = pick(next->second);
        if (std::find(ops.begin(), ops.end(), f.op) != ops.end()) {
          op = f.op;
          (f.as_parameter ? prefer_parameter_ : prefer_anchor_) = last_outputs_.front();
        }
      }
      add_node(op);
      prefer_anchor_.clear();
      prefer_parameter_.clear();
    }
    add_graph_outputs();
    return model_;
  }

 private:
  // A node being drafted: the proto, the initializers it needs, and choices its inputs share.
  struct Draft {
    onnx::NodeProto proto;
    ir::Node node;
    std::vector<onnx::TensorProto> initializers;
    ir::TensorType anchor;
    std::vector<int64_t> dims;  // the anchor's dims, unknown ones as 2 (what they run at)
    int rank = 0;
    std::vector<int64_t> slice_axes;
    std::optional<std::vector<int64_t>> pad_axes;
    bool resize_scales = true;
    std::string indices;  // ScatterElements' / ScatterND's indices, which updates match
    int64_t num_outputs = 1;
  };

  onnx::GraphProto& graph() { return *model_.mutable_graph(); }

  // ---- Choices -------------------------------------------------------------------------
  int64_t range(int64_t lo, int64_t hi) { return src_.template ConsumeIntegralInRange<int64_t>(lo, hi); }
  // True once in n draws (never when the bytes have run out).
  bool one_in(int64_t n) { return range(0, n - 1) == n - 1; }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[static_cast<size_t>(range(0, static_cast<int64_t>(v.size()) - 1))]; }

  int64_t extreme() {
    static const std::vector<int64_t> values = {
        0, -1, 1, INT32_MAX, int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 62, INT64_MAX, INT64_MIN,
        -(int64_t{1} << 62), INT32_MIN, 65537, (int64_t{1} << 31) + 1, INT64_MAX - 1};
    return pick(values);
  }
  // `v`, or once in a while an extreme value in its place.
  int64_t maybe_extreme(int64_t v) { return one_in(24) ? extreme() : v; }

  float float_value() {
    switch (range(0, 31)) {
      case 28: return std::numeric_limits<float>::quiet_NaN();
      case 29: return one_in(2) ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
      case 30: return one_in(2) ? -1e30f : 3e38f;
      case 31: return one_in(2) ? -0.f : 1e-40f;
      default: return static_cast<float>(range(-8, 8)) * 0.25f;
    }
  }

  DType random_dtype(Kind kind) {
    static const std::vector<DType> numeric = {DType::kInt64, DType::kInt32, DType::kUInt8, DType::kInt8, DType::kFloat64,
                                               DType::kInt16, DType::kUInt16, DType::kUInt32, DType::kUInt64};
    static const std::vector<DType> floats = {DType::kFloat64, DType::kFloat16, DType::kBFloat16};
    static const std::vector<DType> others = {DType::kBool, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3FN};
    switch (kind) {
      case Kind::kBool: return DType::kBool;
      case Kind::kIndex: return one_in(4) ? DType::kInt32 : DType::kInt64;
      case Kind::kUnsigned: return pick(std::vector<DType>{DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64});
      case Kind::kQuantized: return pick(std::vector<DType>{DType::kInt8, DType::kUInt8, DType::kInt16, DType::kUInt16, DType::kInt32});
      case Kind::kFloat: return one_in(8) ? pick(floats) : DType::kFloat32;
      case Kind::kNumeric: return one_in(4) ? pick(numeric) : DType::kFloat32;
      case Kind::kAny:
        if (range(0, 7) < 5) return DType::kFloat32;
        return one_in(4) ? pick(others) : pick(numeric);
    }
    return DType::kFloat32;
  }

  static bool accepts(Kind kind, DType t) {
    switch (kind) {
      case Kind::kAny: return true;
      case Kind::kFloat: return is_float(t);
      case Kind::kNumeric: return is_float(t) || is_integer(t);
      case Kind::kBool: return t == DType::kBool;
      case Kind::kIndex: return t == DType::kInt64 || t == DType::kInt32;
      case Kind::kUnsigned: return t == DType::kUInt8 || t == DType::kUInt16 || t == DType::kUInt32 || t == DType::kUInt64;
      case Kind::kQuantized: return t == DType::kInt8 || t == DType::kUInt8 || t == DType::kInt16 || t == DType::kUInt16 || t == DType::kInt32;
    }
    return false;
  }

  int random_rank(int lo, int hi) {
    // Ranks 1-3 most often.
    int r = static_cast<int>(range(0, 7));
    int want = r < 2 ? 2 : r < 4 ? 1 : r < 6 ? 3 : r == 6 ? 4 : 0;
    return std::clamp(want, lo, hi);
  }

  // 1-4 mostly; 5-24 one time in six, so that vectorized kernels leave their tails.
  int64_t small_dim() { return one_in(6) ? range(5, 24) : range(1, 4); }

  // A graph input's dim: small mostly; symbolic, unknown, 0 or huge sometimes.
  onnx::TensorShapeProto::Dimension input_dim() {
    onnx::TensorShapeProto::Dimension d;
    int64_t r = range(0, 47);
    if (r < 38) d.set_dim_value(small_dim());
    else if (r < 42) d.set_dim_param(pick(std::vector<std::string>{"N", "M"}));
    else if (r < 44) d.set_dim_value(one_in(2) ? 0 : 1);
    else if (r < 45) {
      // neither value nor name: unknown
    } else if (r < 47) d.set_dim_value(std::max<int64_t>(0, extreme()));
    else d.set_dim_value(-range(1, 3));
    return d;
  }

  // ---- Values --------------------------------------------------------------------------
  // A shape for a tensor the generator allocates: one derived from a huge dim is cut down
  // (the model then contradicts itself there, which the checks refuse).
  static std::vector<int64_t> capped(std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape)
      if (d > 64 || __builtin_mul_overflow(n, d, &n) || n > 16384) {
        for (int64_t& x : shape) x = std::min<int64_t>(x, 2);
        break;
      }
    return shape;
  }

  std::string fresh(const char* prefix) { return prefix + std::to_string(counter_++); }

  const ir::TensorType& type_of(const std::string& name) { return shadow_.value(name).type; }

  static bool shape_passes_import(const ir::Dims& dims, DType dtype) {
    try {
      ir::check_shape_size(dims, dtype, "input");
    } catch (const Error&) {
      return false;
    }
    return true;
  }

  static std::vector<int64_t> run_dims(const ir::TensorType& t) {
    std::vector<int64_t> out;
    if (t.shape)
      for (const ir::Dim& d : *t.shape) out.push_back(d.known() ? d.value : 2);
    return out;
  }

  void add_graph_input(DType dtype, int rank) {
    onnx::ValueInfoProto* in = graph().add_input();
    in->set_name(fresh("in"));
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(static_cast<int>(dtype));
    auto* shape = tt->mutable_shape();
    for (int i = 0; i < rank; ++i) *shape->add_dim() = input_dim();
    ir::Value v;
    v.name = in->name();
    v.type.dtype = dtype;
    ir::Dims dims;
    for (const auto& d : shape->dim()) {
      dims.push_back(d.has_dim_value() ? ir::Dim(d.dim_value()) : d.has_dim_param() ? ir::Dim::named(d.dim_param()) : ir::Dim::unknown());
      if (d.has_dim_value() && d.dim_value() < 0) stop_ = true;
    }
    v.type.shape = dims;
    // Import refuses a negative dim or a shape past the largest tensor before any node: the
    // model tests that door only, and no node is drafted against a shape import never passes on.
    if (!shape_passes_import(dims, dtype)) stop_ = true;
    shadow_.set_value(std::move(v));
    ++input_count_;
    pool_.push_back(in->name());
  }

  // Small values of a dtype, with the odd special one.
  Tensor random_tensor(DType dtype, const std::vector<int64_t>& shape) {
    Tensor t(dtype, capped(shape));
    unsigned char* p = static_cast<unsigned char*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i) {
      unsigned char* e = p + static_cast<size_t>(i) * element_size(dtype);
      int64_t small = range(-3, 3);
      switch (dtype) {
        case DType::kFloat32: { float f = one_in(4) ? float_value() : static_cast<float>(small) * 0.5f; std::memcpy(e, &f, 4); break; }
        case DType::kFloat64: { double f = one_in(4) ? float_value() : static_cast<double>(small) * 0.5; std::memcpy(e, &f, 8); break; }
        case DType::kBool: *e = small > 0; break;
        case DType::kFloat16: case DType::kBFloat16: { uint16_t b = static_cast<uint16_t>(range(0, 0xffff)); std::memcpy(e, &b, 2); break; }
        case DType::kFloat8E4M3FN: *e = static_cast<unsigned char>(range(0, 255)); break;
        default: { int64_t v = maybe_extreme(small); std::memcpy(e, &v, element_size(dtype)); break; }  // little-endian truncation
      }
    }
    return t;
  }

  // An initializer holding `t`, written as raw bytes or typed fields.
  std::string add_initializer(Draft* draft, const Tensor& t) {
    onnx::TensorProto proto;
    const std::string name = fresh("c");
    proto.set_name(name);
    proto.set_data_type(static_cast<int>(t.dtype()));
    for (int64_t d : t.shape()) proto.add_dims(d);
    const unsigned char* p = static_cast<const unsigned char*>(t.raw());
    const size_t es = element_size(t.dtype());
    if (!one_in(3)) {
      proto.set_raw_data(std::string(reinterpret_cast<const char*>(p), t.nbytes()));
    } else {
      for (int64_t i = 0; i < t.numel(); ++i) {
        const unsigned char* e = p + static_cast<size_t>(i) * es;
        switch (t.dtype()) {
          case DType::kFloat32: { float f; std::memcpy(&f, e, 4); proto.add_float_data(f); break; }
          case DType::kFloat64: { double f; std::memcpy(&f, e, 8); proto.add_double_data(f); break; }
          case DType::kInt64: { int64_t v; std::memcpy(&v, e, 8); proto.add_int64_data(v); break; }
          case DType::kUInt32: { uint32_t v; std::memcpy(&v, e, 4); proto.add_uint64_data(v); break; }
          case DType::kUInt64: { uint64_t v; std::memcpy(&v, e, 8); proto.add_uint64_data(v); break; }
          case DType::kInt32: { int32_t v; std::memcpy(&v, e, 4); proto.add_int32_data(v); break; }
          case DType::kInt16: { int16_t v; std::memcpy(&v, e, 2); proto.add_int32_data(v); break; }
          case DType::kInt8: proto.add_int32_data(static_cast<int8_t>(*e)); break;
          case DType::kUInt16: case DType::kFloat16: case DType::kBFloat16: { uint16_t v; std::memcpy(&v, e, 2); proto.add_int32_data(v); break; }
          default: proto.add_int32_data(*e); break;  // uint8, bool, float8
        }
      }
    }
    ir::Value v;
    v.name = proto.name();
    v.type.dtype = t.dtype();
    v.type.shape = ir::dims_of(t.shape());
    if (t.rank() <= 1 && is_integer(t.dtype()) && t.numel() <= 64) v.symbolic_value = ir::dims_of(t.to_int_vector());
    v.constant = t;
    shadow_.set_value(std::move(v));
    if (draft) draft->initializers.push_back(std::move(proto));
    else *graph().add_initializer() = std::move(proto);
    return name;
  }

  // An int64 1-D initializer of `values` (each may turn extreme); a scalar when `scalar`.
  // Once in a while an int64 value computed by the graph instead, known only when it runs.
  std::string ints(Draft& d, std::vector<int64_t> values, bool scalar = false) {
    if (!prefer_parameter_.empty()) {
      const ir::TensorType& t = type_of(prefer_parameter_);
      std::string name;
      if (t.dtype == DType::kInt64 && t.rank() == (scalar ? 0 : 1)) name = prefer_parameter_;
      prefer_parameter_.clear();
      if (!name.empty()) return name;
    }
    if (one_in(12)) {
      std::vector<std::string> computed;
      for (const std::string& name : pool_) {
        const ir::TensorType& t = type_of(name);
        if (t.dtype == DType::kInt64 && t.rank() == (scalar ? 0 : 1)) computed.push_back(name);
      }
      if (!computed.empty()) return pick(computed);
    }
    for (int64_t& v : values) v = maybe_extreme(v);
    if (scalar) return add_initializer(&d, Tensor::scalar<int64_t>(values.empty() ? 0 : values[0]));
    return add_initializer(&d, Tensor::from_vector<int64_t>({static_cast<int64_t>(values.size())}, values));
  }

  std::string floats(Draft& d, const std::vector<int64_t>& shape, DType dtype = DType::kFloat32) {
    return add_initializer(&d, random_tensor(dtype, shape));
  }

  // A new value of `dtype` and `shape`: a graph input (while there are fewer than 3) or an
  // initializer.
  std::string new_value(Draft* d, DType dtype, const std::vector<int64_t>& shape) {
    if (input_count_ < 3 && one_in(3) && shape_passes_import(ir::dims_of(shape), dtype)) {
      onnx::ValueInfoProto* in = graph().add_input();
      in->set_name(fresh("in"));
      auto* tt = in->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(static_cast<int>(dtype));
      auto* s = tt->mutable_shape();
      for (int64_t x : shape) s->add_dim()->set_dim_value(x);
      ir::Value v;
      v.name = in->name();
      v.type.dtype = dtype;
      v.type.shape = ir::dims_of(shape);
      shadow_.set_value(std::move(v));
      ++input_count_;
      return in->name();
    }
    return add_initializer(d, random_tensor(dtype, shape));
  }

  // A data value of `kind` and rank in [lo, hi]: an earlier one (recent ones more often) or
  // a new one.
  std::string data(Draft* d, Kind kind, int lo, int hi) {
    if (!prefer_anchor_.empty()) {
      const ir::TensorType& t = type_of(prefer_anchor_);
      std::string name;
      if (accepts(kind, t.dtype) && t.rank() >= lo && t.rank() <= hi) name = prefer_anchor_;
      prefer_anchor_.clear();
      if (!name.empty()) return name;
    }
    std::vector<std::string> fits;
    for (const std::string& name : pool_) {
      const ir::TensorType& t = type_of(name);
      if (accepts(kind, t.dtype) && t.rank() >= lo && t.rank() <= hi) fits.push_back(name);
    }
    if (!fits.empty() && !one_in(6)) {
      if (one_in(2)) return fits.back();
      return pick(fits);
    }
    std::vector<int64_t> shape;
    const int rank = random_rank(lo, hi);
    for (int i = 0; i < rank; ++i) shape.push_back(small_dim());
    std::string name = new_value(d, random_dtype(kind), shape);
    pool_.push_back(name);
    return name;
  }

  // A shape that broadcasts to `dims`: a suffix with some dims set to 1.
  std::vector<int64_t> broadcastable(const std::vector<int64_t>& dims) {
    if (dims.size() >= 2 && one_in(4)) {
      // Per channel, as a convolution's bias is written: [C, 1, ...].
      std::vector<int64_t> out(dims.size() - 1, 1);
      out[0] = dims[1];
      return out;
    }
    size_t skip = one_in(3) ? static_cast<size_t>(range(0, static_cast<int64_t>(dims.size()))) : 0;
    std::vector<int64_t> out(dims.begin() + static_cast<std::ptrdiff_t>(skip), dims.end());
    for (int64_t& x : out)
      if (one_in(3)) x = 1;
    return out;
  }

  // An earlier value of `dtype` whose shape broadcasts with the anchor's, or a new one.
  std::string like(Draft& d, DType dtype) {
    if (one_in(2)) {
      std::vector<std::string> fits;
      for (const std::string& name : pool_) {
        const ir::TensorType& t = type_of(name);
        if (t.dtype == dtype && t.shape && d.anchor.shape && ir::broadcast_dims(*t.shape, *d.anchor.shape)) fits.push_back(name);
      }
      if (!fits.empty()) return pick(fits);
    }
    return new_value(&d, dtype, broadcastable(d.dims));
  }

  int64_t axis_of(const Draft& d, int64_t fallback) {
    int64_t a = d.node.attrs.get_int("axis", fallback);
    if (d.rank == 0) return 0;
    if (a < -d.rank || a >= d.rank) return 0;
    return a < 0 ? a + d.rank : a;
  }
  // The anchor's dim at `axis` (1 when there is none), at most 2^40 so that arithmetic on it
  // cannot overflow.
  int64_t dim_at(const Draft& d, int64_t axis) {
    const int64_t v = axis >= 0 && axis < static_cast<int64_t>(d.dims.size()) ? d.dims[static_cast<size_t>(axis)] : 1;
    return std::min<int64_t>(v, int64_t{1} << 40);
  }

  // Distinct axes of `rank`, some written negative.
  std::vector<int64_t> axes_of(int64_t rank, int64_t count) {
    std::vector<int64_t> all;
    for (int64_t i = 0; i < rank; ++i) all.push_back(i);
    for (size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[static_cast<size_t>(range(0, static_cast<int64_t>(i) - 1))]);
    all.resize(static_cast<size_t>(std::clamp<int64_t>(count, 0, rank)));
    for (int64_t& a : all)
      if (one_in(3)) a -= rank;
    return all;
  }

  // ---- Attributes ----------------------------------------------------------------------
  void set_attr(Draft& d, const std::string& name, ir::AttrValue value) {
    onnx::AttributeProto* a = d.proto.add_attribute();
    a->set_name(name);
    std::visit([&](const auto& v) {
      using T = std::decay_t<decltype(v)>;
      if constexpr (std::is_same_v<T, int64_t>) { a->set_type(onnx::AttributeProto::INT); a->set_i(v); }
      else if constexpr (std::is_same_v<T, float>) { a->set_type(onnx::AttributeProto::FLOAT); a->set_f(v); }
      else if constexpr (std::is_same_v<T, std::string>) { a->set_type(onnx::AttributeProto::STRING); a->set_s(v); }
      else if constexpr (std::is_same_v<T, std::vector<int64_t>>) { a->set_type(onnx::AttributeProto::INTS); for (int64_t x : v) a->add_ints(x); }
      else if constexpr (std::is_same_v<T, std::vector<float>>) { a->set_type(onnx::AttributeProto::FLOATS); for (float x : v) a->add_floats(x); }
      else if constexpr (std::is_same_v<T, Tensor>) {
        a->set_type(onnx::AttributeProto::TENSOR);
        onnx::TensorProto* t = a->mutable_t();
        t->set_data_type(static_cast<int>(v.dtype()));
        for (int64_t x : v.shape()) t->add_dims(x);
        t->set_raw_data(std::string(static_cast<const char*>(v.raw()), v.nbytes()));
      }
    }, value);
    d.node.attrs.set(name, std::move(value));
  }

  int64_t dtype_code() {
    static const std::vector<int64_t> known = {1, 1, 1, 7, 7, 6, 9, 2, 3, 11, 10, 16, 17, 4, 5, 12, 13};
    static const std::vector<int64_t> odd = {0, 8, 14, 15, 18, 19, 20, 21, 22, 23, 9999, -1, INT64_MAX, INT64_MIN, (int64_t{1} << 32) + 1};
    return one_in(10) ? pick(odd) : pick(known);
  }

  std::vector<int64_t> spatial_ints(int64_t lo, int64_t hi, int64_t count) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < count; ++i) v.push_back(maybe_extreme(range(lo, hi)));
    if (one_in(16) && !v.empty()) v.pop_back();  // the wrong length
    return v;
  }

  void draw_attribute(Draft& d, const AttrSpec& a) {
    const int64_t r = d.rank, s = std::max(0, d.rank - 2);
    switch (a.kind) {
      case AttrKind::kAxis: set_attr(d, a.name, maybe_extreme(range(-r - 1, r))); break;
      case AttrKind::kFlag: set_attr(d, a.name, one_in(16) ? maybe_extreme(2) : range(0, 1)); break;
      case AttrKind::kSmallInt: set_attr(d, a.name, maybe_extreme(range(-2, 3))); break;
      case AttrKind::kFloat: set_attr(d, a.name, one_in(4) ? float_value() : static_cast<float>(range(1, 20)) * 0.05f); break;
      case AttrKind::kChoice:
        set_attr(d, a.name, one_in(32) ? std::string(one_in(2) ? "" : "junk") : std::string(pick(a.choices)));
        break;
      case AttrKind::kDType: set_attr(d, a.name, dtype_code()); break;
      case AttrKind::kSpatial: set_attr(d, a.name, spatial_ints(1, 3, s)); break;
      case AttrKind::kSpatialPads: set_attr(d, a.name, spatial_ints(0, 2, 2 * s)); break;
      case AttrKind::kSpatialZero: set_attr(d, a.name, spatial_ints(0, 1, s)); break;
      case AttrKind::kOutputShape: set_attr(d, a.name, spatial_ints(1, 8, s)); break;
      case AttrKind::kGroup: {
        const int64_t c = dim_at(d, 1);
        int64_t g = 1;
        if (one_in(3)) g = std::max<int64_t>(c, 1);
        else if (one_in(3)) g = range(1, 3);
        set_attr(d, a.name, maybe_extreme(g));
        break;
      }
      case AttrKind::kPerm: {
        std::vector<int64_t> perm = axes_of(r, r);
        for (int64_t& p : perm)
          if (p < 0) p += r;
        if (one_in(16)) perm.push_back(maybe_extreme(0));
        set_attr(d, a.name, perm);
        break;
      }
      case AttrKind::kAxesList: set_attr(d, a.name, axes_of(r, range(1, std::max<int64_t>(r, 1)))); break;
      case AttrKind::kBlocksize: set_attr(d, a.name, maybe_extreme(range(1, 3))); break;
      case AttrKind::kValueTensor: set_attr(d, a.name, random_tensor(random_dtype(Kind::kAny), one_in(8) ? std::vector<int64_t>{2} : std::vector<int64_t>{1})); break;
      case AttrKind::kIntInRange: set_attr(d, a.name, maybe_extreme(range(a.lo, a.hi))); break;
    }
  }

  // ---- Inputs by role ------------------------------------------------------------------
  std::string draw_input(Draft& d, const InputSpec& in) {
    const int64_t r = d.rank;
    const std::vector<int64_t>& x = d.dims;
    const DType dt = d.anchor.dtype;
    switch (in.role) {
      case Role::kData: return data(&d, in.kind, in.min_rank, in.max_rank);
      case Role::kSame: return like(d, dt);
      case Role::kBoolLike: return like(d, DType::kBool);
      case Role::kNumericLike: return like(d, random_dtype(Kind::kNumeric));
      case Role::kAnyValue: return data(&d, Kind::kAny, 0, 8);
      case Role::kConcatPeer: {
        std::vector<int64_t> shape = x;
        const int64_t axis = axis_of(d, 0);
        if (axis < static_cast<int64_t>(shape.size())) shape[static_cast<size_t>(axis)] = range(0, 3);
        return new_value(&d, dt, shape);
      }
      case Role::kScalarSame: return add_initializer(&d, random_tensor(dt, one_in(4) ? std::vector<int64_t>{1} : std::vector<int64_t>{}));
      case Role::kShapeVector: {
        std::vector<int64_t> dims;
        for (int64_t i = random_rank(0, 4); i > 0; --i) dims.push_back(range(0, 4) == 0 ? 0 : range(1, 4));
        return ints(d, dims);
      }
      case Role::kReshapeShape: {
        // The anchor's element count split over 1-4 dims, then maybe a -1 or a 0.
        int64_t n = 1;
        for (int64_t v : x)
          if (__builtin_mul_overflow(n, v, &n) || n > (1 << 20)) n = range(1, 16);
        std::vector<int64_t> out(static_cast<size_t>(range(1, 4)), 1);
        if (n == 0) out[0] = 0;
        for (int64_t p = 2; n > 1 && p <= n; ++p)
          while (n % p == 0) { out[static_cast<size_t>(range(0, static_cast<int64_t>(out.size()) - 1))] *= p; n /= p; }
        if (one_in(3)) out[static_cast<size_t>(range(0, static_cast<int64_t>(out.size()) - 1))] = -1;
        else if (one_in(4)) {
          size_t i = static_cast<size_t>(range(0, static_cast<int64_t>(out.size()) - 1));
          if (i < x.size() && x[i] == out[i]) out[i] = 0;
        }
        return ints(d, out);
      }
      case Role::kExpandShape: {
        std::vector<int64_t> out = x;
        for (int64_t& v : out)
          if (v == 1 && one_in(2)) v = range(1, 3);
          else if (one_in(6)) v = 1;
        for (int64_t k = range(0, 2); k > 0 && one_in(3); --k) out.insert(out.begin(), range(1, 3));
        return ints(d, out);
      }
      case Role::kRepeats: {
        std::vector<int64_t> out;
        for (int64_t i = 0; i < r; ++i) out.push_back(range(0, 5) == 0 ? 0 : range(1, 3));
        return ints(d, out);
      }
      case Role::kAxes: return ints(d, axes_of(r, range(0, r)));
      case Role::kSqueezeAxes: {
        std::vector<int64_t> ones;
        for (int64_t i = 0; i < r; ++i)
          if (x[static_cast<size_t>(i)] == 1 && (ones.empty() || one_in(2))) ones.push_back(one_in(3) ? i - r : i);
        if (ones.empty() || one_in(8)) ones = axes_of(r, 1);
        return ints(d, ones);
      }
      case Role::kUnsqueezeAxes: {
        const int64_t k = range(1, 2);
        return ints(d, axes_of(r + k, k));
      }
      case Role::kPads: {
        int64_t count = r;
        if (one_in(4)) {
          d.pad_axes = axes_of(r, range(1, std::max<int64_t>(r, 1)));
          count = static_cast<int64_t>(d.pad_axes->size());
        }
        std::vector<int64_t> pads;
        for (int64_t i = 0; i < 2 * count; ++i) pads.push_back(one_in(6) ? -1 : range(0, 2));
        return ints(d, pads);
      }
      case Role::kPadAxes: return d.pad_axes ? ints(d, *d.pad_axes) : std::string();
      case Role::kStarts: {
        const int64_t n = range(1, std::max<int64_t>(r, 1));
        d.slice_axes = axes_of(r, n);
        std::vector<int64_t> starts;
        for (int64_t a : d.slice_axes) {
          const int64_t len = dim_at(d, a < 0 ? a + r : a);
          starts.push_back(range(-len, len));
        }
        return ints(d, starts);
      }
      case Role::kEnds: {
        std::vector<int64_t> ends;
        for (int64_t a : d.slice_axes) {
          const int64_t len = dim_at(d, a < 0 ? a + r : a);
          ends.push_back(one_in(4) ? (one_in(2) ? INT64_MAX : INT64_MIN) : range(-len - 1, len + 1));
        }
        return ints(d, ends);
      }
      case Role::kSliceAxes: {
        bool natural = true;
        for (size_t k = 0; k < d.slice_axes.size(); ++k) natural = natural && d.slice_axes[k] == static_cast<int64_t>(k);
        if (natural && one_in(2)) return std::string();
        return ints(d, d.slice_axes);
      }
      case Role::kSteps: {
        std::vector<int64_t> steps;
        for (size_t k = 0; k < d.slice_axes.size(); ++k) steps.push_back(pick(std::vector<int64_t>{1, 1, 1, 2, -1, -2, 3}));
        return ints(d, steps);
      }
      case Role::kIndices: {
        const int64_t len = dim_at(d, axis_of(d, 0));
        std::vector<int64_t> shape;
        for (int k = random_rank(0, 2); k > 0; --k) shape.push_back(range(1, 3));
        return index_tensor(d, shape, len);
      }
      case Role::kElementIndices: {
        const int64_t len = dim_at(d, axis_of(d, 0));
        std::vector<int64_t> shape = x;
        for (size_t i = 0; i < shape.size(); ++i)
          if (static_cast<int64_t>(i) != axis_of(d, 0) && shape[i] > 1 && one_in(3)) shape[i] = 1;
        d.indices = index_tensor(d, shape, len);
        return d.indices;
      }
      case Role::kUpdates: {
        const ir::Value* idx = shadow_.find_value(d.indices);
        return new_value(&d, dt, idx ? run_dims(idx->type) : x);
      }
      case Role::kNdIndices: {
        const int64_t b = d.node.attrs.get_int("batch_dims", 0);
        const int64_t k = range(1, std::max<int64_t>(1, r - std::max<int64_t>(b, 0)));
        std::vector<int64_t> shape;
        for (int64_t i = 0; i < b && i < r; ++i) shape.push_back(x[static_cast<size_t>(i)]);
        shape.push_back(k);
        Tensor t(DType::kInt64, capped(shape));
        int64_t* p = t.data<int64_t>();
        for (int64_t i = 0; i < t.numel(); ++i) {
          const int64_t axis = std::min<int64_t>(b + i % k, r - 1);
          const int64_t len = dim_at(d, axis);
          p[i] = maybe_extreme(len > 0 ? range(-len, len - 1) : 0);
        }
        return add_initializer(&d, t);
      }
      case Role::kK: return ints(d, {range(0, std::max<int64_t>(dim_at(d, axis_of(d, -1)), 0))});
      case Role::kSplitSizes: {
        const int64_t len = std::min<int64_t>(dim_at(d, axis_of(d, 0)), 64);
        if (d.node.attrs.has("num_outputs") && !one_in(8)) return std::string();
        std::vector<int64_t> sizes(static_cast<size_t>(d.num_outputs), 0);
        for (int64_t i = 0; i < len; ++i) sizes[static_cast<size_t>(range(0, d.num_outputs - 1))] += 1;
        return ints(d, sizes);
      }
      case Role::kRoi: {
        const std::string mode = d.node.attrs.get_string("coordinate_transformation_mode", "");
        if (mode != "tf_crop_and_resize" && !one_in(8)) return std::string();
        return floats(d, {2 * resize_axes(d)});
      }
      case Role::kScales: {
        d.resize_scales = !one_in(3);
        if (!d.resize_scales) return one_in(2) ? std::string() : floats(d, {0});
        Tensor t(DType::kFloat32, {resize_axes(d)});
        for (int64_t i = 0; i < t.numel(); ++i)
          t.data<float>()[i] = one_in(6) ? float_value() : static_cast<float>(range(1, 8)) * 0.5f;
        return add_initializer(&d, t);
      }
      case Role::kSizes: {
        if (d.resize_scales) return std::string();
        std::vector<int64_t> sizes;
        for (int64_t i = 0; i < resize_axes(d); ++i) sizes.push_back(range(0, 6));
        return ints(d, sizes);
      }
      case Role::kConvWeight: {
        const bool transpose = d.node.op == "ConvTranspose";
        const int64_t g = std::clamp<int64_t>(d.node.attrs.get_int("group", 1), 1, 64);
        const int64_t c = dim_at(d, 1);
        const int64_t m = g * range(1, 2);
        std::vector<int64_t> shape = transpose ? std::vector<int64_t>{c, m / g} : std::vector<int64_t>{m, std::max<int64_t>(c / g, 1)};
        std::vector<int64_t> ks = d.node.attrs.get_ints("kernel_shape");
        for (int64_t i = 0; i + 2 < r; ++i) {
          const size_t u = static_cast<size_t>(i);
          // kernel_shape's when it is drawn and sane, else at most the input's size mostly.
          const int64_t fit = std::clamp<int64_t>(dim_at(d, i + 2), 1, 3);
          shape.push_back(u < ks.size() && ks[u] > 0 && ks[u] <= 5 ? ks[u] : range(1, one_in(4) ? 3 : fit));
        }
        return floats(d, shape, dt);
      }
      case Role::kConvBias: {
        const ir::Value* w = d.node.inputs.size() > 1 ? shadow_.find_value(d.node.inputs[1]) : nullptr;
        std::vector<int64_t> wd = w ? run_dims(w->type) : std::vector<int64_t>{1, 1};
        const int64_t g = std::clamp<int64_t>(d.node.attrs.get_int("group", 1), 1, 64);
        const int64_t m = d.node.op == "ConvTranspose" ? std::min<int64_t>(wd[1], 64) * g : wd[0];
        return floats(d, {m}, dt);
      }
      case Role::kGemmB: {
        const bool ta = d.node.attrs.get_int("transA", 0) != 0, tb = d.node.attrs.get_int("transB", 0) != 0;
        const int64_t k = ta ? dim_at(d, 0) : dim_at(d, 1), n = range(1, 4);
        return floats(d, tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, dt);
      }
      case Role::kGemmC: {
        const ir::Value* b = shadow_.find_value(d.node.inputs[1]);
        const bool ta = d.node.attrs.get_int("transA", 0) != 0, tb = d.node.attrs.get_int("transB", 0) != 0;
        const std::vector<int64_t> bd = b ? run_dims(b->type) : std::vector<int64_t>{1, 1};
        const int64_t m = ta ? dim_at(d, 1) : dim_at(d, 0), n = bd.size() == 2 ? (tb ? bd[0] : bd[1]) : 1;
        return floats(d, broadcastable({m, n}), dt);
      }
      case Role::kMatMulB: {
        const int64_t k = x.empty() ? 1 : x.back();
        std::vector<int64_t> shape = broadcastable(std::vector<int64_t>(x.begin(), x.end() - std::min<std::ptrdiff_t>(2, static_cast<std::ptrdiff_t>(x.size()))));
        shape.push_back(k);
        if (!one_in(4)) shape.push_back(range(1, 4));
        return floats(d, shape, dt);
      }
      case Role::kChannel: return floats(d, {dim_at(d, 1)}, dt);
      case Role::kNormParam: {
        const int64_t axis = axis_of(d, -1);
        return floats(d, std::vector<int64_t>(x.begin() + std::min<int64_t>(axis, r), x.end()), dt);
      }
      case Role::kQuantScale: {
        Tensor t = one_in(3) ? Tensor(DType::kFloat32, capped({dim_at(d, axis_of(d, 1))})) : Tensor(DType::kFloat32, {});
        for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = one_in(8) ? float_value() : static_cast<float>(range(1, 8)) * 0.125f;
        return add_initializer(&d, t);
      }
      case Role::kQuantZeroPoint: {
        const ir::Value* scale = shadow_.find_value(d.node.inputs[1]);
        DType zt = d.node.op == "DequantizeLinear" ? dt : pick(std::vector<DType>{DType::kUInt8, DType::kInt8, DType::kInt16, DType::kUInt16, DType::kFloat8E4M3FN});
        return add_initializer(&d, random_tensor(zt, scale ? run_dims(scale->type) : std::vector<int64_t>{}));
      }
      case Role::kAxisScalar: return ints(d, {range(-r, std::max<int64_t>(r - 1, 0))}, true);
      case Role::kIntScalar: return ints(d, {range(-3, 3)}, true);
      case Role::kDepth: {
        Tensor t(pick(std::vector<DType>{DType::kInt64, DType::kFloat32, DType::kInt32}), {});
        set_number(t, maybe_extreme(range(1, 4)));
        return add_initializer(&d, t);
      }
      case Role::kOneHotValues: return add_initializer(&d, random_tensor(random_dtype(Kind::kAny), {2}));
      case Role::kRangeArg: {
        if (d.node.inputs.empty()) d.anchor.dtype = pick(std::vector<DType>{DType::kInt64, DType::kFloat32, DType::kInt32, DType::kFloat64, DType::kInt16});
        const size_t which = d.node.inputs.size();
        Tensor t(d.anchor.dtype, {});
        const int64_t v = which == 0 ? range(-3, 3) : which == 1 ? range(-2, 8) : (one_in(2) ? 1 : range(-2, 3));
        set_number(t, maybe_extreme(v));
        if (one_in(12) && input_count_ < 3) return new_value(&d, d.anchor.dtype, {});
        return add_initializer(&d, t);
      }
      case Role::kRatio: return add_initializer(&d, Tensor::scalar<float>(0.5f));
      case Role::kTrainingMode: return add_initializer(&d, Tensor::scalar<bool>(one_in(8)));
      case Role::kSameShape: return new_value(&d, dt, x);
      case Role::kGrid: {
        std::vector<int64_t> shape = {dim_at(d, 0)};
        for (int64_t i = 2; i < r; ++i) shape.push_back(small_dim());
        shape.push_back(std::max<int64_t>(r - 2, 0));
        Tensor t(DType::kFloat32, capped(shape));
        for (int64_t i = 0; i < t.numel(); ++i)
          t.data<float>()[i] = one_in(8) ? float_value() : static_cast<float>(range(-6, 6)) * 0.25f;
        return add_initializer(&d, t);
      }
      case Role::kScatterIndices: {
        const int64_t k = range(1, std::max<int64_t>(r, 1));
        std::vector<int64_t> shape;
        for (int rank = random_rank(0, 2); rank > 0; --rank) shape.push_back(range(1, 3));
        shape.push_back(k);
        Tensor t(DType::kInt64, capped(shape));
        for (int64_t i = 0; i < t.numel(); ++i) {
          const int64_t len = dim_at(d, i % k);
          t.data<int64_t>()[i] = maybe_extreme(len > 0 ? range(-len, len - 1) : 0);
        }
        d.indices = add_initializer(&d, t);
        return d.indices;
      }
      case Role::kScatterUpdates: {
        const ir::Value* idx = shadow_.find_value(d.indices);
        std::vector<int64_t> shape = idx ? run_dims(idx->type) : std::vector<int64_t>{1};
        const int64_t k = shape.empty() ? 0 : shape.back();
        if (!shape.empty()) shape.pop_back();
        for (int64_t i = k; i < r; ++i) shape.push_back(x[static_cast<size_t>(i)]);
        return new_value(&d, dt, shape);
      }
    }
    return std::string();
  }

  static void set_number(Tensor& t, int64_t v) {
    switch (t.dtype()) {
      case DType::kFloat32: t.data<float>()[0] = static_cast<float>(v); break;
      case DType::kFloat64: t.data<double>()[0] = static_cast<double>(v); break;
      default: std::memcpy(t.raw(), &v, element_size(t.dtype())); break;  // little-endian truncation
    }
  }

  int64_t resize_axes(const Draft& d) {
    return d.node.attrs.has("axes") ? static_cast<int64_t>(d.node.attrs.get_ints("axes").size()) : d.rank;
  }

  // Indices into an axis of `len`, mostly in range (negative ones too); int64 or int32; or,
  // once in a while, indices the graph computes (known only when it runs).
  std::string index_tensor(Draft& d, const std::vector<int64_t>& shape, int64_t len) {
    if (one_in(10)) {
      std::vector<std::string> computed;
      for (const std::string& name : pool_)
        if (accepts(Kind::kIndex, type_of(name).dtype)) computed.push_back(name);
      if (!computed.empty()) return pick(computed);
    }
    const DType dt = one_in(4) ? DType::kInt32 : DType::kInt64;
    Tensor t(dt, capped(shape));
    for (int64_t i = 0; i < t.numel(); ++i) {
      int64_t v = maybe_extreme(len > 0 ? range(-len, len - 1) : 0);
      if (dt == DType::kInt32) t.data<int32_t>()[i] = static_cast<int32_t>(v);
      else t.data<int64_t>()[i] = v;
    }
    return add_initializer(&d, t);
  }

  // ---- Nodes ---------------------------------------------------------------------------
  // The ops a node may have, each listed as often as its weight: the ops that dominate real
  // models and have the most involved kernels and rewrites come up more often than the rest.
  std::vector<std::string> candidate_ops() const {
    static const std::map<std::string, int> weights = {
        {"Conv", 6}, {"ConvTranspose", 3}, {"MatMul", 5}, {"Gemm", 5}, {"BatchNormalization", 3}, {"MaxPool", 2},
        {"AveragePool", 2}, {"Reshape", 3}, {"Transpose", 2}, {"Concat", 2}, {"Slice", 2}, {"Gather", 2},
        {"Shape", 3}, {"Resize", 2}, {"Softmax", 2}, {"LayerNormalization", 2}, {"Add", 2}, {"Mul", 2}};
    std::vector<std::string> ops = {"Constant"};
    const auto& importers = onnx_import::ImporterRegistry::instance();
    for (const ir::OpSchema* s : ir::OpRegistry::instance().all()) {
      if (!s->domain.empty()) continue;
      const onnx_import::OpImporter* imp = importers.find(s->op);
      if (!imp || imp->since_opset > opset_) continue;
      auto w = weights.find(s->op);
      ops.insert(ops.end(), w == weights.end() ? 1 : w->second, s->op);
    }
    return ops;
  }

  // Optional inputs that are present or not by what other inputs drew (Pad's axes, Resize's
  // scales or sizes, Slice's axes, Split's sizes, the roi of tf_crop_and_resize).
  static bool decides_presence(Role role) {
    return role == Role::kPadAxes || role == Role::kScales || role == Role::kSizes || role == Role::kRoi ||
           role == Role::kSliceAxes || role == Role::kSplitSizes;
  }

  int64_t output_count(const Draft& d) {
    const std::string& op = d.node.op;
    if (op == "Split") {
      if (d.node.attrs.has("num_outputs")) {
        const int64_t n = d.node.attrs.get_int("num_outputs", 1);
        return one_in(8) ? range(1, 3) : std::clamp<int64_t>(n, 1, 3);
      }
      return range(1, 3);
    }
    if (op == "TopK") return 2;
    if (op == "MaxPool" || op == "Dropout") return range(1, 2);
    if (op == "LayerNormalization") return range(1, 3);
    if (op == "BatchNormalization") return one_in(16) ? 3 : 1;
    const ir::OpSchema* s = ir::OpRegistry::instance().find(op);
    return s ? s->min_outputs : 1;
  }

  void add_constant_node() {
    Draft d;
    d.proto.set_op_type("Constant");
    d.node.op = "Constant";
    switch (range(0, 4)) {
      case 0: set_attr(d, "value", random_tensor(random_dtype(Kind::kAny), {range(0, 3), range(1, 3)})); break;
      case 1: set_attr(d, "value_float", float_value()); break;
      case 2: set_attr(d, "value_floats", std::vector<float>{float_value(), float_value()}); break;
      case 3: set_attr(d, "value_int", maybe_extreme(range(-2, 4))); break;
      case 4: set_attr(d, "value_ints", std::vector<int64_t>{maybe_extreme(range(0, 3)), maybe_extreme(range(1, 4))}); break;
    }
    finish(d, 1);
  }

  void add_node(const std::string& op) {
    if (op == "Constant") return add_constant_node();
    Draft d;
    d.proto.set_op_type(op);
    d.node.op = op;
    const auto& specs = op_specs();
    auto it = specs.find(op);
    OpSpec spec;
    if (it != specs.end()) {
      spec = it->second;
    } else {
      // An op this table does not know yet: its inputs at random.
      const ir::OpSchema* s = ir::OpRegistry::instance().find(op);
      spec.inputs.push_back({Role::kData});
      for (int i = 1; s && i < std::min(s->min_inputs, 4); ++i) spec.inputs.push_back({Role::kSame});
    }
    if (spec.variadic) {
      const int64_t n = range(1, 4);
      spec.inputs.resize(static_cast<size_t>(n), spec.inputs.size() > 1 ? spec.inputs[1] : spec.inputs[0]);
    }
    std::vector<std::string> inputs(spec.inputs.size());
    // The anchor first; the attributes know its rank; the other inputs follow both.
    const InputSpec& anchor = spec.inputs[spec.anchor];
    inputs[spec.anchor] = draw_input(d, anchor);
    if (!inputs[spec.anchor].empty() && shadow_.has_value(inputs[spec.anchor])) {
      d.anchor = type_of(inputs[spec.anchor]);
      d.dims = run_dims(d.anchor);
      d.rank = static_cast<int>(d.dims.size());
    }
    for (const AttrSpec& a : spec.attrs)
      if (a.required ? !one_in(32) : one_in(2)) draw_attribute(d, a);
    d.num_outputs = output_count(d);
    for (size_t i = 0; i < spec.inputs.size(); ++i) {
      if (i == spec.anchor) continue;
      d.node.inputs = std::vector<std::string>(inputs.begin(), inputs.begin() + static_cast<std::ptrdiff_t>(i));
      if (spec.inputs[i].optional && !decides_presence(spec.inputs[i].role) && one_in(2)) continue;
      inputs[i] = draw_input(d, spec.inputs[i]);
    }
    while (!inputs.empty() && inputs.back().empty()) inputs.pop_back();
    // Before opset 18, Reduce* other than ReduceSum take their axes as an attribute.
    if (op.rfind("Reduce", 0) == 0 && op != "ReduceSum" && opset_ < 18 && inputs.size() > 1) {
      const ir::Value& axes = shadow_.value(inputs[1]);
      if (axes.constant) set_attr(d, "axes", axes.constant->to_int_vector());
      inputs.resize(1);
    }
    for (const std::string& in : inputs) d.proto.add_input(in);
    finish(d, d.num_outputs);
  }

  // Names the node's outputs, checks the node, and adds it (or drops it).
  void finish(Draft& d, int64_t outputs) {
    const std::string id = std::to_string(node_count_++);
    d.proto.set_name("n" + id + "_" + d.proto.op_type());
    for (int64_t o = 0; o < outputs; ++o) d.proto.add_output(fresh("v"));
    std::vector<std::string> made;
    const bool ok = check(d, made);
    if (!ok && !one_in(8)) {
      if (stats_) ++stats_->nodes_dropped;
      for (const std::string& v : made) shadow_.erase_value(v);
      for (const onnx::TensorProto& t : d.initializers) {
        pool_.erase(std::remove(pool_.begin(), pool_.end(), t.name()), pool_.end());
        shadow_.erase_value(t.name());
      }
      return;
    }
    for (onnx::TensorProto& t : d.initializers) *graph().add_initializer() = std::move(t);
    *graph().add_node() = d.proto;
    if (!ok) {
      // Kept to exercise the refusal: nothing after it could be typed.
      if (stats_) ++stats_->nodes_kept_invalid;
      stop_ = true;
      last_outputs_.assign(d.proto.output().begin(), d.proto.output().end());
      return;
    }
    if (stats_) ++stats_->nodes_kept;
    last_op_ = d.proto.op_type();
    last_outputs_.clear();
    for (const std::string& v : made) {
      if (!shadow_.has_value(v) || shadow_.value(v).type.dtype == DType::kUndefined) continue;
      pool_.push_back(v);
      last_outputs_.push_back(v);
      node_outputs_.push_back(v);
    }
  }

  // Runs the node through the importer's conversion, the schemas and the CPU kernels' checks on
  // the shadow graph. Returns false on a kiln::Error a model can cause; kInternal errors and
  // any other exception propagate (they are findings). `made`: the values it typed.
  bool check(Draft& d, std::vector<std::string>& made) {
    d.node.name = d.proto.name();
    d.node.inputs.assign(d.proto.input().begin(), d.proto.input().end());
    d.node.outputs.assign(d.proto.output().begin(), d.proto.output().end());
    const size_t before = shadow_.nodes.size();
    try {
      const onnx_import::OpImporter* imp = onnx_import::ImporterRegistry::instance().find(d.node.op);
      onnx_import::ImportContext ctx{d.proto, shadow_, opset_, d.node};
      if (imp && imp->convert) imp->convert(ctx);
      else ctx.emit_as_is();
      for (size_t k = before; k < shadow_.nodes.size(); ++k) infer_and_check(shadow_.nodes[k], made);
      // Constant becomes a value, not a node.
      for (const std::string& out : d.node.outputs)
        if (shadow_.has_value(out) && std::find(made.begin(), made.end(), out) == made.end()) made.push_back(out);
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kInternal) throw;
      if (stats_ && stats_->reasons) ++(*stats_->reasons)[d.node.op + ": " + std::string(e.what()).substr(0, 160)];
      shadow_.nodes.resize(before);
      return false;
    }
    return true;
  }

  void infer_and_check(const ir::Node& node, std::vector<std::string>& made) {
    std::vector<const ir::TensorType*> types;
    std::vector<const Tensor*> values;
    std::vector<const ir::Dims*> symbolic;
    for (const std::string& in : node.inputs) {
      const ir::Value* v = in.empty() ? nullptr : shadow_.find_value(in);
      if (!in.empty() && (!v || v->type.dtype == DType::kUndefined))
        throw node.error(ErrorKind::kInvalidModel, "input '" + in + "' has no known type");
      types.push_back(v ? &v->type : nullptr);
      values.push_back(v && v->constant ? &*v->constant : nullptr);
      symbolic.push_back(v && v->symbolic_value ? &*v->symbolic_value : nullptr);
    }
    ir::InferContext ctx = ir::infer_node(node, types, values, symbolic);
    std::vector<const ir::TensorType*> out_types;
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      if (node.outputs[o].empty()) continue;
      ir::Value v;
      v.name = node.outputs[o];
      v.type = ctx.output_types[o];
      v.symbolic_value = ctx.output_symbolic[o];
      shadow_.set_value(std::move(v));
      made.push_back(node.outputs[o]);
    }
    for (const std::string& out : node.outputs) out_types.push_back(out.empty() ? nullptr : &shadow_.value(out).type);
    // The CPU engine refuses what its kernels cannot run (a dtype, a rank): such a node would
    // stop every model it is in before anything runs.
    const cpu::KernelEntry* entry = cpu::KernelRegistry::instance().find(node.op, node.domain);
    if (!entry) throw node.error(ErrorKind::kUnsupported, "no CPU kernel");
    cpu::KernelInit init{node, types, values, out_types};
    if (entry->check) {
      std::string why = entry->check(init);
      if (!why.empty()) throw node.error(ErrorKind::kUnsupported, why);
    }
  }

  void add_graph_outputs() {
    std::vector<std::string> outs = last_outputs_;
    if (outs.empty() && !node_outputs_.empty()) outs.push_back(node_outputs_.back());
    if (outs.empty()) outs.push_back(graph().input(0).name());
    // Earlier values as outputs too, sometimes (a value read elsewhere blocks the fusions).
    for (int extra = one_in(3) ? static_cast<int>(range(1, 2)) : 0; extra > 0 && !node_outputs_.empty(); --extra) {
      const std::string& v = pick(node_outputs_);
      if (std::find(outs.begin(), outs.end(), v) == outs.end()) outs.push_back(v);
    }
    for (const std::string& name : outs) {
      onnx::ValueInfoProto* o = graph().add_output();
      o->set_name(name);
      const ir::Value* v = shadow_.find_value(name);
      if (!v || !one_in(3)) continue;
      // Declared types: the inferred one, so the merge with inference is exercised.
      auto* tt = o->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(static_cast<int>(v->type.dtype));
      if (!v->type.shape || one_in(2)) continue;
      auto* shape = tt->mutable_shape();
      for (const ir::Dim& dim : *v->type.shape) {
        auto* sd = shape->add_dim();
        if (dim.known()) sd->set_dim_value(dim.value);
        else if (dim.symbolic()) sd->set_dim_param(dim.symbol);
      }
    }
  }

  Source& src_;
  GeneratorStats* stats_;
  onnx::ModelProto model_;
  ir::Graph shadow_;                 // what import would make of the model so far
  std::vector<std::string> pool_;    // typed values new nodes may read
  std::vector<std::string> node_outputs_, last_outputs_;
  std::string last_op_;                            // of the last node kept
  std::string prefer_anchor_, prefer_parameter_;   // a follow-up's input (follow_ups())
  int opset_ = 13;
  int input_count_ = 0;
  int node_count_ = 0;
  int64_t counter_ = 0;
  bool stop_ = false;
};

}  // namespace kiln::fuzz
