// The one registry shape of every stage that registers per op (the importers, the op schemas,
// the CPU kernels, the CUDA layers): entries keyed by op and domain ("" for ONNX, "kiln"), each
// family file adding its entries at static initialization through a Registrar, which
// KILN_REGISTRY_FAMILY declares.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace kiln::ir {

template <class Entry>
class Registry {
 public:
  static Registry& instance() {
    static Registry registry;
    return registry;
  }

  // A later entry of the same op and domain replaces the earlier one.
  void add(Entry entry) {
    const std::string key = domain_of(entry) + "::" + entry.op;
    entries_[key] = std::move(entry);
  }
  const Entry* find(const std::string& op, const std::string& domain = "") const {
    auto it = entries_.find(domain + "::" + op);
    return it == entries_.end() ? nullptr : &it->second;
  }
  // Every entry, by domain and then op.
  std::vector<const Entry*> all() const {
    std::vector<const Entry*> out;
    for (const auto& [key, entry] : entries_) out.push_back(&entry);
    return out;
  }

  struct Registrar {
    explicit Registrar(void (*fn)(Registry&)) { fn(instance()); }
  };

 private:
  // Entries without a domain (the ONNX importers) are of ONNX's.
  static std::string domain_of(const Entry& entry) {
    if constexpr (requires { entry.domain; }) return entry.domain;
    else return "";
  }

  std::map<std::string, Entry> entries_;
};

}  // namespace kiln::ir

// Declares a family's registration function `prefix##family(RegistryType& registry)` and runs it
// at static initialization; the function's body follows the macro.
#define KILN_REGISTRY_FAMILY(RegistryType, prefix, family)                              \
  static void prefix##family(RegistryType& registry);                                    \
  static RegistryType::Registrar prefix##registrar_##family(&prefix##family);            \
  static void prefix##family(RegistryType& registry)
