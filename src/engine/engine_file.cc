#include "engine/engine_file.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "ir/hash.h"
#include "kiln/error.h"

namespace kiln::engine_file {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'G', '1'};

using ir::fnv1a;

template <class T> void put(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xFF));
}

// Where an engine file's bytes come from: the file itself, read section by section into the
// strings that keep them (a large engine's weights are copied once, not through a whole-file
// buffer), or bytes already in memory (the fuzzer's).
class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t remaining() const = 0;
  // Copies the next n bytes (n <= remaining()) to `to`.
  virtual void take(char* to, size_t n) = 0;
};

class MemorySource final : public Source {
 public:
  explicit MemorySource(const std::string& bytes) : bytes_(bytes) {}
  uint64_t remaining() const override { return bytes_.size() - pos_; }
  void take(char* to, size_t n) override {
    std::memcpy(to, bytes_.data() + pos_, n);
    pos_ += n;
  }

 private:
  const std::string& bytes_;
  size_t pos_ = 0;
};

class FileSource final : public Source {
 public:
  explicit FileSource(const std::string& path) : path_(path), file_(path, std::ios::binary) {
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (!file_ || ec || !std::filesystem::is_regular_file(path, ec))
      throw Error(ErrorKind::kIo, "cannot open the engine file (does it exist, and is it a file?)").file(path);
    remaining_ = size;
  }
  uint64_t remaining() const override { return remaining_; }
  void take(char* to, size_t n) override {
    if (!file_.read(to, static_cast<std::streamsize>(n)))
      throw Error(ErrorKind::kIo, "cannot read the engine file (did it change while it was read?)").file(path_);
    remaining_ -= n;
  }

 private:
  const std::string& path_;
  std::ifstream file_;
  uint64_t remaining_ = 0;
};

// Reads the fields in order, checking each size against the bytes left before allocating, and
// keeps the checksum of every byte read.
class Reader {
 public:
  Reader(Source& source, const std::string& name) : source_(source), name_(name) {}
  template <class T> T get(const char* what) {
    unsigned char b[sizeof(T)];
    take(reinterpret_cast<char*>(b), sizeof(T), what);
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
    return static_cast<T>(v);
  }
  std::string get_bytes(uint64_t n, const char* what) {
    need(n, what);
    std::string s(static_cast<size_t>(n), '\0');
    take(s.data(), s.size(), what);
    return s;
  }
  uint64_t checksum() const { return hash_; }
  uint64_t remaining() const { return source_.remaining(); }

 private:
  void need(uint64_t n, const char* what) {
    if (n > source_.remaining())
      throw Error(ErrorKind::kInvalidModel, std::string("the engine file is truncated (in its ") + what + ")")
          .file(name_)
          .hint("rebuild it with kiln build");
  }
  void take(char* to, size_t n, const char* what) {
    need(n, what);
    source_.take(to, n);
    hash_ = fnv1a(to, n, hash_);
  }
  Source& source_;
  const std::string& name_;
  uint64_t hash_ = ir::kFnv1aOffset;
};

void check_magic(Reader& r, const std::string& name) {
  if (r.remaining() < sizeof(kMagic) || r.get_bytes(sizeof(kMagic), "magic") != std::string(kMagic, sizeof(kMagic)))
    throw Error(ErrorKind::kInvalidModel, "not a kiln engine file (no KILNENG1 magic at its start)")
        .file(name)
        .hint("build one with: kiln build model.onnx -o model.engine");
  uint32_t version = r.get<uint32_t>("format version");
  if (version != kEngineFormatVersion)
    throw Error(ErrorKind::kInvalidModel, "engine file format " + std::to_string(version) + " (" +
                                              (version < kEngineFormatVersion ? "older" : "newer") +
                                              "), this kiln reads format " + std::to_string(kEngineFormatVersion))
        .file(name)
        .hint("rebuild the engine from its ONNX model with this kiln (kiln build)");
}

nlohmann::json parse_header(const std::string& text, const std::string& name) {
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kInvalidModel, std::string("the engine file's header is not valid JSON: ") + e.what()).file(name);
  }
  if (!header.is_object()) throw Error(ErrorKind::kInvalidModel, "the engine file's header is not a JSON object").file(name);
  return header;
}

Contents read_all(Source& source, const std::string& name) {
  Reader r(source, name);
  check_magic(r, name);
  std::string header = r.get_bytes(r.get<uint64_t>("header size"), "header");
  std::string graph = r.get_bytes(r.get<uint64_t>("graph size"), "graph");
  std::string weights = r.get_bytes(r.get<uint64_t>("weights size"), "weights");
  const uint64_t computed = r.checksum();
  if (r.get<uint64_t>("checksum") != computed)
    throw Error(ErrorKind::kInvalidModel, "the engine file is corrupted (checksum mismatch)").file(name).hint("rebuild it with kiln build");
  if (r.remaining() != 0)
    throw Error(ErrorKind::kInvalidModel, "the engine file has " + std::to_string(r.remaining()) +
                                              " unexpected bytes after its checksum").file(name);
  Contents c;
  c.header = parse_header(header, name);
  c.graph = std::move(graph);
  c.weights = std::move(weights);
  return c;
}

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
  MemorySource source(bytes);
  return read_all(source, name);
}

Contents read(const std::string& path) {
  FileSource source(path);
  return read_all(source, path);
}

nlohmann::json read_header(const std::string& path) {
  FileSource source(path);
  Reader r(source, path);
  check_magic(r, path);
  return parse_header(r.get_bytes(r.get<uint64_t>("header size"), "header"), path);
}

}  // namespace kiln::engine_file
