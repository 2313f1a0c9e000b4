// TfIdfVectorizer's attributes (opset 9), one reading for its schema and its CPU kernel: the
// n-grams of an integer pool, each counted into an output column, of a sequence [C] or of each
// row of [N, C], where an n-gram's items may lie `skip` apart (0 to max_skip_count). Counts are
// taken as they are (TF), as 0 or 1 (IDF) or scaled (TFIDF), by the weight of each of the pool's
// n-grams (the operator's text and ONNX Runtime; ONNX's Python reference indexes the weights by
// output column instead, which differs where ngram_indexes is not 0, 1, 2, ...).
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

enum class TfIdfMode { kTf, kIdf, kTfIdf };

struct TfIdfParams {
  TfIdfMode mode = TfIdfMode::kTf;
  int64_t min_gram_length = 1, max_gram_length = 1, max_skip_count = 0;
  // The pool's n-grams: grams[i] (its items) counts into column columns[i].
  std::vector<std::vector<int64_t>> grams;
  std::vector<int64_t> columns;
  std::vector<float> column_weights;  // by output column, from the n-grams' weights (or empty)
  int64_t output_size = 0;     // columns of the output: max(ngram_indexes) + 1
};

// Reads and checks the node's attributes. Throws kUnsupported for a string pool, kInvalidModel
// naming the node for a missing or malformed attribute: an unknown mode, gram lengths out of
// order, a negative skip count, ngram_counts that decrease or leave the pool, fewer
// ngram_indexes than the pool has n-grams, a negative index, fewer weights than n-grams.
TfIdfParams tfidf_params(const Node& node);

}  // namespace kiln::ir
