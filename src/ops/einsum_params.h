// Einsum's equation, parsed once for the schema and the CPU kernel: each operand's labels (an
// ellipsis expanded into labels of its own), the output's labels (explicit after "->", else the
// labels that appear once, in alphabetical order, after the ellipsis' labels, as numpy does).
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln::ops {

struct EinsumEquation {
  std::vector<std::vector<int>> inputs;  // per operand, per axis: its label (0..labels-1)
  std::vector<int> output;               // per output axis: its label
  int labels = 0;
};

// Parses `equation` for operands of these ranks; "" on success, else why not.
inline std::string parse_einsum(const std::string& equation, const std::vector<int64_t>& ranks, EinsumEquation& out) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq += c;
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms(1);
  for (char c : lhs) {
    if (c == ',') terms.emplace_back();
    else terms.back() += c;
  }
  if (terms.size() != ranks.size())
    return "the equation has " + std::to_string(terms.size()) + " operands, the node " + std::to_string(ranks.size());
  std::map<char, int> ids;
  auto id_of = [&](char c) {
    return ids.emplace(c, static_cast<int>(ids.size())).first->second;
  };
  // Ellipsis dims take labels of their own, aligned right across operands (broadcast).
  int64_t ellipsis_rank = -1;
  std::map<int, int> counts;
  out = EinsumEquation{};
  for (size_t t = 0; t < terms.size(); ++t) {
    const std::string& term = terms[t];
    const size_t dots = term.find("...");
    int64_t letters = 0;
    for (char c : term)
      if (c != '.') {
        if (!std::isalpha(static_cast<unsigned char>(c))) return std::string("'") + c + "' is not a label";
        ++letters;
      }
    const int64_t ell = dots == std::string::npos ? 0 : ranks[t] - letters;
    if (ell < 0 || (dots == std::string::npos && letters != ranks[t]))
      return "operand " + std::to_string(t) + " has rank " + std::to_string(ranks[t]) + ", its term '" + term + "' does not";
    if (dots != std::string::npos) {
      if (term.find("...", dots + 3) != std::string::npos) return "more than one ellipsis in a term";
      ellipsis_rank = std::max(ellipsis_rank, ell);
    }
    std::vector<int> axes;
    for (size_t i = 0; i < term.size(); ++i) {
      if (term[i] == '.') {
        if (i == dots) {
          for (int64_t k = 0; k < ell; ++k) axes.push_back(-2 - static_cast<int>(ell - k));  // placeholder: from the right
          i += 2;
        }
        continue;
      }
      axes.push_back(id_of(term[i]));
    }
    out.inputs.push_back(axes);
  }
  // Ellipsis labels after the letters.
  std::vector<int> ell_labels;
  for (int64_t k = 0; k < std::max<int64_t>(ellipsis_rank, 0); ++k) ell_labels.push_back(static_cast<int>(ids.size() + k));
  for (auto& axes : out.inputs)
    for (int& a : axes)
      if (a <= -2) a = ell_labels[static_cast<size_t>(static_cast<int64_t>(ell_labels.size()) + 2 + a)];
  out.labels = static_cast<int>(ids.size() + ell_labels.size());
  for (const auto& axes : out.inputs)
    for (int a : axes) ++counts[a];
  if (arrow != std::string::npos) {
    const std::string rhs = eq.substr(arrow + 2);
    const size_t dots = rhs.find("...");
    for (size_t i = 0; i < rhs.size(); ++i) {
      if (rhs[i] == '.') {
        if (i == dots) {
          for (int l : ell_labels) out.output.push_back(l);
          i += 2;
        }
        continue;
      }
      auto it = ids.find(rhs[i]);
      if (it == ids.end()) return std::string("the output label '") + rhs[i] + "' is in no operand";
      if (std::count(out.output.begin(), out.output.end(), it->second)) return std::string("the output repeats '") + rhs[i] + "'";
      out.output.push_back(it->second);
    }
  } else {
    for (int l : ell_labels) out.output.push_back(l);
    for (const auto& [c, id] : ids)  // alphabetical: std::map orders the characters
      if (counts[id] == 1) out.output.push_back(id);
  }
  return "";
}

}  // namespace kiln::ops
