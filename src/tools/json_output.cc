#include "tools/json_output.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "kiln/error.h"

namespace kiln::tools {

JsonOutput::JsonOutput(std::string path) : path_(std::move(path)) {
  if (path_ == "-") {
    stdout_ = std::cout.rdbuf(std::cerr.rdbuf());
    return;
  }
  // Before a long run, not after it: the folder must exist and take files.
  if (path_.empty()) return;
  const std::filesystem::path folder = std::filesystem::absolute(path_).parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec) || access(folder.c_str(), W_OK) != 0)
    throw Error(ErrorKind::kIo, "cannot write '" + path_ + "': " + folder.string() + " is not a folder kiln may write in")
        .hint("--json takes a file in an existing folder, or - for standard output");
}

JsonOutput::~JsonOutput() {
  if (stdout_) std::cout.rdbuf(stdout_);
}

void JsonOutput::write(const nlohmann::json& j) const {
  if (path_.empty()) return;
  if (stdout_) {
    std::ostream out(stdout_);
    out << j.dump(1) << "\n" << std::flush;
    if (!out) throw Error(ErrorKind::kIo, "cannot write the JSON to standard output");
    return;
  }
  std::ofstream f(path_);
  if (!f) throw Error(ErrorKind::kIo, "cannot create '" + path_ + "'").hint("does its folder exist?");
  if (!(f << j.dump(1) << "\n")) throw Error(ErrorKind::kIo, "cannot write '" + path_ + "'");
}

}  // namespace kiln::tools
