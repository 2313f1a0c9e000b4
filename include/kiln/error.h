// kiln::Error: the one error type every public kiln function throws.
//
// It carries what failed and where (file, node name, op type, input index) and a hint the
// user can act on. The command line prints what() and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace kiln {

enum class ErrorKind {
  kInvalidModel,   // the model file is malformed, truncated or contradicts itself
  kUnsupported,    // valid, but kiln cannot handle it (an op, a dtype, an attribute value)
  kInvalidArgument,// the caller passed something wrong (a shape, a dtype, a missing input)
  kIo,             // a file could not be read or written
  kDevice,         // the GPU, its driver, or a CUDA library (cuDNN, cuBLASLt) failed or is missing
  kInternal,       // a bug in kiln
};

const char* to_string(ErrorKind kind);

class Error : public std::exception {
 public:
  Error(ErrorKind kind, std::string message);

  Error& file(std::string path);
  Error& node(std::string name, std::string op_type);
  Error& input(int index);
  Error& hint(std::string text);

  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  const std::string& file_path() const { return file_; }
  const std::string& node_name() const { return node_name_; }
  const std::string& op_type() const { return op_type_; }
  int input_index() const { return input_index_; }
  const std::string& hint_text() const { return hint_; }

  const char* what() const noexcept override { return what_.c_str(); }

 private:
  void compose();

  ErrorKind kind_;
  std::string message_;
  std::string file_;
  std::string node_name_;
  std::string op_type_;
  int input_index_ = -1;
  std::string hint_;
  std::string what_;
};

}  // namespace kiln
