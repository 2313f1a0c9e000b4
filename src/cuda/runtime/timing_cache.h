// The timing cache: the tactic chosen for each layer signature on one GPU and library
// version, so that the next build of the same (or a similar) model times nothing.
//
// File format (text, one entry per line):
//   kiln-timing-cache 1
//   device <signature: GPU name, compute capability, cuDNN and cuBLASLt versions, and the
//          build's tactic options where they are not the defaults (TacticOptions::describe)>
//   <key>\t<tactic>
// (a generated kernel's entry holds its cubin in base64: cuda/runtime/runtime_compiler.h)
// A file written for another device signature is ignored (the build says so).
#pragma once

#include <map>
#include <optional>
#include <string>

namespace kiln::cuda {

class TimingCache {
 public:
  TimingCache() = default;
  explicit TimingCache(std::string device) : device_(std::move(device)) {}

  // Merges the entries of `path` if it exists and matches this device; returns a note for
  // the build log ("" when nothing worth saying). Throws kIo if it exists but is unreadable,
  // kInvalidArgument if it is not a timing cache.
  std::string load(const std::string& path);
  // Writes all entries, merged with those the file holds by then for this device (builds that
  // share a cache file and save one after the other keep each other's entries; this cache's win
  // on the same key), atomically: a temporary file of this process's renamed over `path`, so
  // saves at the same instant never corrupt the file (one of them may then miss the other's
  // newest entries, which the next build times again). Throws kIo.
  void save(const std::string& path) const;

  std::optional<std::string> find(const std::string& key) const;
  void set(const std::string& key, const std::string& tactic) { entries_[key] = tactic; }
  size_t size() const { return entries_.size(); }

 private:
  std::string device_;
  std::map<std::string, std::string> entries_;
};

}  // namespace kiln::cuda
