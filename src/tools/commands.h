// The kiln command line: each subcommand lives in its own file and registers itself here.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace kiln::tools {

// Each command file defines one of these; main.cc wires them up. A command's action returns
// the process exit code; kiln::Error is caught in main and printed.
void add_inspect_command(CLI::App& app, std::function<int()>& action);
void add_run_command(CLI::App& app, std::function<int()>& action);
void add_conformance_command(CLI::App& app, std::function<int()>& action);
void add_operators_command(CLI::App& app, std::function<int()>& action);
void add_build_command(CLI::App& app, std::function<int()>& action);
void add_bench_command(CLI::App& app, std::function<int()>& action);
void add_calibrate_command(CLI::App& app, std::function<int()>& action);
void add_quantize_command(CLI::App& app, std::function<int()>& action);
void add_eval_command(CLI::App& app, std::function<int()>& action);
// export, compare, report: handed to the Python package (python_tools.cc).
void add_python_commands(CLI::App& app, std::function<int()>& action);

}  // namespace kiln::tools
