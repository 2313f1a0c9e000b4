// `kiln export`, `kiln compare`, `kiln report`, `kiln check`, `kiln debug`, `kiln serve`: the parts of the pipeline written in
// Python (python/kiln: export from PyTorch or TensorFlow, the comparison with PyTorch, the charts
// and HTML report, the comparison with ONNX Runtime, the model reducer, the inference server). The command line hands them to the Python that has the kiln package:
//   1. $KILN_PYTHON, if set;
//   2. python3 next to this executable (pip installs both into one environment's bin/);
//   3. the Python this build was configured with (-DKILN_PYTHON, the developer's .venv);
//   4. python3 on the PATH.
// A developer build lays the package out in <build>/python, which goes first on PYTHONPATH.
// KILN_BIN (unless set) names this executable, for the tools that run kiln themselves.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "tools/commands.h"

#ifndef KILN_PYTHON_DEFAULT
#define KILN_PYTHON_DEFAULT ""
#endif

namespace kiln::tools {
namespace {

namespace fs = std::filesystem;

fs::path executable_dir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : self.parent_path();
}

std::string find_python() {
  if (const char* env = std::getenv("KILN_PYTHON"); env && *env) return env;
  std::error_code ec;
  const fs::path next_to_us = executable_dir() / "python3";
  if (fs::exists(next_to_us, ec)) return next_to_us.string();
  if (fs::exists(KILN_PYTHON_DEFAULT, ec)) return KILN_PYTHON_DEFAULT;
  return "python3";
}

// Replaces this process with `python -c BOOTSTRAP args...`; returns only on failure.
[[noreturn]] void run_python_tool(const std::string& command, const std::string& module, std::vector<std::string> args) {
  std::error_code ec;
  const fs::path tree = executable_dir() / "python";
  if (fs::exists(tree / "kiln" / "__init__.py", ec)) {
    const char* old = std::getenv("PYTHONPATH");
    std::string path = tree.string() + (old && *old ? ":" + std::string(old) : "");
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  // The Python tools call back into this same executable (kiln compare runs kiln bench).
  std::error_code self_ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", self_ec);
  if (!self_ec) setenv("KILN_BIN", self.c_str(), 0);
  const std::string python = find_python();
  // A missing package is one clear line, not a traceback.
  const std::string bootstrap =
      "import sys\n"
      "try:\n"
      "    import kiln." + module + " as tool\n"
      "except ImportError as e:\n"
      "    sys.exit('kiln: error: kiln " + command + " needs the kiln Python package and its dependencies in ' + "
      "sys.executable + ' (pip install . in kiln\\'s source folder; set KILN_PYTHON to use another Python): ' + str(e))\n"
      "sys.argv = ['kiln " + command + "'] + sys.argv[1:]\n"
      "sys.exit(tool.main(sys.argv[1:]))\n";
  std::vector<std::string> argv_strings = {python, "-c", bootstrap};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  execvp(python.c_str(), argv.data());
  throw Error(ErrorKind::kIo, "kiln " + command + " runs in Python, and " + python + " could not be started")
      .hint("set KILN_PYTHON to a Python that has the kiln package (pip install .)");
}

void add_python_command(CLI::App& app, std::function<int()>& action, const std::string& name, const std::string& module,
                        const std::string& description) {
  CLI::App* cmd = app.add_subcommand(name, description + " (Python: kiln " + name + " --help)");
  cmd->prefix_command();  // every argument goes to the Python tool, --help included
  cmd->set_help_flag();
  cmd->callback([&action, cmd, name, module] {
    action = [cmd, name, module] {
      run_python_tool(name, module, cmd->remaining());
      return 1;
    };
  });
}

}  // namespace

void add_python_commands(CLI::App& app, std::function<int()>& action) {
  add_python_command(app, action, "export", "export",
                     "Export a PyTorch model (torchvision name or module:function) or a TensorFlow SavedModel to ONNX, "
                     "checked against the framework");
  add_python_command(app, action, "compare", "compare",
                     "Benchmark a model with PyTorch (eager fp32/fp16, torch.compile) and kiln (fp32/fp16/int8) "
                     "and write one results JSON");
  add_python_command(app, action, "report", "report", "Charts (PNG, SVG) and an HTML page from a results JSON");
  add_python_command(app, action, "check", "check",
                     "Run a model in kiln and in ONNX Runtime on the same inputs, compare every output, and name the "
                     "first layer that diverges");
  add_python_command(app, action, "debug", "debug",
                     "Shrink a failing model to a small subgraph that still fails, written as ONNX (kiln debug reduce); find "
                     "the fewest layers of an INT8/FP8 model to keep in float for a tolerance (kiln debug precision)");
  add_python_command(app, action, "serve", "serve",
                     "Serve models over the Open Inference Protocol (KServe v2 HTTP and gRPC; Triton's clients work) "
                     "with dynamic batching and metrics");
}

}  // namespace kiln::tools
