// The CPU tail of a GPU build with its row stages (row_stages.h) on the GPU: the tail's nodes in
// parts, run in order, each part reading what the tail's inputs and the parts before it computed.
// A CPU part is a CPU engine of its nodes; a stage is an engine of up to `rows_per_run` rows of
// the stage's `rows` value, which runs the rows a run brings that many at a time, each run's rows
// padded with zeros to a power of two (a few planned shapes, not one per count; the zero rows
// written on the device where the engine has contexts) and its outputs' padding rows dropped.
// Zero rows run nothing: the stage's outputs have no rows.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "compiler/row_stages.h"

namespace kiln::compiler {

struct TailPart {
  ir::Graph graph;                  // a CPU part: its nodes; a stage: row_stage_graph
  std::optional<RowStage> stage;    // set for a stage
  int64_t rows_per_run = 0;         // a stage: the most rows its engine takes
  std::unique_ptr<backend::Engine> engine;
};

// `tail`'s nodes as parts in an order that runs: each stage whole, where its first node was, the
// nodes between stages as CPU parts (their graphs; engines left to the caller). Each part's
// inputs are what it reads of the tail's inputs and the parts before it; its outputs what the
// parts after it and the tail's outputs read.
std::vector<TailPart> tail_parts(const ir::Graph& tail, const std::vector<RowStage>& stages, int64_t rows_per_run);

// The engine that runs `parts` (every engine set) in order: tail's graph, its inputs and outputs.
// tactics() are the stages' engines' tactics.
std::unique_ptr<backend::Engine> make_staged_tail_engine(ir::Graph tail, std::vector<TailPart> parts);

}  // namespace kiln::compiler
