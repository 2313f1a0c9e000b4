// kiln conformance DIR: runs ONNX backend test cases (DIR/**/model.onnx with
// test_data_set_*/input_*.pb and output_*.pb) through import, kiln's passes and the CPU
// engine, and compares with the expected outputs.
//
// Each case runs in a child process (fork), so that a crash or a hang in one kernel is
// reported as that case's failure instead of ending the run. The parent never runs a kernel
// itself, which keeps fork safe with OpenMP (the children start their own thread pools).
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>

#include "compiler/input_values.h"
#include "ir/parameter_inputs.h"
#include "ir/small_types.h"
#include "kiln/kiln.h"
#include "onnx/importer.h"
#include "tools/commands.h"
#include "tools/json_output.h"

namespace kiln::tools {

namespace fs = std::filesystem;

namespace {

struct ConformanceOptions {
  std::string dir;
  std::string json;
  std::string filter;
  bool verbose = false;
  bool no_fork = false;
  int timeout_s = 120;
  bool no_optimize = false;
  std::string device = "cpu";  // "cuda": the GPU engine, built per test data set at its shapes
  // GPU: nodes without a GPU layer run on the CPU engine (counted apart); off, they make the
  // case unsupported, and the count is the GPU's own layers'.
  bool allow_cpu_fallback = false;
};

struct Case {
  std::string name;  // path relative to DIR
  fs::path dir;
};

enum class Status { kPass, kFail, kUnsupported };
const char* status_name(Status s) {
  return s == Status::kPass ? "PASS" : s == Status::kFail ? "FAIL" : "UNSUPPORTED";
}

struct Result {
  Status status = Status::kPass;
  std::string reason;  // a PASS has one only when some of its nodes ran on the CPU engine (kCpuFallback)
};

constexpr const char* kCpuFallback = "cpu fallback: ";

constexpr double kRtol = 1e-3;
constexpr double kAtol = 1e-5;
// bfloat16 outputs: two units in the last place (8 significant bits), as onnx's own backend test
// runner compares them (onnx/backend/test/runner); 1e-3 is a quarter of one there, so a sum
// rounded at other points than the reference's fails it.
constexpr double kRtolBFloat16 = 1.0 / 64;

std::vector<Case> find_cases(const fs::path& root) {
  if (!fs::is_directory(root)) throw Error(ErrorKind::kIo, "'" + root.string() + "' is not a directory");
  std::vector<Case> cases;
  auto add = [&](const fs::path& dir) {
    std::string name = fs::relative(dir, root).generic_string();
    if (name == ".") name = dir.filename().string();
    cases.push_back({name, dir});
  };
  if (fs::exists(root / "model.onnx")) add(root);
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->is_directory() && it->path() != root && fs::exists(it->path() / "model.onnx")) add(it->path());
  }
  std::sort(cases.begin(), cases.end(), [](const Case& a, const Case& b) { return a.name < b.name; });
  return cases;
}

// Files named <prefix><index>.pb in a data set, ordered by index.
std::vector<fs::path> numbered_files(const fs::path& dir, const std::string& prefix) {
  std::vector<std::pair<long, fs::path>> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string f = e.path().filename().string();
    if (f.rfind(prefix, 0) != 0 || e.path().extension() != ".pb") continue;
    std::string digits = f.substr(prefix.size(), f.size() - prefix.size() - 3);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    found.emplace_back(std::stol(digits), e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [i, p] : found) out.push_back(p);
  return out;
}

std::string value_str(double v) { return fmt::format("{:.7g}", v); }

// "" when `got` matches `want`: same dtype and shape; floats within rtol/atol (kRtolBFloat16 for
// bfloat16; NaN matches NaN, infinities match themselves); integers and bools exactly.
std::string compare(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype()) return "dtype " + to_string(got.dtype()) + ", expected " + to_string(want.dtype());
  if (got.shape() != want.shape())
    return "shape [" + shape_to_string(got.shape()) + "], expected [" + shape_to_string(want.shape()) + "]";
  int64_t bad = 0, first_bad = -1;
  double worst = -1;
  int64_t worst_at = -1;
  // The float8 types and float4e2m1 compare as their values: within the tolerance only where
  // they are equal (their steps are 1/8 of the value or more).
  bool floats = is_float(want.dtype()) || is_small_float(want.dtype());
  const double rtol = want.dtype() == DType::kBFloat16 ? kRtolBFloat16 : kRtol;
  for (int64_t i = 0; i < want.numel(); ++i) {
    bool ok;
    double err = 0;
    if (floats) {
      double g = got.value_as_double(i), w = want.value_as_double(i);
      if (std::isnan(w) || std::isnan(g)) ok = std::isnan(w) && std::isnan(g);
      else if (std::isinf(w) || std::isinf(g)) ok = g == w;
      else {
        err = std::abs(g - w) - (kAtol + rtol * std::abs(w));
        ok = err <= 0;
      }
      if (!ok && !(err > 0)) err = INFINITY;  // NaN or infinity mismatches are the worst
    } else {
      ok = got.value_as_int(i) == want.value_as_int(i);
      err = ok ? 0 : 1;
    }
    if (!ok) {
      if (first_bad < 0) first_bad = i;
      ++bad;
      if (err > worst) { worst = err; worst_at = i; }
    }
  }
  if (bad == 0) return "";
  int64_t at = floats ? worst_at : first_bad;
  std::string got_s = floats ? value_str(got.value_as_double(at)) : std::to_string(got.value_as_int(at));
  std::string want_s = floats ? value_str(want.value_as_double(at)) : std::to_string(want.value_as_int(at));
  return fmt::format("{} of {} values differ; {} at index {}: got {}, expected {}", bad, want.numel(),
                     floats ? "worst" : "first", at, got_s, want_s);
}

// The test data of onnx <= 1.12 (Debian's libonnx-testdata) stores bfloat16 tensors as
// uint16 TensorProtos holding the bits. Read as the model declares: same bits, bfloat16.
Tensor as_declared(Tensor t, DType declared) {
  if (declared == DType::kBFloat16 && t.dtype() == DType::kUInt16) {
    Tensor b(DType::kBFloat16, t.shape());
    if (t.nbytes()) std::memcpy(b.raw(), t.raw(), t.nbytes());
    return b;
  }
  return t;
}

Result run_case(const Case& c, const ConformanceOptions& o) {
  auto classify = [](const Error& e, const std::string& stage) {
    return Result{e.kind() == ErrorKind::kUnsupported ? Status::kUnsupported : Status::kFail, stage + ": " + e.what()};
  };
  BuildOptions build;
  build.optimize = !o.no_optimize;
  const bool gpu = o.device == "cuda";
  if (gpu) build.device = Device::kCuda;
  build.allow_cpu_fallback = o.allow_cpu_fallback;
  std::optional<Engine> engine;
  std::string on_cpu;  // the nodes of a GPU engine that ran on the CPU engine
  std::vector<std::string> input_names, parameter_inputs;
  try {
    if (gpu) {
      // GPU engines have fixed shapes: learn the input names now, build per data set below, planned
      // for the data set's values of inputs that set parameters (a Reduce's axes, Resize's sizes).
      ir::Graph g = onnx_import::import_file((c.dir / "model.onnx").string());
      input_names = g.inputs;
      parameter_inputs = ir::parameter_inputs(g, compiler::kMaxInputValueElements);
    } else {
      engine.emplace(Engine::from_onnx((c.dir / "model.onnx").string(), build));
    }
  } catch (const Error& e) {
    return classify(e, "build");
  }
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(c.dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return {Status::kFail, "the case has no test_data_set_* directory"};

  for (const fs::path& set : sets) {
    std::string where = sets.size() > 1 ? set.filename().string() + ": " : "";
    std::vector<fs::path> in_files = numbered_files(set, "input_");
    std::vector<fs::path> out_files = numbered_files(set, "output_");
    if (gpu) {
      if (in_files.size() != input_names.size())
        return {Status::kFail, fmt::format("{}the test gives {} inputs, the model has {}", where, in_files.size(), input_names.size())};
      try {
        build.input_shapes.clear();
        build.input_values.clear();
        for (size_t i = 0; i < in_files.size(); ++i) {
          Tensor t = onnx_import::read_tensor_file(in_files[i].string());
          build.input_shapes[input_names[i]] = t.shape();
          if (std::find(parameter_inputs.begin(), parameter_inputs.end(), input_names[i]) != parameter_inputs.end())
            build.input_values[input_names[i]] = t;
        }
      } catch (const Error& e) {
        return classify(e, where + "reading test data");
      }
      try {
        engine.emplace(Engine::from_onnx((c.dir / "model.onnx").string(), build));
      } catch (const Error& e) {
        return classify(e, where + "build");
      }
    }
    const auto& ins = engine->inputs();
    const auto& outs = engine->outputs();
    if (in_files.size() != ins.size())
      return {Status::kFail, fmt::format("{}the test gives {} inputs, the model has {}", where, in_files.size(), ins.size())};
    if (out_files.size() != outs.size())
      return {Status::kFail, fmt::format("{}the test expects {} outputs, the model has {}", where, out_files.size(), outs.size())};
    std::map<std::string, Tensor> inputs;
    std::vector<Tensor> expected;
    try {
      for (size_t i = 0; i < in_files.size(); ++i)
        inputs[ins[i].name] = as_declared(onnx_import::read_tensor_file(in_files[i].string()), ins[i].dtype);
      for (size_t i = 0; i < out_files.size(); ++i)
        expected.push_back(as_declared(onnx_import::read_tensor_file(out_files[i].string()), outs[i].dtype));
    } catch (const Error& e) {
      return classify(e, where + "reading test data");
    }
    if (gpu)
      for (const LayerInfo& l : engine->info().layers)
        if (l.cpu_fallback && on_cpu.find(l.name + " (") == std::string::npos)
          on_cpu += (on_cpu.empty() ? "" : ", ") + l.name + " (" + l.op + ")";
    std::map<std::string, Tensor> got;
    try {
      got = engine->run(inputs);
    } catch (const Error& e) {
      return classify(e, where + "run");
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      std::string diff = compare(got.at(outs[i].name), expected[i]);
      if (!diff.empty()) return {Status::kFail, fmt::format("{}output {} '{}': {}", where, i, outs[i].name, diff)};
    }
  }
  if (!on_cpu.empty()) return {Status::kPass, kCpuFallback + on_cpu};
  return {};
}

// Any exception other than kiln::Error is a bug in kiln; report it as a failure.
Result run_case_guarded(const Case& c, const ConformanceOptions& o) {
  try {
    return run_case(c, o);
  } catch (const std::bad_alloc&) {
    return {Status::kFail, "out of memory"};
  } catch (const std::exception& e) {
    return {Status::kFail, std::string("internal error (not a kiln::Error): ") + e.what()};
  }
}

Result run_case_in_child(const Case& c, const ConformanceOptions& o) {
  int fds[2];
  if (pipe(fds) != 0) throw Error(ErrorKind::kInternal, std::string("pipe failed: ") + std::strerror(errno));
  std::cout.flush();
  std::cerr.flush();
  pid_t pid = fork();
  if (pid < 0) throw Error(ErrorKind::kInternal, std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    close(fds[0]);
    alarm(static_cast<unsigned>(o.timeout_s));
    Result r = run_case_guarded(c, o);
    std::string msg = std::to_string(static_cast<int>(r.status)) + "\n" + r.reason;
    size_t done = 0;
    while (done < msg.size()) {
      ssize_t n = write(fds[1], msg.data() + done, msg.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string msg;
  char buf[4096];
  while (true) {
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    msg.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    if (sig == SIGALRM) return {Status::kFail, fmt::format("timed out after {} s", o.timeout_s)};
    return {Status::kFail, fmt::format("crashed with signal {} ({})", sig, strsignal(sig))};
  }
  size_t nl = msg.find('\n');
  if (nl == std::string::npos) return {Status::kFail, "the case's process exited without a result"};
  return {static_cast<Status>(std::stoi(msg.substr(0, nl))), msg.substr(nl + 1)};
}

// GPU cases run in one long-lived worker process (a process per case would pay CUDA's
// start-up each time): the worker runs cases from `first` on and writes one result per case;
// when it crashes or times out, the case it was on fails and a new worker takes the next.
void run_cases_in_workers(const std::vector<Case>& cases, const ConformanceOptions& o,
                          const std::function<void(size_t, const Result&)>& report) {
  size_t next = 0;
  while (next < cases.size()) {
    int fds[2];
    if (pipe(fds) != 0) throw Error(ErrorKind::kInternal, std::string("pipe failed: ") + std::strerror(errno));
    std::cout.flush();
    std::cerr.flush();
    pid_t pid = fork();
    if (pid < 0) throw Error(ErrorKind::kInternal, std::string("fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      close(fds[0]);
      for (size_t i = next; i < cases.size(); ++i) {
        alarm(static_cast<unsigned>(o.timeout_s));
        Result r = run_case_guarded(cases[i], o);
        std::string body = std::to_string(static_cast<int>(r.status)) + "\n" + r.reason;
        std::string msg = std::to_string(body.size()) + "\n" + body;
        size_t done = 0;
        while (done < msg.size()) {
          ssize_t n = write(fds[1], msg.data() + done, msg.size() - done);
          if (n <= 0) _exit(1);
          done += static_cast<size_t>(n);
        }
      }
      _exit(0);
    }
    close(fds[1]);
    std::string buffer;
    char buf[4096];
    auto take_results = [&] {
      while (true) {
        size_t nl = buffer.find('\n');
        if (nl == std::string::npos) return;
        size_t len = std::stoul(buffer.substr(0, nl));
        if (buffer.size() < nl + 1 + len) return;
        std::string body = buffer.substr(nl + 1, len);
        buffer.erase(0, nl + 1 + len);
        size_t bl = body.find('\n');
        report(next, Result{static_cast<Status>(std::stoi(body.substr(0, bl))), body.substr(bl + 1)});
        ++next;
      }
    };
    while (true) {
      ssize_t n = read(fds[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      buffer.append(buf, static_cast<size_t>(n));
      take_results();
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (next < cases.size() && (WIFSIGNALED(status) || WEXITSTATUS(status) != 0)) {
      int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      Result r{Status::kFail, sig == SIGALRM ? fmt::format("timed out after {} s", o.timeout_s)
                              : sig ? fmt::format("crashed with signal {} ({})", sig, strsignal(sig))
                                    : "the worker process exited without a result"};
      report(next, r);
      ++next;
    }
  }
}

std::string one_line(std::string s, size_t max) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

int conformance(const ConformanceOptions& o) {
  const JsonOutput json(o.json);
  std::vector<Case> cases = find_cases(o.dir);
  if (!o.filter.empty()) {
    std::regex re;
    try {
      re = std::regex(o.filter);
    } catch (const std::regex_error& e) {
      throw Error(ErrorKind::kInvalidArgument, "--filter '" + o.filter + "' is not a valid regular expression: " + e.what());
    }
    cases.erase(std::remove_if(cases.begin(), cases.end(), [&](const Case& c) { return !std::regex_search(c.name, re); }),
                cases.end());
  }
  if (cases.empty())
    throw Error(ErrorKind::kInvalidArgument, "no test cases (directories with model.onnx) under '" + o.dir + "'" +
                                                 (o.filter.empty() ? "" : " match --filter '" + o.filter + "'"));
  int counts[3] = {0, 0, 0};
  int pass_on_cpu = 0;  // GPU passes with some nodes on the CPU engine
  nlohmann::json results = nlohmann::json::array();
  auto report = [&](size_t i, const Result& r) {
    const Case& c = cases[i];
    ++counts[static_cast<int>(r.status)];
    if (r.status == Status::kPass && r.reason.rfind(kCpuFallback, 0) == 0) ++pass_on_cpu;
    std::cout << status_name(r.status) << " " << c.name;
    if (!r.reason.empty()) std::cout << ": " << (o.verbose ? r.reason : one_line(r.reason, 200));
    std::cout << std::endl;
    results.push_back({{"name", c.name}, {"status", status_name(r.status)}, {"reason", r.reason}});
  };
  if (o.device == "cuda" && !o.no_fork) {
    run_cases_in_workers(cases, o, report);
  } else {
    for (size_t i = 0; i < cases.size(); ++i)
      report(i, o.no_fork ? run_case_guarded(cases[i], o) : run_case_in_child(cases[i], o));
  }
  int total = static_cast<int>(cases.size());
  std::cout << fmt::format("\n{} cases: {} passed, {} failed, {} unsupported ({:.1f}% pass)\n", total, counts[0], counts[1],
                           counts[2], 100.0 * counts[0] / total);
  if (o.allow_cpu_fallback && o.device == "cuda")
    std::cout << fmt::format("{} of the {} passed with some nodes on the CPU engine, {} on the GPU's own layers alone\n",
                             pass_on_cpu, counts[0], counts[0] - pass_on_cpu);
  nlohmann::json summary = {{"dir", o.dir}, {"device", o.device}, {"filter", o.filter}, {"total", total}, {"pass", counts[0]},
                            {"fail", counts[1]}, {"unsupported", counts[2]}, {"rtol", kRtol}, {"rtol_bfloat16", kRtolBFloat16}, {"atol", kAtol},
                            {"allow_cpu_fallback", o.allow_cpu_fallback}, {"pass_with_cpu_fallback", pass_on_cpu},
                            {"cases", results}};
  if (json.wanted()) {
    json.write(summary);
  } else {
    std::cout << summary.dump() << "\n";
  }
  return counts[1] == 0 ? 0 : 1;
}

}  // namespace

void add_conformance_command(CLI::App& app, std::function<int()>& action) {
  auto o = std::make_shared<ConformanceOptions>();
  CLI::App* cmd = app.add_subcommand("conformance", "Run ONNX backend test cases and compare with their expected outputs");
  cmd->add_option("dir", o->dir, "Directory searched recursively for test cases (e.g. /usr/share/libonnx-testdata/data/node)")
      ->required();
  cmd->add_option("--json", o->json, "Write the JSON summary to FILE, or - for standard output alone (default: printed last on stdout)");
  cmd->add_option("--filter", o->filter, "Only cases whose name matches this regular expression (ECMAScript, searched)");
  cmd->add_flag("-v,--verbose", o->verbose, "Print full failure reasons");
  cmd->add_option("--timeout", o->timeout_s, "Seconds one case may take before it counts as failed")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag("--no-fork", o->no_fork, "Run cases in this process (for debuggers; a crash then ends the run)");
  cmd->add_flag("--no-optimize", o->no_optimize, "Skip kiln's graph passes");
  cmd->add_option("--device", o->device, "cpu, or cuda: the GPU engine (fp32), built for each test data set's shapes")
      ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--allow-cpu-fallback", o->allow_cpu_fallback,
                "With --device cuda: nodes without a GPU layer run on the CPU engine, as GPU builds do by default, and "
                "such passes are counted apart (without it they are unsupported: the count is the GPU's own layers')");
  cmd->callback([o, &action] { action = [o] { return conformance(*o); }; });
}

}  // namespace kiln::tools
