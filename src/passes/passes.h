// Graph passes: each takes a Graph and rewrites it in place; each lives in its own file and
// can be run and tested alone. compiler::optimize (src/compiler/pipeline.h) runs them in the
// order the CPU and GPU backends want.
//
// Every pass expects a graph whose shapes have been inferred (ir::infer_shapes) and leaves
// the values it creates typed; compiler::optimize re-infers shapes between rounds.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <optional>
#include <vector>

#include "ir/graph.h"

namespace kiln::passes {

// Computes a node's outputs from constant inputs (one per node input, nullptr for an omitted
// optional input). Returns nullopt when it cannot (no kernel for the op or the dtype); throws
// a kiln::Error naming the node when the computation itself fails. Passes stay backend-free
// by taking it as a parameter; compiler::optimize gives them the CPU engine's (cpu/evaluate.h).
using NodeEvaluator =
    std::function<std::optional<std::vector<Tensor>>(const ir::Node&, const std::vector<const Tensor*>&)>;

// Folding refuses to materialize outputs larger than this (they would bloat the weights).
constexpr int64_t kMaxFoldedBytes = int64_t{64} << 20;

// Each returns the number of rewrites it made (0: the graph is unchanged).
int eliminate_dead_code(ir::Graph& graph);

// Nodes whose inputs are all constants (deterministic ops only) become initializers, and so
// do node outputs whose symbolic value (from shape arithmetic) is fully known.
int fold_constants(ir::Graph& graph, const NodeEvaluator& evaluate, int64_t max_bytes = kMaxFoldedBytes);

// Replaces each If whose condition is a constant by the nodes of the branch it always runs.
int inline_constant_if(ir::Graph& graph);

// Loops unrolled (unroll_loops) run at most this many iterations and make at most this many
// nodes, in a graph of at most kMaxUnrolledGraphNodes nodes once unrolled: past them a loop
// stays one node, not thousands of layers to optimize and build.
constexpr int64_t kMaxUnrolledTrips = 128;
constexpr size_t kMaxUnrolledNodes = 2048;
constexpr size_t kMaxUnrolledGraphNodes = 16384;

// Replaces each Loop whose trip count is a constant (1 to kMaxUnrolledTrips), whose condition
// stays true and whose carried values keep their types, and each Scan whose scanned length is
// known (1 to kMaxUnrolledTrips) and whose states keep their types, by its body's nodes once per
// iteration.
int unroll_loops(ir::Graph& graph);

// Drops Identity and inference-mode Dropout nodes, rewiring their consumers.
int remove_identity_and_dropout(ir::Graph& graph);

// Folds BatchNormalization into a preceding Conv / ConvTranspose / Gemm / MatMul with
// constant weights; a remaining BatchNormalization with constant parameters becomes Mul+Add.
int fold_batchnorm(ir::Graph& graph);

// Folds a Mul by a constant that scales only the columns of a product by constant weights
// (through an optional bias Add and Transpose: a ConvNeXt-style layer scale) into the weights
// and bias. Returns the number of Muls folded.
int fold_channel_scale(ir::Graph& graph);

// Conv [+ bias Add] [+ residual Add] [+ activation] -> kiln::FusedConv,
// Gemm [+ activation] -> kiln::FusedGemm, MatMul [+ bias Add] [+ activation] -> kiln::FusedMatMul.
// Does nothing for a fused op whose schema is not registered.
int fuse_epilogue(ir::Graph& graph);

// GroupNormalization, InstanceNormalization and torch.onnx's GroupNorm written out around an
// InstanceNormalization (Reshape, InstanceNormalization, Reshape, Mul, Add), with the activation
// after them -> kiln::FusedGroupNorm, one pass over memory.
int fuse_group_norm(ir::Graph& graph);

// Attention with a key/value cache (past_key, past_value) -> Concats making present_key and
// present_value, and an Attention over them without a cache, its causal and window masking a
// constant mask; where every shape is known. For a backend whose attention layer takes no cache.
int split_attention_cache(ir::Graph& graph);

// Gemm with a runtime C of another shape than the product's [M, N] (both known) -> an Expand of
// C to [M, N] in front of it. For a backend whose Gemm adds a runtime C only as a whole matrix.
int expand_gemm_c(ir::Graph& graph);

// Groups of elementwise float ops whose inner values nothing else reads, with a Concat that only
// such a group reads -> kiln::FusedElementwise (ops/fused_elementwise.h), one pass over memory
// each. Needs every shape known; meant for graphs that the CUDA engine runs.
int fuse_elementwise(ir::Graph& graph);

// Scaled dot-product attention (MatMul, scalar scale, additive mask, Softmax, MatMul) ->
// one ONNX Attention node. For each Softmax between two MatMuls that does not match, a line in
// `notes` says which element of the pattern failed.
int fuse_attention(ir::Graph& graph, std::vector<std::string>& notes);

// LayerNormalization [-> Reshape-like nodes] -> QuantizeLinear (per tensor, to int8 or
// float8e4m3fn) -> kiln::QuantizingLayerNorm, which writes the quantized copy itself (the reshapes
// then on the copy) and keeps the float output only where something else reads it. For INT8 and
// FP8 builds, after their quantize layers exist.
int fuse_layer_norm_quantize(ir::Graph& graph);

// kiln::StridedAttention [-> Reshape-like nodes] -> QuantizeLinear (per tensor, to int8, zero
// point 0) -> the attention writing int8 itself (its inputs 4 and 5: the scale and zero point),
// the reshapes then on its int8 output; only where nothing else reads the float output. For INT8
// builds, after their quantize layers exist.
int fuse_attention_quantize(ir::Graph& graph);

// Q, K and V (or K and V) projected from one tensor by constant matrices [+ bias] -> one MatMul
// by the matrices side by side [+ one bias] and a Split, where fold_attention_views then reads
// the heads from the packed product in place (tried on a copy first).
int pack_attention_projections(ir::Graph& graph);

// With every shape known: an Attention whose Q, K or V come through layers that only move
// elements (Reshape, Transpose, Gather of one index, Slice, Split, ...) or whose Y goes through
// Transposes and Reshapes -> kiln::StridedAttention reading and writing those tensors in place.
int fold_attention_views(ir::Graph& graph);

// Transpose(Reshape(X)) with the Reshape only merging adjacent axes of X -> Reshape(Transpose(X))
// (the Transpose then reads X in its own axes: a channels-last convolution output is read as
// it is stored, with no Reformat).
int transpose_before_merge(ir::Graph& graph);

// ReduceMean over the spatial axes (2, 3) of a rank-4 float32 value -> GlobalAveragePool (and
// Flatten(axis 1) where keepdims is 0), which the CPU engine's layout keeps channels-last
// (src/passes/reduce_mean_to_global_pool.cc). Returns the number of ReduceMeans rewritten.
int reduce_mean_to_global_pool(ir::Graph& graph);

// What a backend says of one convolution node, for passes that lay out tensors for it.
using ConvLayoutQuery = std::function<bool(const ir::Graph&, const ir::Node&)>;

// The CPU engine's layout: chains of Conv / kiln::FusedConv nodes that `runs` accepts ->
// kiln::ChannelsLastConv on [N, H, W, C] activations (MaxPools and GlobalAveragePools it accepts
// among them -> kiln::ChannelsLastMaxPool and kiln::ChannelsLastGlobalAveragePool; elementwise ops
// it accepts among them read and write channels-last), with Transposes where a chain meets the
// rest of the graph. Chains of one convolution, and chains whose arithmetic is less than
// `min_flops_per_moved_element` FLOPs per element their Transposes would move, stay as they are
// (src/passes/channels_last_convs.cc). A convolution that reads a value from outside its chain
// as X and that `reads_channels_first` accepts (where given) reads it channels-first, without a
// Transpose. Returns the number of nodes rewritten.
int channels_last_convs(ir::Graph& graph, const ConvLayoutQuery& runs, double min_flops_per_moved_element,
                        const ConvLayoutQuery& reads_channels_first = nullptr);

// Whether `node` is an elementwise op (broadcasting arithmetic, a unary op, a
// kiln::FusedElementwise without a concatenation) whose output is rank 4 and whose other operands
// hold one value each: it computes the same on channels-last operands.
bool layout_free_elementwise(const ir::Graph& graph, const ir::Node& node);

// Depthwise-separable blocks of kiln::ChannelsLastConv (an optional 1x1 expansion, a depthwise
// convolution, a 1x1 projection) -> one kiln::ChannelsLastSeparableConv, where the depthwise
// convolution reads at least `min_depthwise_input_bytes` per image (src/passes/separable_convs.cc).
// Returns the number of blocks fused.
int separable_convs(ir::Graph& graph, int64_t min_depthwise_input_bytes);

// Gives Reshape / Expand nodes whose shape input is computed (Shape -> Gather -> Concat ...)
// but whose symbolic value is known a constant shape input instead, so the chain dies.
int simplify_shape_chains(ir::Graph& graph);

// Learns the elements of small computed integer tensors (shape arithmetic that symbolic
// inference cannot follow) by folding the shape subgraphs at two bindings of the symbolic
// input dims, and stores them as symbolic values.
int probe_symbolic_values(ir::Graph& graph, const NodeEvaluator& evaluate);

// Gives every input its shape from `shapes` (by input name; dims must agree with the declared
// ones), or its declared shape with dynamic dims set to 1, and re-infers all shapes.
// Throws kInvalidArgument naming the input on a contradiction or an unknown name.
int bind_input_shapes(ir::Graph& graph, const std::map<std::string, std::vector<int64_t>>& shapes);

// Makes each named input a constant of the given value (it leaves graph.inputs) and re-infers all
// shapes. The dtype and shape must be the input's (after bind_input_shapes). Throws
// kInvalidArgument naming the input otherwise.
int bind_input_values(ir::Graph& graph, const std::map<std::string, Tensor>& values);

}  // namespace kiln::passes
