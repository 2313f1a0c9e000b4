#include "ir/subgraph_types.h"

#include <atomic>

namespace kiln::ir {

namespace {
std::atomic<SubgraphTyper> g_typer{nullptr};
}  // namespace

void set_subgraph_typer(SubgraphTyper typer) { g_typer.store(typer); }

SubgraphTyper subgraph_typer() { return g_typer.load(); }

}  // namespace kiln::ir
