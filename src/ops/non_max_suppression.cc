// Schema of NonMaxSuppression (non_max_suppression_params.h has the selection): boxes
// [batches, spatial, 4] and scores [batches, classes, spatial] give selected_indices
// [selected, 3], int64, whose length the selection itself decides: known when the boxes, the
// scores and the parameters are (at run time), unknown when building.
#include "ops/non_max_suppression_params.h"
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

// The optional scalar inputs, where given and known; nullopt when given but not known yet.
std::optional<NmsParams> nms_params(InferContext& ctx) {
  NmsParams p;
  p.center_point_box = ctx.node.attrs.get_int("center_point_box", 0) != 0;
  auto scalar = [&](size_t i) -> std::optional<const Tensor*> {
    if (!ctx.has_input(i)) return nullptr;
    const Tensor* t = ctx.value(i);
    if (!t) return std::nullopt;
    if (t->numel() != 1) ctx.fail("input " + std::to_string(i) + " must hold one value, not " + std::to_string(t->numel()));
    return t;
  };
  auto max_out = scalar(2), iou = scalar(3), score = scalar(4);
  if (!max_out || !iou || !score) return std::nullopt;
  if (*max_out) p.max_per_class = (*max_out)->value_as_int(0);
  if (*iou) p.iou_threshold = static_cast<float>((*iou)->value_as_double(0));
  if (*score) p.score_threshold = static_cast<float>((*score)->value_as_double(0));
  return p;
}

void infer_non_max_suppression(InferContext& ctx) {
  const int64_t center = ctx.node.attrs.get_int("center_point_box", 0);
  if (center != 0 && center != 1) ctx.fail("center_point_box must be 0 or 1, not " + std::to_string(center));
  if (ctx.dtype(0) != DType::kFloat32 || ctx.dtype(1) != DType::kFloat32)
    ctx.unsupported("boxes and scores of type " + to_string(ctx.dtype(0)) + ", " + to_string(ctx.dtype(1)) +
                    " (supported: float32)");
  if (ctx.has_input(2) && ctx.dtype(2) != DType::kInt64) ctx.fail("max_output_boxes_per_class must be int64");
  for (size_t i : {size_t{3}, size_t{4}})
    if (ctx.has_input(i) && ctx.dtype(i) != DType::kFloat32) ctx.fail("the thresholds must be float32");
  Dim count = Dim::unknown();
  if (ctx.shape_known(0) && ctx.shape_known(1)) {
    const Dims &boxes = ctx.shape(0), &scores = ctx.shape(1);
    if (boxes.size() != 3 || (boxes[2].known() && boxes[2].value != 4)) ctx.fail("boxes must be [batches, spatial, 4]");
    if (scores.size() != 3) ctx.fail("scores must be [batches, classes, spatial]");
    if (boxes[0].known() && scores[0].known() && boxes[0].value != scores[0].value)
      ctx.fail("boxes and scores must have the same number of batches");
    if (boxes[1].known() && scores[2].known() && boxes[1].value != scores[2].value)
      ctx.fail("scores' last dimension must be the number of boxes");
    const Tensor *b = ctx.value(0), *s = ctx.value(1);
    if (b && s) {
      if (std::optional<NmsParams> p = nms_params(ctx))
        count = Dim(static_cast<int64_t>(non_max_suppression(b->data<float>(), s->data<float>(), b->dim(0), s->dim(1),
                                                             b->dim(1), *p).size()));
    } else if (ctx.has_input(2) && ctx.value(2) && ctx.value(2)->numel() == 1 && ctx.value(2)->value_as_int(0) <= 0) {
      count = Dim(0);
    }
  }
  ctx.set_output(0, DType::kInt64, Dims{count, Dim(3)});
}

}  // namespace

KILN_REGISTER_OPS(non_max_suppression) {
  registry.add({"NonMaxSuppression", "", 2, 5, 1, 1, infer_non_max_suppression, nullptr,
                "float32; the number of selected boxes depends on the data: unknown when building, known when run"});
}

}  // namespace kiln::ir
