#include "cuda/runtime/timing_cache.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/error.h"

namespace kiln::cuda {

namespace {
constexpr const char* kMagic = "kiln-timing-cache 1";
}

std::string TimingCache::load(const std::string& path) {
  if (!std::filesystem::exists(path)) return "timing cache " + path + " does not exist yet; it will be created";
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::kIo, "cannot read the timing cache").file(path);
  std::string line;
  if (!std::getline(in, line) || line != kMagic)
    throw Error(ErrorKind::kInvalidArgument, "not a kiln timing cache (the first line must be '" +
                                                 std::string(kMagic) + "')").file(path);
  if (!std::getline(in, line) || line.rfind("device ", 0) != 0)
    throw Error(ErrorKind::kInvalidArgument, "timing cache without a device line").file(path);
  std::string device = line.substr(7);
  if (device != device_)
    return "timing cache " + path + " was written for '" + device + "', not this '" + device_ +
           "': ignored (it will be overwritten)";
  size_t n = 0;
  while (std::getline(in, line)) {
    size_t tab = line.find('\t');
    if (tab == std::string::npos || tab == 0) continue;
    entries_[line.substr(0, tab)] = line.substr(tab + 1);
    ++n;
  }
  return "timing cache " + path + ": " + std::to_string(n) + " entries";
}

void TimingCache::save(const std::string& path) const {
  // Builds that share one cache file may save it at the same time: keep what the file holds
  // now (entries another build added since this one loaded it; ours win on the same key), and
  // write through a temporary file of this process's own, renamed over the cache.
  TimingCache merged(device_);
  try {
    merged.load(path);
  } catch (const Error&) {
    // unreadable or not a timing cache: overwritten, as a cache for another device is
  }
  for (const auto& [key, tactic] : entries_) merged.entries_[key] = tactic;
  static std::atomic<unsigned> serial{0};
  const std::string tmp = path + ".tmp" + std::to_string(::getpid()) + "." + std::to_string(serial++);
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw Error(ErrorKind::kIo, "cannot write the timing cache").file(path);
    out << kMagic << "\ndevice " << device_ << "\n";
    for (const auto& [key, tactic] : merged.entries_) out << key << '\t' << tactic << '\n';
    if (!out) {
      std::remove(tmp.c_str());
      throw Error(ErrorKind::kIo, "cannot write the timing cache").file(path);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(ErrorKind::kIo, "cannot write the timing cache: " + ec.message()).file(path);
}

std::optional<std::string> TimingCache::find(const std::string& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kiln::cuda
