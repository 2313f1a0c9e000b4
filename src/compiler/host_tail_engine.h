// A GPU engine whose last nodes run on the CPU engine because their output shapes depend on the
// data (data_dependent_split.h): each run runs the GPU part, copies what it hands the tail to the
// host, then runs the tail on the CPU engine. Outputs the tail computes have the shapes that run
// gives them, so they come only from run(): enqueue(), output_shape() and the output buffers
// refuse them, naming the node where the tail begins.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "compiler/data_dependent_split.h"

namespace kiln::compiler {

// `whole` is what the engine file stores (loading splits it again); `head` the GPU engine of
// split.head, `tail` the engine of split.tail: the CPU engine's, with the nodes `tail_on_gpu` names
// (node name -> tactic) run on the GPU (staged_tail_engine.h). tactics() are both engines'.
std::unique_ptr<backend::Engine> make_host_tail_engine(std::shared_ptr<const ir::Graph> whole, DataDependentSplit split,
                                                       std::unique_ptr<backend::Engine> head,
                                                       std::unique_ptr<backend::Engine> tail,
                                                       std::map<std::string, std::string> tail_on_gpu = {});

}  // namespace kiln::compiler
