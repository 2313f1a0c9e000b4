// kiln: the command line. Subcommands: inspect, build, run, bench, calibrate, quantize, eval,
// conformance, operators; export, compare and report run in Python (tools/python_tools.cc).
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "kiln/error.h"
#include "tools/commands.h"

namespace {

// `kiln --version`: the version (the file VERSION) and the backends built in, with the GPU
// architectures the CUDA kernels are compiled for (KILN_CUDA_ARCHITECTURES in CMakeLists.txt).
std::string version_text() {
  std::string text = std::string("kiln ") + KILN_VERSION + "\nbackends: cpu";
#if KILN_WITH_CUDA
  text += ", cuda (compiled for " KILN_CUDA_ARCHITECTURES_TEXT ")";
#else
  text += " (built without the CUDA backend)";
#endif
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln: compile ONNX models into fast inference engines and run them"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text());
  std::function<int()> action;
  kiln::tools::add_inspect_command(app, action);
  kiln::tools::add_build_command(app, action);
  kiln::tools::add_run_command(app, action);
  kiln::tools::add_bench_command(app, action);
  kiln::tools::add_calibrate_command(app, action);
  kiln::tools::add_quantize_command(app, action);
  kiln::tools::add_eval_command(app, action);
  kiln::tools::add_conformance_command(app, action);
  kiln::tools::add_operators_command(app, action);
  kiln::tools::add_python_commands(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end here too, with exit code 0; every usage error is a kiln error.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "kiln: error: " << e.what() << "\n";
    const CLI::App* command = app.get_subcommands().empty() ? nullptr : app.get_subcommands().front();
    std::cerr << "run 'kiln " << (command ? command->get_name() + " " : std::string()) << "--help' for the usage\n";
    return 1;
  }
  try {
    return action ? action() : 0;
  } catch (const kiln::Error& e) {
    std::cerr << "kiln: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "kiln: error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "kiln: internal error: " << e.what() << "\n";
    return 2;
  }
}
