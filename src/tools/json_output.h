// --json FILE, the same in every command: FILE gets the command's JSON; "-" sends it to standard
// output, and the command's text goes to standard error meanwhile, so `kiln bench m --json - | jq`
// reads JSON only.
#pragma once

#include <iosfwd>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace kiln::tools {

class JsonOutput {
 public:
  explicit JsonOutput(std::string path);
  ~JsonOutput();
  JsonOutput(const JsonOutput&) = delete;
  JsonOutput& operator=(const JsonOutput&) = delete;

  bool wanted() const { return !path_.empty(); }
  // Writes `j` (indented) to the file or standard output; a file that cannot be written is a kiln::Error.
  void write(const nlohmann::json& j) const;

 private:
  std::string path_;
  std::streambuf* stdout_ = nullptr;  // standard output's own buffer while its text goes to stderr
};

}  // namespace kiln::tools
