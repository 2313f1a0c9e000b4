// CPU kernel of RotaryEmbedding (float32), as ONNX's reference defines it: the first `rot`
// features of each head (rotary_embedding_dim, default the head size) rotated pairwise by the
// position's cos and sin, the pairs being (i, i + rot / 2), or (2i, 2i + 1) when interleaved; the
// other features copied.
#include <cstring>

#include "cpu/kernel.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(rotary_embedding) {
  KernelEntry e;
  e.op = "RotaryEmbedding";
  e.check = accept_dtypes({DType::kFloat32});
  e.dtypes = "float32";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      const Tensor &cos_cache = *in[1], &sin_cache = *in[2];
      const Tensor* position_ids = in.size() > 3 ? in[3] : nullptr;
      if ((x.rank() != 3 && x.rank() != 4) || cos_cache.rank() != (position_ids ? 2 : 3) || sin_cache.shape() != cos_cache.shape() ||
          (position_ids && position_ids->rank() != 2))
        throw node->error(ErrorKind::kInvalidArgument, "the input must have rank 3 or 4, the caches one shape of rank " +
                                                           std::string(position_ids ? "2 (and position_ids rank 2)" : "3"));
      const bool four_d = x.rank() == 4;
      const int64_t batch = x.dim(0), seq = four_d ? x.dim(2) : x.dim(1);
      const int64_t heads = four_d ? x.dim(1) : node->attrs.get_int("num_heads", 0);
      if (heads <= 0 || (!four_d && x.dim(2) % heads != 0))
        throw node->error(ErrorKind::kInvalidArgument, "the hidden size does not split into num_heads heads");
      const int64_t head = four_d ? x.dim(3) : x.dim(2) / heads;
      int64_t rot = node->attrs.get_int("rotary_embedding_dim", 0);
      if (rot == 0) rot = head;
      if (rot < 0 || rot > head || rot % 2 != 0)
        throw node->error(ErrorKind::kInvalidArgument, "rotary_embedding_dim " + std::to_string(rot) + " must be even and at most the head size " + std::to_string(head));
      const int64_t half = rot / 2;
      const Tensor &cos = cos_cache, &sin = sin_cache;
      const Tensor* positions = position_ids;
      if (positions && (positions->dim(0) != batch || positions->dim(1) != seq))
        throw node->error(ErrorKind::kInvalidArgument, "position_ids must be [batch, seq]");
      if (cos.dim(cos.rank() - 1) != half || sin.dim(sin.rank() - 1) != half)
        throw node->error(ErrorKind::kInvalidArgument, "the caches' last dim must be rotary_embedding_dim / 2 = " + std::to_string(half));
      const bool interleaved = node->attrs.get_int("interleaved", 0) != 0;
      const float* xv = x.data<float>();
      float* y = out[0].data<float>();
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t s = 0; s < seq; ++s) {
          int64_t row = b * seq + s;  // the caches' row
          if (positions) {
            row = positions->value_as_int(b * seq + s);
            if (row < 0 || row >= cos.dim(0))
              throw node->error(ErrorKind::kInvalidArgument, "position " + std::to_string(row) + " is outside the caches' " + std::to_string(cos.dim(0)) + " rows");
          } else if (cos.dim(0) != batch || cos.dim(1) != seq) {
            throw node->error(ErrorKind::kInvalidArgument, "without position_ids the caches must be [batch, seq, rot / 2]");
          }
          const float* c = cos.data<float>() + row * half;
          const float* sn = sin.data<float>() + row * half;
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t base = four_d ? ((b * heads + h) * seq + s) * head : (b * seq + s) * heads * head + h * head;
            const float* xi = xv + base;
            float* yo = y + base;
            for (int64_t i = 0; i < half; ++i) {
              const int64_t i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
              const float x1 = xi[i1], x2 = xi[i2];
              yo[i1] = c[i] * x1 - sn[i] * x2;
              yo[i2] = sn[i] * x1 + c[i] * x2;
            }
            if (head > rot) std::memcpy(yo + rot, xi + rot, static_cast<size_t>(head - rot) * sizeof(float));
          }
        }
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
