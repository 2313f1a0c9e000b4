#include "engine/engine_file.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "kiln/error.h"

namespace kiln::engine_file {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'G', '1'};

uint64_t fnv1a(const char* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 1099511628211ull;
  }
  return h;
}

template <class T> void put(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xFF));
}

class Reader {
 public:
  Reader(const std::string& bytes, const std::string& name) : bytes_(bytes), name_(name) {}
  template <class T> T get(const char* what) {
    need(sizeof(T), what);
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes_[pos_ + i])) << (8 * i);
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }
  std::string get_bytes(uint64_t n, const char* what) {
    need(n, what);
    std::string s = bytes_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  size_t pos() const { return pos_; }

 private:
  void need(uint64_t n, const char* what) {
    if (n > bytes_.size() - pos_)
      throw Error(ErrorKind::kInvalidModel, std::string("the engine file is truncated (in its ") + what + ")")
          .file(name_)
          .hint("rebuild it with kiln build");
  }
  const std::string& bytes_;
  const std::string& name_;
  size_t pos_ = 0;
};

}  // namespace

uint64_t checksum(const char* data, size_t n) { return fnv1a(data, n); }

void write(const std::string& path, const Contents& contents) {
  std::string out(kMagic, sizeof(kMagic));
  put<uint32_t>(out, kEngineFormatVersion);
  std::string header = contents.header.dump();
  put<uint64_t>(out, header.size());
  out += header;
  put<uint64_t>(out, contents.graph.size());
  out += contents.graph;
  put<uint64_t>(out, contents.weights.size());
  out += contents.weights;
  put<uint64_t>(out, fnv1a(out.data(), out.size()));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(ErrorKind::kIo, "cannot write the engine file").file(path);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  if (!f) throw Error(ErrorKind::kIo, "cannot write the engine file").file(path);
}

Contents parse(const std::string& bytes, const std::string& name) {
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    throw Error(ErrorKind::kInvalidModel, "not a kiln engine file (no KILNENG1 magic at its start)")
        .file(name)
        .hint("build one with: kiln build model.onnx -o model.engine");
  Reader r(bytes, name);
  r.get_bytes(sizeof(kMagic), "magic");
  uint32_t version = r.get<uint32_t>("format version");
  if (version != kEngineFormatVersion)
    throw Error(ErrorKind::kInvalidModel, "engine file format " + std::to_string(version) + " (" +
                                              (version < kEngineFormatVersion ? "older" : "newer") +
                                              "), this kiln reads format " + std::to_string(kEngineFormatVersion))
        .file(name)
        .hint("rebuild the engine from its ONNX model with this kiln (kiln build)");
  uint64_t header_size = r.get<uint64_t>("header size");
  std::string header = r.get_bytes(header_size, "header");
  uint64_t graph_size = r.get<uint64_t>("graph size");
  std::string graph = r.get_bytes(graph_size, "graph");
  uint64_t weights_size = r.get<uint64_t>("weights size");
  std::string weights = r.get_bytes(weights_size, "weights");
  const size_t checked = r.pos();
  uint64_t checksum = r.get<uint64_t>("checksum");
  if (checksum != fnv1a(bytes.data(), checked))
    throw Error(ErrorKind::kInvalidModel, "the engine file is corrupted (checksum mismatch)").file(name).hint("rebuild it with kiln build");
  if (r.pos() != bytes.size())
    throw Error(ErrorKind::kInvalidModel, "the engine file has " + std::to_string(bytes.size() - r.pos()) +
                                              " unexpected bytes after its checksum").file(name);
  Contents c;
  try {
    c.header = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kInvalidModel, std::string("the engine file's header is not valid JSON: ") + e.what()).file(name);
  }
  if (!c.header.is_object()) throw Error(ErrorKind::kInvalidModel, "the engine file's header is not a JSON object").file(name);
  c.graph = std::move(graph);
  c.weights = std::move(weights);
  return c;
}

Contents read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot open the engine file (does it exist?)").file(path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path);
}

}  // namespace kiln::engine_file
