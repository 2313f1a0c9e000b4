// Schema of TfIdfVectorizer (opset 9): int32 or int64 [C] -> float32 [output_size], or [N, C] ->
// [N, output_size] (ops/tfidf_vectorizer.h).
#include "ops/tfidf_vectorizer.h"

#include <algorithm>
#include <string>

#include "ir/op_schema.h"

namespace kiln::ir {

TfIdfParams tfidf_params(const Node& node) {
  auto fail = [&](const std::string& why) { throw Error(ErrorKind::kInvalidModel, why).node(node.name, node.op); };
  if (node.attrs.has("pool_strings"))
    throw Error(ErrorKind::kUnsupported, "string pools (pool_strings) are not supported: kiln has no string tensors")
        .node(node.name, node.op);
  if (!node.attrs.has("pool_int64s")) fail("pool_int64s is missing");
  TfIdfParams p;
  const std::string mode = node.attrs.get_string("mode", "");
  if (mode == "TF") p.mode = TfIdfMode::kTf;
  else if (mode == "IDF") p.mode = TfIdfMode::kIdf;
  else if (mode == "TFIDF") p.mode = TfIdfMode::kTfIdf;
  else fail("mode must be TF, IDF or TFIDF, is '" + mode + "'");
  p.min_gram_length = node.attrs.require_int("min_gram_length");
  p.max_gram_length = node.attrs.require_int("max_gram_length");
  p.max_skip_count = node.attrs.require_int("max_skip_count");
  if (p.min_gram_length < 1 || p.max_gram_length < p.min_gram_length)
    fail("gram lengths must satisfy 1 <= min_gram_length <= max_gram_length, are " + std::to_string(p.min_gram_length) +
         " and " + std::to_string(p.max_gram_length));
  if (p.max_skip_count < 0) fail("max_skip_count must not be negative, is " + std::to_string(p.max_skip_count));
  const std::vector<int64_t> pool = node.attrs.get_ints("pool_int64s");
  const std::vector<int64_t> counts = node.attrs.get_ints("ngram_counts");
  const std::vector<int64_t> indexes = node.attrs.get_ints("ngram_indexes");
  if (indexes.empty()) fail("ngram_indexes is missing or empty");
  const int64_t pool_size = static_cast<int64_t>(pool.size());
  // ngram_counts[k]: where the pool's (k + 1)-grams start; they run to the next start.
  size_t id = 0;  // the pool's n-grams in order, all sizes: each takes the next index
  for (size_t k = 0; k < counts.size(); ++k) {
    const int64_t begin = counts[k], end = k + 1 < counts.size() ? counts[k + 1] : pool_size;
    if (begin < 0 || begin > end || end > pool_size)
      fail("ngram_counts must rise within the pool of " + std::to_string(pool_size) + " items, has " +
           std::to_string(begin) + " then " + std::to_string(end));
    const int64_t size = static_cast<int64_t>(k) + 1;
    const int64_t grams = (end - begin) / size;
    if (static_cast<int64_t>(indexes.size() - id) < grams)
      fail("ngram_indexes has " + std::to_string(indexes.size()) + " entries, fewer than the pool's n-grams");
    for (int64_t g = 0; g < grams; ++g, ++id) {
      // Sizes outside [min, max] keep their place in the numbering but are never counted.
      if (size < p.min_gram_length || size > p.max_gram_length) continue;
      const auto first = pool.begin() + begin + g * size;
      p.grams.emplace_back(first, first + size);
      p.columns.push_back(indexes[id]);
    }
  }
  for (int64_t i : indexes)
    if (i < 0) fail("ngram_indexes must not be negative, has " + std::to_string(i));
  p.output_size = *std::max_element(indexes.begin(), indexes.end()) + 1;
  if (p.output_size > (int64_t{1} << 31)) fail("ngram_indexes asks for " + std::to_string(p.output_size) + " output columns");
  const std::vector<float> weights = node.attrs.get_floats("weights");
  if (!weights.empty()) {
    if (weights.size() < indexes.size())
      fail("weights has " + std::to_string(weights.size()) + " values for " + std::to_string(indexes.size()) + " n-grams");
    // The i-th n-gram's weight scales the column it counts into.
    p.column_weights.assign(static_cast<size_t>(p.output_size), 1.f);
    for (size_t i = 0; i < indexes.size(); ++i) p.column_weights[static_cast<size_t>(indexes[i])] = weights[i];
  }
  return p;
}

namespace {

void infer_tfidf(InferContext& ctx) {
  const DType t = ctx.dtype(0);
  if (t == DType::kString) throw Error(ErrorKind::kUnsupported, "string inputs are not supported: kiln has no string tensors");
  if (t != DType::kInt32 && t != DType::kInt64) ctx.fail("input type " + to_string(t) + " is not int32 or int64");
  const TfIdfParams p = tfidf_params(ctx.node);
  const TensorType& x = ctx.type(0);
  if (!x.shape) {
    ctx.set_output(0, DType::kFloat32, std::nullopt);
    return;
  }
  if (x.shape->size() == 1) {
    ctx.set_output(0, DType::kFloat32, Dims{Dim(p.output_size)});
  } else if (x.shape->size() == 2) {
    ctx.set_output(0, DType::kFloat32, Dims{(*x.shape)[0], Dim(p.output_size)});
  } else {
    ctx.fail("input must be [C] or [N, C], is " + dims_to_string(*x.shape));
  }
}

}  // namespace

KILN_REGISTER_OPS(tfidf_vectorizer) {
  OpSchema s;
  s.op = "TfIdfVectorizer";
  s.infer = infer_tfidf;
  s.limits = "string pools and inputs; GPU: no layer";
  registry.add(std::move(s));
}

}  // namespace kiln::ir
