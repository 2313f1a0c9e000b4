// Which convolutions, pools and elementwise ops the CPU engine runs channels-last
// (kiln::ChannelsLastConv, src/ops/channels_last_conv.cc; kiln::ChannelsLastMaxPool and
// kiln::ChannelsLastGlobalAveragePool, src/ops/pool.cc), for the layout pass
// the compiler runs before it builds a CPU engine (src/passes/channels_last_convs.cc).
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace kiln::cpu {

// Has this Conv or kiln::FusedConv node a channels-last kernel that reads its input in place:
// 2-D, float32, constant weights, one group or depthwise (one input channel per group), on a
// CPU with AVX-512.
bool channels_last_conv_runs(const ir::Graph& graph, const ir::Node& conv);

// Can this convolution, accepted by channels_last_conv_runs, read a channels-first X (the
// kernel's tiles along input rows; attribute input_channels_first of kiln::ChannelsLastConv):
// one group of at most kChannelsFirstMaxChannels input channels, strides and dilations of at
// most kChannelsFirstMaxStep, as a network's first convolution on an image. Its chain then needs
// no Transpose at the input.
constexpr int64_t kChannelsFirstMaxChannels = 4;
constexpr int64_t kChannelsFirstMaxStep = 64;
bool channels_last_conv_reads_channels_first(const ir::Graph& graph, const ir::Node& conv);

// Has this pool node a channels-last kernel (src/cpu/pool.cc), on a CPU with AVX-512: a 2-D
// float32 MaxPool without its Indices output (kiln::ChannelsLastMaxPool), a 2-D float32
// GlobalAveragePool (kiln::ChannelsLastGlobalAveragePool). Such a pool joins the chains of
// channels-last convolutions around it (ResNet's stem and first block; squeeze-and-excitation
// blocks).
bool channels_last_pool_runs(const ir::Graph& graph, const ir::Node& pool);

// Does the CPU engine run this elementwise node (passes::layout_free_elementwise) among
// channels-last convolutions: float32, on a CPU with AVX-512 (where those convolutions run).
bool channels_last_elementwise_runs(const ir::Graph& graph, const ir::Node& node);

// A chain of convolutions goes channels-last when its arithmetic is at least this many FLOPs per
// element its Transposes move. A Transpose reads and writes 8 bytes an element (about 10 GB/s on
// a core), the convolutions run at about 150 GFLOP/s a core and channels-last saves 10-30% of
// their time: a few thousand FLOPs per element keep the Transposes to a few percent. Measured
// (docs/design/cpu-gemm.md, "Channels-last convolutions"): chains at 890 (1x1 and depthwise
// layers) and 1,290 (two of GoogLeNet's inception branches) ran slower channels-last, MobileNet-V2
// (2,800) as fast or faster, ResNet-18 (15,000) and ResNet-50 (26,000) faster.
constexpr double kChannelsLastMinFlopsPerMovedElement = 2000;

// A depthwise-separable block runs as one kiln::ChannelsLastSeparableConv (passes::separable_convs)
// when its depthwise convolution reads at least this many bytes per image.
constexpr int64_t kSeparableMinDepthwiseInputBytes = int64_t{1} << 20;

}  // namespace kiln::cpu
