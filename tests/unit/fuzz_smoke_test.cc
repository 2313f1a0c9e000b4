// A bounded, deterministic fuzz run that every build runs (the libFuzzer targets in fuzz/
// need clang): mutate seed models and .npy files with a fixed seed for a fixed number of
// iterations, and check that kiln never crashes and that every failure is a kiln::Error other
// than kInternal (which would be a bug in kiln).
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <csignal>
#include <cstring>
#include <unistd.h>
#include <random>
#include <sstream>

#include "../../fuzz/exercise.h"
#include "../../fuzz/graph_generator.h"
#include "onnx.pb.h"
#include "io/idx.h"
#include "calibration/calibration_cache.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

void add_input(onnx::GraphProto& g, const std::string& name, int elem_type, const std::vector<std::string>& dims) {
  onnx::ValueInfoProto* v = g.add_input();
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem_type);
  for (const std::string& d : dims) {
    auto* dim = t->mutable_shape()->add_dim();
    if (std::isdigit(static_cast<unsigned char>(d[0]))) dim->set_dim_value(std::stoll(d));
    else dim->set_dim_param(d);
  }
}

onnx::NodeProto* add_node(onnx::GraphProto& g, const std::string& op, std::vector<std::string> ins, std::vector<std::string> outs) {
  onnx::NodeProto* n = g.add_node();
  n->set_op_type(op);
  n->set_name(op + "_" + std::to_string(g.node_size()));
  for (auto& i : ins) n->add_input(i);
  for (auto& o : outs) n->add_output(o);
  return n;
}

void add_float_init(onnx::GraphProto& g, const std::string& name, std::vector<int64_t> dims, float start) {
  onnx::TensorProto* t = g.add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  int64_t n = 1;
  for (int64_t d : dims) { t->add_dims(d); n *= d; }
  for (int64_t i = 0; i < n; ++i) t->add_float_data(start + 0.25f * static_cast<float>(i % 7));
}

void add_int_init(onnx::GraphProto& g, const std::string& name, std::vector<int64_t> values) {
  onnx::TensorProto* t = g.add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<int64_t>(values.size()));
  for (int64_t v : values) t->add_int64_data(v);
}

onnx::ModelProto new_model(int opset) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(opset);
  m.mutable_graph()->set_name("seed");
  return m;
}

void set_attr_int(onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void set_attr_ints(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

// Seeds that reach different parts of kiln: a small CNN, shape arithmetic, elementwise ops
// with broadcasting and integer tensors.
std::vector<onnx::ModelProto> seed_models() {
  std::vector<onnx::ModelProto> seeds;
  {
    onnx::ModelProto m = new_model(17);
    auto& g = *m.mutable_graph();
    add_input(g, "x", onnx::TensorProto::FLOAT, {"N", "3", "8", "8"});
    add_float_init(g, "w", {4, 3, 3, 3}, -0.5f);
    add_float_init(g, "b", {4}, 0.1f);
    auto* conv = add_node(g, "Conv", {"x", "w", "b"}, {"c"});
    set_attr_ints(conv, "pads", {1, 1, 1, 1});
    set_attr_ints(conv, "kernel_shape", {3, 3});
    add_node(g, "Relu", {"c"}, {"r"});
    auto* pool = add_node(g, "MaxPool", {"r"}, {"p"});
    set_attr_ints(pool, "kernel_shape", {2, 2});
    set_attr_ints(pool, "strides", {2, 2});
    auto* flat = add_node(g, "Flatten", {"p"}, {"f"});
    set_attr_int(flat, "axis", 1);
    add_float_init(g, "fc_w", {5, 64}, -1.0f);
    add_float_init(g, "fc_b", {5}, 0.0f);
    auto* gemm = add_node(g, "Gemm", {"f", "fc_w", "fc_b"}, {"logits"});
    set_attr_int(gemm, "transB", 1);
    add_node(g, "Softmax", {"logits"}, {"y"});
    g.add_output()->set_name("y");
    seeds.push_back(m);
  }
  {
    onnx::ModelProto m = new_model(13);
    auto& g = *m.mutable_graph();
    add_input(g, "x", onnx::TensorProto::FLOAT, {"B", "6"});
    add_node(g, "Shape", {"x"}, {"s"});
    add_int_init(g, "zero", {0});
    auto* gather = add_node(g, "Gather", {"s", "zero"}, {"batch"});
    set_attr_int(gather, "axis", 0);
    add_int_init(g, "rest", {2, 3});
    auto* cat = add_node(g, "Concat", {"batch", "rest"}, {"shape"});
    set_attr_int(cat, "axis", 0);
    add_node(g, "Reshape", {"x", "shape"}, {"r"});
    add_int_init(g, "perm_axes", {1});
    add_node(g, "Unsqueeze", {"r", "perm_axes"}, {"u"});
    auto* t = add_node(g, "Transpose", {"u"}, {"t"});
    set_attr_ints(t, "perm", {0, 3, 2, 1});
    add_int_init(g, "axes", {1});
    add_node(g, "ReduceSum", {"t", "axes"}, {"y"});
    g.add_output()->set_name("y");
    seeds.push_back(m);
  }
  {
    onnx::ModelProto m = new_model(11);
    auto& g = *m.mutable_graph();
    add_input(g, "a", onnx::TensorProto::FLOAT, {"2", "1", "4"});
    add_input(g, "b", onnx::TensorProto::FLOAT, {"3", "1"});
    add_input(g, "i", onnx::TensorProto::INT64, {"4"});
    add_node(g, "Add", {"a", "b"}, {"s"});
    add_node(g, "Mul", {"s", "a"}, {"m"});
    add_node(g, "Sigmoid", {"m"}, {"sg"});
    auto* clip = add_node(g, "Clip", {"sg"}, {"c"});
    auto* a = clip->add_attribute();
    a->set_name("min");
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(0.2f);
    add_node(g, "Cast", {"i"}, {"fi"})->add_attribute()->CopyFrom([] {
      onnx::AttributeProto to;
      to.set_name("to");
      to.set_type(onnx::AttributeProto::INT);
      to.set_i(onnx::TensorProto::FLOAT);
      return to;
    }());
    add_node(g, "Sub", {"c", "fi"}, {"y"});
    add_node(g, "Equal", {"i", "i"}, {"eq"});
    g.add_output()->set_name("y");
    g.add_output()->set_name("eq");
    seeds.push_back(m);
  }
  return seeds;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Sixty models of the ONNX backend tests, when the Debian package is installed: many op
// types and attribute forms that the hand-made seeds lack. Only models kiln imports are
// taken (most older-opset ones are refused at once and would teach the fuzzer nothing).
std::vector<std::string> test_data_seeds(std::vector<std::string>& names) {
  std::vector<std::string> usable, usable_names;
  fs::path dir = "/usr/share/libonnx-testdata/data/node";
  if (!fs::is_directory(dir)) return usable;
  std::vector<fs::path> cases;
  for (const auto& e : fs::directory_iterator(dir)) cases.push_back(e.path());
  std::sort(cases.begin(), cases.end());
  for (const fs::path& c : cases) {
    if (!fs::exists(c / "model.onnx")) continue;
    std::string bytes = read_file(c / "model.onnx");
    try {
      onnx_import::import_bytes(bytes, c.filename().string(), "");
      usable.push_back(std::move(bytes));
      usable_names.push_back(c.filename().string());
    } catch (const Error&) {
    }
  }
  std::vector<std::string> out;
  const size_t kWanted = 60;
  for (size_t i = 0; i < kWanted && i < usable.size(); ++i) {
    size_t at = i * usable.size() / std::min(kWanted, usable.size());
    out.push_back(usable[at]);
    names.push_back(usable_names[at]);
  }
  return out;
}

// Byte-level mutations: what a corrupted or truncated file looks like.
std::string mutate_bytes(std::string s, std::mt19937& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int rounds = 1 + static_cast<int>(pick(4));
  for (int r = 0; r < rounds; ++r) {
    switch (pick(6)) {
      case 0:
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1 << pick(8));
        break;
      case 1: {
        const unsigned char interesting[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0x08, 0x10, 0x3f};
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(interesting[pick(sizeof interesting)]);
        break;
      }
      case 2:
        s.resize(pick(s.size() + 1));
        break;
      case 3: {
        size_t at = pick(s.size() + 1);
        s.insert(at, 1 + pick(8), static_cast<char>(pick(256)));
        break;
      }
      case 4:
        if (!s.empty()) {
          size_t at = pick(s.size());
          s.erase(at, 1 + pick(std::min<size_t>(16, s.size() - at)));
        }
        break;
      case 5:
        if (!s.empty()) {
          size_t from = pick(s.size());
          size_t len = 1 + pick(std::min<size_t>(32, s.size() - from));
          s.insert(pick(s.size() + 1), s.substr(from, len));
        }
        break;
    }
  }
  return s;
}

// Structural mutations: a well-formed protobuf whose content is wrong in one place, which
// gets past the parser and reaches the importer, the schemas and the kernels.
std::string mutate_model(onnx::ModelProto m, std::mt19937& rng) {
  auto pick = [&](int n) { return n <= 0 ? 0 : std::uniform_int_distribution<int>(0, n - 1)(rng); };
  const int64_t odd_values[] = {-1, 0, 1, 2, 3, -2, 7, 1 << 20, int64_t{1} << 40, INT64_MAX, INT64_MIN};
  auto odd = [&] { return odd_values[pick(sizeof odd_values / sizeof odd_values[0])]; };
  onnx::GraphProto& g = *m.mutable_graph();
  int rounds = 1 + pick(3);
  for (int r = 0; r < rounds; ++r) {
    switch (pick(10)) {
      case 0:  // an input dimension
        if (g.input_size()) {
          auto* shape = g.mutable_input(pick(g.input_size()))->mutable_type()->mutable_tensor_type()->mutable_shape();
          if (shape->dim_size()) shape->mutable_dim(pick(shape->dim_size()))->set_dim_value(odd());
          else shape->add_dim()->set_dim_value(odd());
        }
        break;
      case 1:  // an integer attribute or one element of an ints attribute
        if (g.node_size()) {
          auto* n = g.mutable_node(pick(g.node_size()));
          if (n->attribute_size()) {
            auto* a = n->mutable_attribute(pick(n->attribute_size()));
            if (a->ints_size()) a->set_ints(pick(a->ints_size()), odd());
            else if (pick(4) == 0) a->add_ints(odd());
            else a->set_i(odd());
          }
        }
        break;
      case 2:  // drop or blank an input of a node
        if (g.node_size()) {
          auto* n = g.mutable_node(pick(g.node_size()));
          if (n->input_size()) {
            if (pick(2)) n->mutable_input()->RemoveLast();
            else n->set_input(pick(n->input_size()), pick(2) ? "" : "no_such_value");
          }
        }
        break;
      case 3:  // the op type of another node
        if (g.node_size() > 1) g.mutable_node(pick(g.node_size()))->set_op_type(g.node(pick(g.node_size())).op_type());
        break;
      case 4:  // the opset
        m.mutable_opset_import(0)->set_version(pick(32));
        break;
      case 5:  // an initializer's dims no longer match its data
        if (g.initializer_size()) {
          auto* t = g.mutable_initializer(pick(g.initializer_size()));
          if (t->dims_size()) t->set_dims(pick(t->dims_size()), odd());
          else t->add_dims(odd());
        }
        break;
      case 6:  // a data type code
        if (g.initializer_size() && pick(2)) g.mutable_initializer(pick(g.initializer_size()))->set_data_type(pick(22));
        else if (g.input_size()) g.mutable_input(pick(g.input_size()))->mutable_type()->mutable_tensor_type()->set_elem_type(pick(22));
        break;
      case 7:  // two nodes swap places (breaks topological order)
        if (g.node_size() > 1) g.mutable_node()->SwapElements(pick(g.node_size()), pick(g.node_size()));
        break;
      case 8:  // an output name reused (two producers of one value)
        if (g.node_size() > 1) {
          auto* n = g.mutable_node(pick(g.node_size()));
          const auto& other = g.node(pick(g.node_size()));
          if (n->output_size() && other.output_size()) n->set_output(0, other.output(0));
        }
        break;
      case 9:  // a rank change of an input
        if (g.input_size()) {
          auto* shape = g.mutable_input(pick(g.input_size()))->mutable_type()->mutable_tensor_type()->mutable_shape();
          if (shape->dim_size() && pick(2)) shape->mutable_dim()->RemoveLast();
          else shape->add_dim()->set_dim_value(1 + pick(3));
        }
        break;
    }
  }
  return m.SerializeAsString();
}

// A crash cannot be caught, but it can say which input caused it before the process dies.
char g_current_input[256] = "";
extern "C" void report_crash(int sig) {
  const char prefix[] = "\nfuzz smoke test crashed on ";
  ssize_t ignored = write(2, prefix, sizeof prefix - 1);
  ignored = write(2, g_current_input, strnlen(g_current_input, sizeof g_current_input));
  ignored = write(2, "\n", 1);
  (void)ignored;
  signal(sig, SIG_DFL);
  raise(sig);
}
void describe_input(const std::string& text) {
  snprintf(g_current_input, sizeof g_current_input, "%s", text.c_str());
}
struct CrashReporter {
  CrashReporter() { for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL}) signal(sig, report_crash); }
  ~CrashReporter() { for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL}) signal(sig, SIG_DFL); }
};

// What went wrong across a fuzz run, by message, with the first iteration that showed it.
struct Findings {
  int errors = 0;  // inputs rejected with a kiln::Error a user can cause: the good outcome
  std::map<std::string, int> bugs;

  // Runs one input; returns true if it completed (for models: ran).
  template <class Fn>
  bool survive(Fn fn, const std::string& what, int iteration) {
    try {
      return fn();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInternal) {
        ++errors;
        return false;
      }
      bugs.emplace(what + ": kiln::Error of kind internal: " + e.what(), iteration);
    } catch (const std::exception& e) {
      bugs.emplace(what + ": an exception that is not a kiln::Error: " + e.what(), iteration);
    }
    return false;
  }
  std::string report() const {
    std::string out;
    for (const auto& [message, iteration] : bugs) out += "  first at iteration " + std::to_string(iteration) + ": " + message + "\n";
    return out;
  }
};

uint32_t env_or(const char* name, uint32_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? static_cast<uint32_t>(std::strtoul(v, nullptr, 10)) : fallback;
}

// Models that break ONNX's one-producer rule (what fuzz_onnx_import built: two Dropouts writing
// each other's input, one of them over a graph input) are refused at import, naming the value.
TEST(FuzzSmoke, ValuesWithTwoProducersAreRefusedAtImport) {
  auto import_error = [](const onnx::ModelProto& m) -> std::string {
    try {
      onnx_import::import_bytes(m.SerializeAsString(), "twice.onnx", ".");
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel) << e.what();
      return e.what();
    }
    return "imported";
  };
  auto base = [] {
    onnx::ModelProto m = new_model(17);
    add_input(*m.mutable_graph(), "x", onnx::TensorProto::FLOAT, {"2"});
    return m;
  };
  {
    onnx::ModelProto m = base();
    add_node(*m.mutable_graph(), "Relu", {"x"}, {"x"});
    m.mutable_graph()->add_output()->set_name("x");
    EXPECT_NE(import_error(m).find("output 'x' overwrites a graph input"), std::string::npos) << import_error(m);
  }
  {
    onnx::ModelProto m = base();
    add_node(*m.mutable_graph(), "Relu", {"x"}, {"y"});
    add_node(*m.mutable_graph(), "Neg", {"x"}, {"y"});
    m.mutable_graph()->add_output()->set_name("y");
    EXPECT_NE(import_error(m).find("output 'y' is also produced by node 'Relu_1'"), std::string::npos) << import_error(m);
  }
  {
    onnx::ModelProto m = base();
    add_node(*m.mutable_graph(), "Relu", {"x"}, {"y"});
    m.mutable_graph()->add_output()->set_name("y");
    m.mutable_graph()->add_output()->set_name("y");
    EXPECT_NE(import_error(m).find("graph output 'y' is listed twice"), std::string::npos) << import_error(m);
  }
  {  // and the well-formed one imports
    onnx::ModelProto m = base();
    add_node(*m.mutable_graph(), "Relu", {"x"}, {"y"});
    m.mutable_graph()->add_output()->set_name("y");
    EXPECT_EQ(import_error(m), "imported");
  }
}

TEST(FuzzSmoke, MutatedModelsFailOnlyWithKilnErrors) {
  CrashReporter reporter;
  std::vector<std::string> seeds, names = {"seed cnn", "seed shape chain", "seed elementwise"};
  std::vector<onnx::ModelProto> protos = seed_models();
  for (const auto& m : protos) seeds.push_back(m.SerializeAsString());
  for (std::string& s : test_data_seeds(names)) {
    onnx::ModelProto m;
    m.ParseFromString(s);  // it imported, so it parses
    protos.push_back(m);
    seeds.push_back(std::move(s));
  }
  // Fixed by default so CI is reproducible; KILN_FUZZ_SMOKE_SEED / _ITERATIONS explore further.
  std::mt19937 rng(env_or("KILN_FUZZ_SMOKE_SEED", 20240601));
  const int kIterations = static_cast<int>(env_or("KILN_FUZZ_SMOKE_ITERATIONS", 10000));
  Findings f;
  int ran = 0;
  for (int i = 0; i < kIterations; ++i) {
    size_t seed = static_cast<size_t>(i / 2) % seeds.size();
    std::string bytes = i % 2 == 0 ? mutate_bytes(seeds[seed], rng) : mutate_model(protos[seed], rng);
    describe_input("iteration " + std::to_string(i) + ": " + (i % 2 ? "structural" : "byte") + " mutation of " + names[seed]);
    ran += f.survive([&] { return fuzz::exercise_model(bytes); }, names[seed], i);
  }
  EXPECT_TRUE(f.bugs.empty()) << f.bugs.size() << " kind(s) of failure that are bugs in kiln:\n" << f.report();
  // The mutations must be mild enough that some models still run, or the kernels are not
  // being fuzzed at all, and strong enough that most are rejected.
  EXPECT_GT(ran, 0);
  EXPECT_GT(f.errors, kIterations / 4);
  std::cout << "fuzz smoke: " << kIterations << " models, " << f.errors << " rejected with kiln::Error, " << ran << " ran\n";
}

// The graph fuzzer's generator (fuzz/graph_generator.h) with its choices drawn from a seeded
// generator instead of libFuzzer's bytes: well-formed random models through import, passes and
// the CPU engine. Most must run, or the generator has stopped making models kiln accepts.
struct RandomChoices {
  std::mt19937_64 rng;
  template <class T>
  T ConsumeIntegralInRange(T lo, T hi) { return std::uniform_int_distribution<T>(lo, hi)(rng); }
};

TEST(FuzzSmoke, GeneratedGraphsFailOnlyWithKilnErrors) {
  CrashReporter reporter;
  RandomChoices choices{std::mt19937_64(env_or("KILN_FUZZ_SMOKE_SEED", 20240601))};
  const int kModels = static_cast<int>(env_or("KILN_FUZZ_SMOKE_ITERATIONS", 3000));
  Findings f;
  int ran = 0;
  for (int i = 0; i < kModels; ++i) {
    describe_input("generated graph " + std::to_string(i));
    ran += f.survive([&] {
      onnx::ModelProto model = fuzz::GraphGenerator<RandomChoices>(choices).generate();
      return fuzz::exercise_model(model.SerializeAsString());
    }, "generated graph", i);
  }
  EXPECT_TRUE(f.bugs.empty()) << f.bugs.size() << " kind(s) of failure that are bugs in kiln:\n" << f.report();
  EXPECT_GT(ran, kModels / 5);
  std::cout << "generated graphs: " << kModels << " models, " << f.errors << " rejected with kiln::Error, " << ran << " ran\n";
}

// CPU engine files of small models, mutated bytewise, loaded with the checksum as mutated (the
// check must catch it) and fixed up (the header, options and model behind it get fuzzed).
TEST(FuzzSmoke, MutatedEngineFilesFailOnlyWithKilnErrors) {
  std::vector<std::string> seeds;
  for (const char* model : {"tests/data/softmax_opset11_axis1.onnx", "tests/data/symbolic_div_reshape.onnx"}) {
    const fs::path path = fs::path(KILN_SOURCE_DIR) / model;
    const fs::path saved = fs::temp_directory_path() / (path.stem().string() + "_smoke.engine");
    Engine::from_onnx(path.string()).save(saved.string());
    seeds.push_back(read_file(saved));
    fs::remove(saved);
  }
  std::mt19937 rng(7);
  CrashReporter reporter;
  Findings f;
  int loaded = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string bytes = mutate_bytes(seeds[static_cast<size_t>(i) % seeds.size()], rng);
    const bool fix = i % 2 == 1;
    describe_input("engine file iteration " + std::to_string(i) + (fix ? " (checksum fixed)" : ""));
    loaded += f.survive([&] { return fuzz::exercise_engine_file(bytes, fix); }, "engine", i);
  }
  EXPECT_TRUE(f.bugs.empty()) << f.report();
  EXPECT_GT(loaded, 0);       // some mutations (in names, say) still load
  EXPECT_GT(f.errors, 750);   // every unfixed one fails its checksum, and more
}

TEST(FuzzSmoke, MutatedNpyFilesFailOnlyWithKilnErrors) {
  std::vector<std::string> seeds = {
      io::to_npy(Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6})),
      io::to_npy(Tensor::from_vector<int64_t>({4}, {1, -2, 3, -4})),
      io::to_npy(Tensor::from_vector<bool>({}, {true})),
      io::to_npy(Tensor::from_vector<uint8_t>({0, 3}, {})),
  };
  std::mt19937 rng(99);
  CrashReporter reporter;
  Findings f;
  int ok = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string bytes = mutate_bytes(seeds[static_cast<size_t>(i) % seeds.size()], rng);
    describe_input("npy iteration " + std::to_string(i));
    ok += f.survive([&] { fuzz::exercise_npy(bytes); return true; }, "npy", i);
  }
  EXPECT_TRUE(f.bugs.empty()) << f.report();
  EXPECT_GT(ok, 0);
  EXPECT_GT(f.errors, 0);
}

TEST(FuzzSmoke, MutatedCalibrationCachesFailOnlyWithKilnErrors) {
  calibration::CalibrationCache cache;
  cache.model_fingerprint = calibration::model_fingerprint("m");
  cache.algorithm = "entropy";
  cache.batches = 4;
  cache.scales = {{"input", 0.02f}, {"/conv1/Relu_output_0", 0.5f}, {"a: b", 1e-6f}};
  std::vector<std::string> seeds = {calibration::to_kiln_text(cache), calibration::to_tensorrt_text(cache)};
  std::mt19937 rng(7);
  CrashReporter reporter;
  Findings f;
  int ok = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string bytes = mutate_bytes(seeds[static_cast<size_t>(i) % seeds.size()], rng);
    describe_input("calibration cache iteration " + std::to_string(i));
    ok += f.survive([&] { return !calibration::parse_calibration_cache(bytes, "fuzz").scales.empty(); }, "cache", i);
  }
  EXPECT_TRUE(f.bugs.empty()) << f.report();
  EXPECT_GT(ok, 0);
  EXPECT_GT(f.errors, 0);
}

TEST(FuzzSmoke, MutatedIdxFilesFailOnlyWithKilnErrors) {
  // Seeds: a plain image file (2 x 3 x 4), a label file, and the image file gzipped.
  std::string images = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4};
  for (int i = 0; i < 24; ++i) images.push_back(static_cast<char>(i * 11));
  const std::string labels = {0, 0, 8, 1, 0, 0, 0, 5, 1, 2, 3, 4, 5};
  const std::string path = (fs::temp_directory_path() / ("kiln_fuzz_idx_" + std::to_string(::getpid()))).string();
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  gzwrite(gz, images.data(), static_cast<unsigned>(images.size()));
  gzclose(gz);
  std::ifstream in(path, std::ios::binary);
  std::stringstream gzipped;
  gzipped << in.rdbuf();
  std::vector<std::string> seeds = {images, labels, gzipped.str()};
  std::mt19937 rng(13);
  CrashReporter reporter;
  Findings f;
  int ok = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = mutate_bytes(seeds[static_cast<size_t>(i) % seeds.size()], rng);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    describe_input("idx iteration " + std::to_string(i));
    ok += f.survive([&] { return io::read_idx(path).numel() >= 0; }, "idx", i);
  }
  fs::remove(path);
  EXPECT_TRUE(f.bugs.empty()) << f.report();
  EXPECT_GT(ok, 0);
  EXPECT_GT(f.errors, 0);
}

}  // namespace
}  // namespace kiln
