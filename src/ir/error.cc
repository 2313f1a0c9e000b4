#include "kiln/error.h"

namespace kiln {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidModel: return "invalid model";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kIo: return "I/O error";
    case ErrorKind::kDevice: return "GPU error";
    case ErrorKind::kInternal: return "internal error";
  }
  return "error";
}

Error::Error(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {
  compose();
}

Error& Error::file(std::string path) {
  file_ = std::move(path);
  compose();
  return *this;
}

Error& Error::node(std::string name, std::string op_type) {
  node_name_ = std::move(name);
  op_type_ = std::move(op_type);
  compose();
  return *this;
}

Error& Error::input(int index) {
  input_index_ = index;
  compose();
  return *this;
}

Error& Error::hint(std::string text) {
  hint_ = std::move(text);
  compose();
  return *this;
}

// "model.onnx: node 'conv1' (Conv), input 1: unsupported: <message>. Hint: <hint>"
void Error::compose() {
  std::string where;
  if (!file_.empty()) where += file_;
  if (!node_name_.empty() || !op_type_.empty()) {
    if (!where.empty()) where += ": ";
    where += "node '" + node_name_ + "'";
    if (!op_type_.empty()) where += " (" + op_type_ + ")";
  }
  if (input_index_ >= 0) {
    if (!where.empty()) where += ", ";
    where += "input " + std::to_string(input_index_);
  }
  what_.clear();
  if (!where.empty()) what_ = where + ": ";
  what_ += std::string(to_string(kind_)) + ": " + message_;
  if (!hint_.empty()) what_ += ". Hint: " + hint_;
}

}  // namespace kiln
