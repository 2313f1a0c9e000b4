// CPU kernel of TfIdfVectorizer (int32, int64 in; float32 out): the pool's n-grams in a trie,
// walked from every start of each row at each skip (as ONNX's reference and ONNX Runtime do:
// unigrams are counted at the first skip only, and an n-gram the pool names twice counts into
// the column of its last entry).
#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "cpu/kernel.h"
#include "ops/tfidf_vectorizer.h"

namespace kiln::cpu {

namespace {

class NgramTrie {
 public:
  explicit NgramTrie(const ir::TfIdfParams& p) : children_(1), column_(1, -1) {
    for (size_t i = 0; i < p.grams.size(); ++i) {
      int node = 0;
      for (int64_t item : p.grams[i]) {
        auto [it, added] = children_[static_cast<size_t>(node)].emplace(item, static_cast<int>(children_.size()));
        if (added) {
          children_.emplace_back();
          column_.push_back(-1);
        }
        node = it->second;
      }
      column_[static_cast<size_t>(node)] = p.columns[i];
    }
  }
  // The child of `node` for `item`, or -1.
  int child(int node, int64_t item) const {
    const auto& c = children_[static_cast<size_t>(node)];
    auto it = c.find(item);
    return it == c.end() ? -1 : it->second;
  }
  bool has_children(int node) const { return !children_[static_cast<size_t>(node)].empty(); }
  int64_t column(int node) const { return column_[static_cast<size_t>(node)]; }

 private:
  std::vector<std::map<int64_t, int>> children_;
  std::vector<int64_t> column_;  // -1: no n-gram ends here
};

// Adds the counts of one row's n-grams to `counts` (output_size entries).
template <class T>
void count_row(const T* row, int64_t c, const ir::TfIdfParams& p, const NgramTrie& trie, std::vector<int64_t>& counts) {
  int64_t start_size = p.min_gram_length;
  // A step past C leaves no n-gram of two items or more.
  const int64_t last_step = std::min(p.max_skip_count, c) + 1;
  for (int64_t step = 1; step <= last_step; ++step) {
    for (int64_t start = 0; start < c; ++start) {
      if (start_size - 1 > (c - start - 1) / step) break;  // no n-gram of start_size fits from here
      int node = 0;
      for (int64_t size = 1, at = start; trie.has_children(node) && size <= p.max_gram_length && at < c;
           ++size, at += step) {
        node = trie.child(node, static_cast<int64_t>(row[at]));
        if (node < 0) break;
        if (size >= start_size && trie.column(node) >= 0) ++counts[static_cast<size_t>(trie.column(node))];
      }
    }
    // Unigrams do not depend on the step: counted once.
    if (start_size == 1 && ++start_size > p.max_gram_length) break;
  }
}

template <class T>
void tfidf(const Tensor& x, Tensor& y, const ir::TfIdfParams& p, const NgramTrie& trie) {
  const int64_t rows = x.shape().size() == 2 ? x.shape()[0] : 1;
  const int64_t c = x.shape().empty() ? 1 : x.shape().back();
  const size_t width = static_cast<size_t>(p.output_size);
  float* out = y.data<float>();
  std::vector<int64_t> counts(width);
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(counts.begin(), counts.end(), 0);
    if (c > 0) count_row(x.data<T>() + r * c, c, p, trie, counts);
    float* o = out + static_cast<size_t>(r) * width;
    for (size_t j = 0; j < width; ++j) {
      const float w = p.column_weights.empty() ? 1.f : p.column_weights[j];
      switch (p.mode) {
        case ir::TfIdfMode::kTf: o[j] = static_cast<float>(counts[j]); break;
        case ir::TfIdfMode::kIdf: o[j] = counts[j] > 0 ? w : 0.f; break;
        case ir::TfIdfMode::kTfIdf: o[j] = w * static_cast<float>(counts[j]); break;
      }
    }
  }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(tfidf_vectorizer) {
  KernelEntry e;
  e.op = "TfIdfVectorizer";
  e.check = accept_dtypes({DType::kInt32, DType::kInt64});
  e.dtypes = "int32, int64";
  e.create = [](const KernelInit& init) {
    auto p = std::make_shared<const ir::TfIdfParams>(ir::tfidf_params(init.node));
    auto trie = std::make_shared<const NgramTrie>(*p);
    return make_kernel([p, trie](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      if (x.shape().size() > 2)
        throw Error(ErrorKind::kInvalidArgument, "TfIdfVectorizer's input must be [C] or [N, C]");
      if (x.dtype() == DType::kInt64) tfidf<int64_t>(x, out[0], *p, *trie);
      else tfidf<int32_t>(x, out[0], *p, *trie);
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
