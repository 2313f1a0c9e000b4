// CPU kernels of Reduce* and ArgMax/ArgMin.
//
// A reduction is planned as two offset tables: the input offset where each output element's
// set starts, and the offsets of the reduced elements relative to it. That serves any set of
// axes with one loop; reducing a contiguous suffix (LayerNorm-style ReduceMean over the last
// axis, SE blocks' mean over H*W) is detected and runs over contiguous rows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "ir/saturating_cast.h"
#include "cpu/wrapping.h"
#include "ops/reduce.h"

namespace kiln::cpu {

namespace {

enum class Red { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

Red red_of(const std::string& op) {
  if (op == "ReduceSum") return Red::kSum;
  if (op == "ReduceMean") return Red::kMean;
  if (op == "ReduceMax") return Red::kMax;
  if (op == "ReduceMin") return Red::kMin;
  if (op == "ReduceProd") return Red::kProd;
  if (op == "ReduceL1") return Red::kL1;
  if (op == "ReduceL2") return Red::kL2;
  if (op == "ReduceLogSum") return Red::kLogSum;
  if (op == "ReduceLogSumExp") return Red::kLogSumExp;
  return Red::kSumSquare;
}

struct ReducePlan {
  std::vector<int64_t> base;     // per output element: input offset of its first element
  std::vector<int64_t> offsets;  // per reduced element: offset from base
  bool contiguous = false;       // offsets are 0, 1, 2, ...
  int64_t count() const { return static_cast<int64_t>(offsets.size()); }
};

ReducePlan plan_reduce(const std::vector<int64_t>& shape, const std::vector<int64_t>& axes) {
  const size_t rank = shape.size();
  std::vector<int64_t> strides(rank, 1);
  for (size_t i = rank; i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  std::vector<bool> reduced(rank, false);
  for (int64_t a : axes) reduced[static_cast<size_t>(a)] = true;
  // Enumerates offsets over the dims selected by `want` (row-major order).
  auto enumerate = [&](bool want) {
    std::vector<int64_t> offs{0};
    for (size_t d = 0; d < rank; ++d) {
      if (reduced[d] != want) continue;
      std::vector<int64_t> next;
      next.reserve(offs.size() * static_cast<size_t>(shape[d]));
      for (int64_t o : offs)
        for (int64_t i = 0; i < shape[d]; ++i) next.push_back(o + i * strides[d]);
      offs = std::move(next);
    }
    return offs;
  };
  ReducePlan p;
  p.base = enumerate(false);
  p.offsets = enumerate(true);
  p.contiguous = true;
  for (size_t i = 0; i < p.offsets.size(); ++i)
    if (p.offsets[i] != static_cast<int64_t>(i)) {
      p.contiguous = false;
      break;
    }
  return p;
}

// Integer reductions accumulate in int64 and wrap (two's complement, cpu/wrapping.h) where they
// overflow.
template <class T>
T reduce_set(const T* x, const ReducePlan& p, Red kind) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>;
  constexpr bool kFloat = std::is_floating_point_v<T>;
  auto add = [](Acc a, Acc b) -> Acc {
    if constexpr (kFloat) return a + b;
    else return wrapping_add(a, b);
  };
  auto mul = [](Acc a, Acc b) -> Acc {
    if constexpr (kFloat) return a * b;
    else return wrapping_mul(a, b);
  };
  const int64_t n = p.count();
  const int64_t* off = p.offsets.data();
  auto at = [&](int64_t i) { return p.contiguous ? x[i] : x[off[i]]; };
  switch (kind) {
    case Red::kMax: {
      T m = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
      for (int64_t i = 0; i < n; ++i) m = std::max(m, at(i));
      return m;
    }
    case Red::kMin: {
      T m = std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
      for (int64_t i = 0; i < n; ++i) m = std::min(m, at(i));
      return m;
    }
    case Red::kProd: {
      Acc a = 1;
      for (int64_t i = 0; i < n; ++i) a = mul(a, static_cast<Acc>(at(i)));
      return static_cast<T>(a);
    }
    case Red::kLogSumExp: {
      if constexpr (std::is_floating_point_v<T>) {
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t i = 0; i < n; ++i) m = std::max(m, at(i));
        if (std::isinf(m)) return m;  // empty set or all -inf (+inf: stays +inf)
        T s = 0;
        for (int64_t i = 0; i < n; ++i) s += std::exp(at(i) - m);
        return m + std::log(s);
      }
      return 0;
    }
    default: break;
  }
  Acc a = 0;
  if (kind == Red::kL1) {
    for (int64_t i = 0; i < n; ++i) {
      const Acc v = static_cast<Acc>(at(i));
      a = add(a, v < 0 ? mul(v, Acc(-1)) : v);  // |lowest| wraps to itself, not undefined
    }
  } else if (kind == Red::kL2 || kind == Red::kSumSquare) {
    for (int64_t i = 0; i < n; ++i) a = add(a, mul(static_cast<Acc>(at(i)), static_cast<Acc>(at(i))));
  } else {
    for (int64_t i = 0; i < n; ++i) a = add(a, static_cast<Acc>(at(i)));
  }
  if (kind == Red::kMean) {
    if constexpr (kFloat) return n ? a / static_cast<T>(n) : std::numeric_limits<T>::quiet_NaN();
    else return n ? static_cast<T>(a / n) : T(0);
  }
  if (kind == Red::kL2 || kind == Red::kLogSum) {
    const double r = kind == Red::kL2 ? std::sqrt(static_cast<double>(a)) : std::log(static_cast<double>(a));
    if constexpr (kFloat) return static_cast<T>(r);
    else return ir::saturating_integer<T>(r);  // fuzz_onnx_import: ReduceL2 of uint8 at 859.9
  }
  return static_cast<T>(a);
}

template <class T>
void reduce(const ir::Node& node, const std::vector<const Tensor*>& in, Tensor& out, Red kind) {
  const Tensor& x = *in[0];
  std::optional<std::vector<int64_t>> axes;
  if (in.size() > 1 && in[1]) axes = in[1]->to_int_vector();
  bool noop = false;
  std::vector<int64_t> red = ir::reduce_axes(node, axes, x.rank(), &noop);
  if (noop) {
    if (x.nbytes()) std::memcpy(out.raw(), x.raw(), x.nbytes());
    return;
  }
  T* py = out.data<T>();
  if (x.numel() == 0) {
    // Every output reduces the empty set. Not through plan_reduce: it enumerates the dims one
    // at a time, and [2^32, 1, 0] asked for 32 GB of offsets before reaching the 0 (fuzz smoke).
    const T identity = reduce_set(static_cast<const T*>(nullptr), ReducePlan{}, kind);
    std::fill(py, py + out.numel(), identity);
    return;
  }
  const ReducePlan p = plan_reduce(x.shape(), red);
  const T* px = x.data<T>();
  const int64_t outputs = static_cast<int64_t>(p.base.size());
  if (outputs != out.numel()) throw node.error(ErrorKind::kInternal, "reduce output size mismatch");
  parallel_for_each(outputs, x.numel() > 65536 && outputs > 1, [&](int64_t o) {
    py[o] = reduce_set(px + p.base[static_cast<size_t>(o)], p, kind);
  });
}

template <class T>
void arg_reduce(const ir::Node& node, const Tensor& x, Tensor& out) {
  const bool is_max = node.op == "ArgMax";
  const bool last = node.attrs.get_int("select_last_index", 0) != 0;
  int64_t axis = node.attrs.get_int("axis", 0);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank())
    throw node.error(ErrorKind::kInvalidArgument, "axis " + std::to_string(node.attrs.get_int("axis", 0)) +
                                                      " is out of range for an input of rank " + std::to_string(x.rank()));
  int64_t outer = 1, n = x.dim(static_cast<int>(axis)), inner = 1;
  for (int i = 0; i < x.rank(); ++i) {
    if (i < axis) outer *= x.dim(i);
    else if (i > axis) inner *= x.dim(i);
  }
  if (n == 0 && out.numel() > 0) throw node.error(ErrorKind::kInvalidArgument, "the reduced axis has size 0");
  const T* px = x.data<T>();
  int64_t* py = out.data<int64_t>();
  parallel_for_each(outer * inner, x.numel() > 65536, [&](int64_t l) {
    const T* line = px + (l / inner) * n * inner + (l % inner);
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      T v = line[i * inner], b = line[best * inner];
      bool better = is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
      if (better) best = i;
    }
    py[l] = best;
  });
}

template <class Fn>
bool dispatch(DType d, Fn&& fn) {
  switch (d) {
    case DType::kFloat32: fn(float{}); return true;
    case DType::kFloat64: fn(double{}); return true;
    case DType::kInt32: fn(int32_t{}); return true;
    case DType::kInt64: fn(int64_t{}); return true;
    case DType::kInt8: fn(int8_t{}); return true;
    case DType::kUInt8: fn(uint8_t{}); return true;
    default: return false;
  }
}

std::string check_types(const KernelInit& init) {
  if (dispatch(init.dtype(0), [](auto) {})) return "";
  // bool max/min are any/all: the uint8 kernel on the same bytes (0 or 1) computes them.
  if (init.dtype(0) == DType::kBool && (init.node.op == "ReduceMax" || init.node.op == "ReduceMin")) return "";
  return "input type " + to_string(init.dtype(0)) + " is not supported (supported: float32, float64, int32, int64, int8, uint8)";
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(reduce) {
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}) {
    KernelEntry e;
    e.op = op;
    e.check = check_types;
    e.dtypes = "float32, float64, int32, int64, int8, uint8 (bool: ReduceMax, ReduceMin)";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      Red kind = red_of(node->op);
      RunFn fn;
      if (init.dtype(0) == DType::kBool) {
        fn = [node, kind](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
          Tensor x = in[0]->bitcast(DType::kUInt8);
          Tensor y = out[0].bitcast(DType::kUInt8);
          std::vector<const Tensor*> inputs = in;
          inputs[0] = &x;
          reduce<uint8_t>(*node, inputs, y, kind);
        };
        return make_kernel(std::move(fn));
      }
      dispatch(init.dtype(0), [&](auto tag) {
        fn = [node, kind](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
          reduce<decltype(tag)>(*node, in, out[0], kind);
        };
      });
      return make_kernel(std::move(fn));
    };
    registry.add(std::move(e));
  }
  for (const char* op : {"ArgMax", "ArgMin"}) {
    KernelEntry e;
    e.op = op;
    e.check = check_types;
    e.dtypes = "float32, float64, int32, int64, int8, uint8";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      RunFn fn;
      dispatch(init.dtype(0), [&](auto tag) {
        fn = [node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
          arg_reduce<decltype(tag)>(*node, *in[0], out[0]);
        };
      });
      return make_kernel(std::move(fn));
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
