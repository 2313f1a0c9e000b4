// IDX files and Fashion-MNIST (see idx.h).
#include "io/idx.h"

#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace kiln::io {

namespace {

// The whole file, inflated when it is gzipped (zlib reads plain files as they are).
std::vector<uint8_t> read_all(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw Error(ErrorKind::kIo, "cannot read " + path + ": no such file");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw Error(ErrorKind::kIo, "cannot open " + path);
  std::vector<uint8_t> data;
  uint8_t chunk[1 << 16];
  int got = 0;
  while ((got = gzread(f, chunk, sizeof chunk)) > 0) data.insert(data.end(), chunk, chunk + got);
  int err = 0;
  std::string message = got < 0 ? gzerror(f, &err) : "";
  if (message.rfind(path + ": ", 0) == 0) message.erase(0, path.size() + 2);  // zlib prefixes the path
  gzclose(f);
  if (got < 0) throw Error(ErrorKind::kInvalidArgument, path + " is corrupt: " + message);
  return data;
}

}  // namespace

Tensor read_idx(const std::string& path) {
  const std::vector<uint8_t> d = read_all(path);
  if (d.size() < 4 || d[0] != 0 || d[1] != 0)
    throw Error(ErrorKind::kInvalidArgument, path + " is not an IDX file (its first bytes are not an IDX magic number)");
  if (d[2] != 0x08) {
    const char* hex = "0123456789abcdef";
    throw Error(ErrorKind::kUnsupported, path + " holds IDX type 0x" + std::string{hex[d[2] >> 4], hex[d[2] & 15]} +
                                             "; kiln reads unsigned bytes (0x08)");
  }
  const int rank = d[3];
  if (rank < 1 || rank > 4) throw Error(ErrorKind::kInvalidArgument, path + " declares " + std::to_string(rank) + " dimensions");
  if (d.size() < 4 + 4 * static_cast<size_t>(rank))
    throw Error(ErrorKind::kInvalidArgument, path + " is truncated: it ends inside its header");
  std::vector<int64_t> dims;
  uint64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    const uint8_t* p = d.data() + 4 + 4 * i;
    const int64_t v = (int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) | p[3];
    dims.push_back(v);
    count *= static_cast<uint64_t>(v);
    if (count > (uint64_t{1} << 34)) throw Error(ErrorKind::kInvalidArgument, path + " declares implausibly large dimensions");
  }
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (d.size() - header < count)
    throw Error(ErrorKind::kInvalidArgument, path + " is truncated: its dimensions need " + std::to_string(count) +
                                              " bytes of data, it has " + std::to_string(d.size() - header));
  Tensor t(DType::kUInt8, dims);
  std::copy(d.begin() + static_cast<std::ptrdiff_t>(header), d.begin() + static_cast<std::ptrdiff_t>(header + count),
            t.data<uint8_t>());
  return t;
}

LabeledImages load_fashion_mnist(const std::string& split, const std::string& dir_given) {
  const char* env = std::getenv("KILN_FASHION_MNIST_DIR");
  const std::string dir = !dir_given.empty() ? dir_given : env && *env ? env : kFashionMnistDir;
  std::string prefix;
  if (split == "train") prefix = "train";
  else if (split == "test") prefix = "t10k";
  else throw Error(ErrorKind::kInvalidArgument, "Fashion-MNIST has the splits 'train' and 'test', not '" + split + "'");
  const std::string images = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  if (!std::filesystem::exists(images))
    throw Error(ErrorKind::kIo, "Fashion-MNIST is not installed: " + images + " is missing")
        .hint("install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist)");
  LabeledImages out{read_idx(images), read_idx(dir + "/" + prefix + "-labels-idx1-ubyte.gz")};
  if (out.images.rank() != 3 || out.labels.rank() != 1 || out.images.dim(0) != out.labels.dim(0))
    throw Error(ErrorKind::kInvalidArgument, "Fashion-MNIST " + split + " in " + dir + ": " +
                                              std::to_string(out.images.dim(0)) + " images but " +
                                              std::to_string(out.labels.numel()) + " labels, or not N x rows x cols");
  return out;
}

Tensor fashion_mnist_input(const LabeledImages& data, int64_t begin, int64_t end) {
  const int64_t rows = data.images.dim(1), cols = data.images.dim(2), n = end - begin;
  Tensor t(DType::kFloat32, {n, 1, rows, cols});
  const uint8_t* src = data.images.data<uint8_t>() + begin * rows * cols;
  float* dst = t.data<float>();
  for (int64_t i = 0; i < n * rows * cols; ++i)
    dst[i] = (static_cast<float>(src[i]) / 255.f - kFashionMnistMean) / kFashionMnistStd;
  return t;
}

}  // namespace kiln::io
