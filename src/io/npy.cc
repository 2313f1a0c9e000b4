#include "io/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace kiln::io {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

// The descr strings np.save writes on a little-endian machine ('<' for multi-byte types,
// '|' where byte order does not apply). '=' (native) is accepted too: kiln only runs on
// little-endian machines.
struct DescrEntry {
  const char* code;  // without the byte-order character
  DType dtype;
};
constexpr DescrEntry kDescrs[] = {
    {"f2", DType::kFloat16}, {"f4", DType::kFloat32}, {"f8", DType::kFloat64},
    {"i1", DType::kInt8},    {"i2", DType::kInt16},   {"i4", DType::kInt32},
    {"i8", DType::kInt64},   {"u1", DType::kUInt8},   {"u2", DType::kUInt16},
    {"u4", DType::kUInt32},  {"u8", DType::kUInt64},  {"b1", DType::kBool},
};

Error bad_file(const std::string& name, const std::string& why) {
  return Error(ErrorKind::kInvalidArgument, "not a valid .npy file: " + why).file(name);
}

// A parser for the header: a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }
// It reads only the three keys np.save writes and the value forms they take.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& name) : s_(text), name_(name) {}

  void parse(std::string& descr, bool& fortran_order, std::vector<int64_t>& shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') { ++pos_; break; }
      std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        descr = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran_order = parse_bool();
        have_order = true;
      } else if (key == "shape") {
        shape = parse_shape();
        have_shape = true;
      } else {
        throw bad_file(name_, "unexpected key '" + key + "' in the header");
      }
      skip_space();
      if (peek() == ',') { ++pos_; continue; }
      expect('}');
      break;
    }
    if (!have_descr || !have_order || !have_shape)
      throw bad_file(name_, "the header lacks 'descr', 'fortran_order' or 'shape'");
  }

 private:
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) throw bad_file(name_, std::string("malformed header (expected '") + c + "' at offset " + std::to_string(pos_) + ")");
    ++pos_;
  }
  std::string parse_string() {
    skip_space();
    char quote = peek();
    if (quote != '\'' && quote != '"') throw bad_file(name_, "malformed header (expected a quoted string at offset " + std::to_string(pos_) + ")");
    size_t end = s_.find(quote, pos_ + 1);
    if (end == std::string::npos) throw bad_file(name_, "malformed header (unterminated string)");
    std::string out = s_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return out;
  }
  bool parse_bool() {
    skip_space();
    if (s_.compare(pos_, 4, "True") == 0) { pos_ += 4; return true; }
    if (s_.compare(pos_, 5, "False") == 0) { pos_ += 5; return false; }
    throw bad_file(name_, "malformed header ('fortran_order' must be True or False)");
  }
  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') { ++pos_; break; }
      if (peek() < '0' || peek() > '9') throw bad_file(name_, "malformed header (a shape entry is not a non-negative integer)");
      int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (v > (INT64_MAX - 9) / 10) throw bad_file(name_, "a dimension in the header is too large");
        v = v * 10 + (peek() - '0');
        ++pos_;
      }
      // Python 2 era files may write 3L.
      if (peek() == 'L') ++pos_;
      shape.push_back(v);
      skip_space();
      if (peek() == ',') { ++pos_; continue; }
      expect(')');
      break;
    }
    return shape;
  }

  const std::string& s_;
  const std::string& name_;
  size_t pos_ = 0;
};

DType dtype_from_descr(const std::string& descr, const std::string& name) {
  if (descr.size() == 3) {
    char order = descr[0];
    std::string code = descr.substr(1);
    for (const DescrEntry& e : kDescrs) {
      if (code != e.code) continue;
      bool one_byte = element_size(e.dtype) == 1;
      if (order == '<' || order == '=' || (order == '|' && one_byte)) return e.dtype;
      if (order == '>' && !one_byte)
        throw Error(ErrorKind::kUnsupported, "big-endian .npy data ('" + descr + "') is not supported")
            .file(name)
            .hint("save it little-endian: np.save(path, a.astype(a.dtype.newbyteorder('<')))");
      break;
    }
  }
  throw Error(ErrorKind::kUnsupported, "the .npy data type '" + descr + "' is not supported")
      .file(name)
      .hint("kiln reads float16/32/64, int8/16/32/64, uint8/16/32/64 and bool arrays");
}

std::string descr_of(DType dtype) {
  for (const DescrEntry& e : kDescrs)
    if (e.dtype == dtype) return std::string(element_size(dtype) == 1 ? "|" : "<") + e.code;
  throw Error(ErrorKind::kUnsupported, to_string(dtype) + " tensors cannot be written as .npy (NumPy has no such type)")
      .hint(dtype == DType::kBFloat16 ? "convert to float32 first" : "");
}

uint32_t read_le(const std::string& b, size_t at, size_t bytes) {
  uint32_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(b[at + i])) << (8 * i);
  return v;
}

std::string read_whole_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot open '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(ErrorKind::kIo, "cannot read '" + path + "'");
  return ss.str();
}

}  // namespace

Tensor parse_npy(const std::string& bytes, const std::string& name) {
  if (bytes.size() < kMagicSize + 2 || std::memcmp(bytes.data(), kMagic, kMagicSize) != 0)
    throw bad_file(name, "it does not start with the .npy magic string");
  int major = static_cast<unsigned char>(bytes[6]);
  size_t len_bytes = major == 1 ? 2 : (major == 2 || major == 3) ? 4 : 0;
  if (len_bytes == 0) throw Error(ErrorKind::kUnsupported, ".npy format version " + std::to_string(major) + " is not supported").file(name);
  size_t header_start = kMagicSize + 2 + len_bytes;
  if (bytes.size() < header_start) throw bad_file(name, "truncated header");
  size_t header_len = read_le(bytes, kMagicSize + 2, len_bytes);
  if (header_len > bytes.size() - header_start) throw bad_file(name, "truncated header");
  std::string header = bytes.substr(header_start, header_len);

  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  HeaderParser(header, name).parse(descr, fortran_order, shape);
  DType dtype = dtype_from_descr(descr, name);
  if (fortran_order)
    throw Error(ErrorKind::kUnsupported, "Fortran-order .npy arrays are not supported")
        .file(name)
        .hint("save a C-order copy: np.save(path, np.ascontiguousarray(a))");

  // Check the size before allocating, so a lying header cannot make kiln allocate much.
  size_t available = bytes.size() - header_start - header_len;
  size_t esize = element_size(dtype);
  uint64_t numel = 1;
  bool too_big = false;  // more than the file holds (and maybe more than fits in 64 bits)
  for (int64_t d : shape) {
    if (d == 0) { numel = 0; too_big = false; break; }
    if (numel > available / esize / static_cast<uint64_t>(d)) too_big = true;
    else numel *= static_cast<uint64_t>(d);
  }
  if (too_big || numel * esize != available)
    throw bad_file(name, "the header says " + shape_to_string(shape) + " " + to_string(dtype) + " but the file holds " +
                             std::to_string(available) + " bytes of data" + (too_big || numel * esize > available ? " (truncated?)" : ""));

  Tensor t(dtype, shape);
  if (available) std::memcpy(t.raw(), bytes.data() + header_start + header_len, available);
  if (dtype == DType::kBool) {
    // Any non-zero byte is true; kiln's bool tensors hold exactly 0 or 1.
    auto* p = static_cast<unsigned char*>(t.raw());
    for (size_t i = 0; i < available; ++i) p[i] = p[i] ? 1 : 0;
  }
  return t;
}

Tensor read_npy(const std::string& path) { return parse_npy(read_whole_file(path), path); }

std::string to_npy(const Tensor& tensor) {
  std::string descr = descr_of(tensor.dtype());
  std::string shape = "(";
  for (size_t i = 0; i < tensor.shape().size(); ++i) shape += std::to_string(tensor.shape()[i]) + (tensor.rank() == 1 ? "," : i + 1 < tensor.shape().size() ? ", " : "");
  shape += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad with spaces and a final newline so the data starts on a 64-byte boundary.
  bool v2 = header.size() + 1 + kMagicSize + 2 + 2 > 65535;
  size_t prefix = kMagicSize + 2 + (v2 ? 4 : 2);
  size_t total = prefix + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';

  std::string out(kMagic, kMagicSize);
  out += static_cast<char>(v2 ? 2 : 1);
  out += '\0';
  uint32_t len = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  out += header;
  out.append(static_cast<const char*>(tensor.raw()), tensor.nbytes());
  return out;
}

void write_npy(const std::string& path, const Tensor& tensor) {
  std::string bytes = to_npy(tensor);
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot create '" + path + "'");
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Error(ErrorKind::kIo, "cannot write '" + path + "'");
}

}  // namespace kiln::io
