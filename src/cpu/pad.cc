// CPU kernel of Pad on raw bytes (constant, reflect, edge, wrap). Each output row maps its
// outer coordinates to a source row (or to "all padding" in constant mode); the row's last
// axis is mapped element by element, with the interior copied in one memcpy.
#include <cstring>

#include "cpu/data_movement.h"
#include "cpu/kernel.h"

namespace kiln::ir {
std::vector<int64_t> full_pads(const Node& node, int64_t rank, const std::vector<int64_t>& pads,
                               const std::optional<std::vector<int64_t>>& axes);
}

namespace kiln::cpu {

namespace {

enum class Mode { kConstant, kReflect, kEdge, kWrap };

// The source index of output index `o` on an axis of size n with `begin` padding, or -1 for
// a constant pad.
int64_t source_index(int64_t o, int64_t begin, int64_t n, Mode mode) {
  int64_t i = o - begin;
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case Mode::kConstant: return -1;
    case Mode::kEdge: return i < 0 ? 0 : n - 1;
    case Mode::kWrap: return ((i % n) + n) % n;
    case Mode::kReflect: {
      if (n == 1) return 0;
      int64_t period = 2 * (n - 1);
      int64_t r = ((i % period) + period) % period;
      return r < n ? r : period - r;
    }
  }
  return -1;
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(pad) {
  KernelEntry e;
  e.op = "Pad";
  e.dtypes = "all";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    std::string m = init.node.attrs.get_string("mode", "constant");
    Mode mode = m == "reflect" ? Mode::kReflect : m == "edge" ? Mode::kEdge : m == "wrap" ? Mode::kWrap : Mode::kConstant;
    return make_kernel([node, mode](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      Tensor& y = out[0];
      int64_t rank = x.rank();
      size_t es = element_size(x.dtype());
      std::optional<std::vector<int64_t>> axes;
      if (in.size() > 3 && in[3]) axes = in[3]->to_int_vector();
      std::vector<int64_t> pads = ir::full_pads(*node, rank, in[1]->to_int_vector(), axes);
      std::vector<unsigned char> fill(es, 0);
      if (in.size() > 2 && in[2] && in[2]->numel()) std::memcpy(fill.data(), in[2]->raw(), es);
      if (y.numel() == 0) return;
      auto* dst = static_cast<unsigned char*>(y.raw());
      const auto* src = static_cast<const unsigned char*>(x.raw());
      if (rank == 0) {
        std::memcpy(dst, src, es);
        return;
      }
      const auto& is = x.shape();
      const auto& os = y.shape();
      std::vector<int64_t> in_strides = contiguous_strides(is);
      int64_t row = os.back(), n_last = is.back(), begin_last = pads[static_cast<size_t>(rank - 1)];
      std::vector<int64_t> last_map(static_cast<size_t>(row));
      for (int64_t o = 0; o < row; ++o) last_map[static_cast<size_t>(o)] = source_index(o, begin_last, n_last, mode);
      int64_t rows = y.numel() / row;
      std::vector<int64_t> c(static_cast<size_t>(rank - 1), 0);
      for (int64_t r = 0; r < rows; ++r) {
        unsigned char* d = dst + static_cast<size_t>(r * row) * es;
        int64_t s = 0;
        bool padding_row = false;
        for (size_t k = 0; k < c.size(); ++k) {
          int64_t i = source_index(c[k], pads[k], is[k], mode);
          if (i < 0) { padding_row = true; break; }
          s += i * in_strides[k];
        }
        for (int64_t o = 0; o < row; ++o) {
          int64_t i = padding_row ? -1 : last_map[static_cast<size_t>(o)];
          std::memcpy(d + static_cast<size_t>(o) * es, i < 0 ? fill.data() : src + static_cast<size_t>(s + i) * es, es);
        }
        for (size_t k = c.size(); k-- > 0;) {
          if (++c[k] < os[k]) break;
          c[k] = 0;
        }
      }
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
