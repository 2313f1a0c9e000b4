// Which INT8 / FP8 convolution paths are fast on this GPU? Measures, per ResNet-50 conv shape
// at one batch, the fastest of every cuDNN engine the heuristics offer for:
//   fp16 graph:  conv(fp16) + bias + relu -> fp16            (what kiln's fp16 engine runs)
//   int8 graph:  conv(int8, int32 acc) * scale[k] + bias + relu -> int8 (and -> fp16)
//   fp8 graph:   conv(e4m3, fp32 acc) + bias + relu -> fp16
//   int8 legacy: cudnnConvolutionForward, int8 NHWC in, int8 / float out
// and for the 1x1 convolutions, which are plain GEMMs in NHWC, cuBLASLt's
//   int8 TN GEMM (int32 acc, per-row alpha vector, int8 out), fp8 e4m3 GEMM (fp16 out, bias+relu)
// Build: nvcc -O2 -arch=sm_90 -std=c++17 int8_conv_probe.cu -lcudnn -lcublasLt -o int8_conv_probe
// Prints one line per (shape, path): candidates tried, best time, effective TOPS.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#define CUDA_OK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1); } } while (0)

struct Shape { const char* name; int n, c, h, w, k, r, s, stride, pad; };

static int out_dim(int x, int r, int stride, int pad) { return (x + 2 * pad - r) / stride + 1; }

static float time_ms(const std::function<bool()>& run, int reps = 20) {
  if (!run()) return -1;
  if (cudaDeviceSynchronize() != cudaSuccess) { cudaGetLastError(); return -1; }
  for (int i = 0; i < 2; ++i) run();
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) run();
  cudaEventRecord(b);
  if (cudaEventSynchronize(b) != cudaSuccess) { cudaGetLastError(); return -1; }
  float ms = 0; cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a); cudaEventDestroy(b);
  return ms / reps;
}

// --- cuDNN graph API --------------------------------------------------------------------
struct Desc {
  cudnnBackendDescriptor_t d = nullptr;
  explicit Desc(cudnnBackendDescriptorType_t t) { cudnnBackendCreateDescriptor(t, &d); }
  ~Desc() { if (d) cudnnBackendDestroyDescriptor(d); }
  template <class T> Desc& set(cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t c, const T* v) {
    cudnnStatus_t s = cudnnBackendSetAttribute(d, n, t, c, v);
    if (s != CUDNN_STATUS_SUCCESS) ok = false;
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t n, const Desc& o) { cudnnBackendDescriptor_t v = o.d; return set(n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v); }
  bool finalize() { return ok && cudnnBackendFinalize(d) == CUDNN_STATUS_SUCCESS; }
  bool ok = true;
};
using P = std::shared_ptr<Desc>;

static P tensor(int64_t uid, cudnnDataType_t t, std::vector<int64_t> dims, bool nhwc_per_channel, bool virt) {
  auto d = std::make_shared<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  int64_t n = dims[0], c = dims[1], h = dims[2], w = dims[3]; (void)n;
  std::vector<int64_t> st = {h * w * c, 1, w * c, c};
  if (nhwc_per_channel) st = {c, 1, c, c};
  int64_t align = 16;
  d->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, st.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  bool v = virt;
  d->set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
  if (!d->finalize()) return nullptr;
  return d;
}

struct GraphVariant {
  const char* name;
  cudnnDataType_t in, comp, conv_out, y;
  bool scale;  // per-channel multiply after the conv
};

// Returns (candidates, finalized, best ms).
static void probe_graph(cudnnHandle_t h, const Shape& s, const GraphVariant& v, void* x, void* w, void* sc, void* bias,
                        void* y, void* ws, size_t ws_bytes) {
  const int oh = out_dim(s.h, s.r, s.stride, s.pad), ow = out_dim(s.w, s.s, s.stride, s.pad);
  std::vector<int64_t> xd = {s.n, s.c, s.h, s.w}, wd = {s.k, s.c, s.r, s.s}, yd = {s.n, s.k, oh, ow}, cd = {1, s.k, 1, 1};
  std::vector<P> keep;
  auto X = tensor('x', v.in, xd, false, false), W = tensor('w', v.in, wd, false, false);
  auto S = tensor('s', CUDNN_DATA_FLOAT, cd, true, false), B = tensor('b', CUDNN_DATA_FLOAT, cd, true, false);
  auto A = tensor(100, v.conv_out, yd, false, true), A2 = tensor(101, CUDNN_DATA_FLOAT, yd, false, true),
       A3 = tensor(102, CUDNN_DATA_FLOAT, yd, false, true), Y = tensor('y', v.y, yd, false, false);
  if (!X || !W || !S || !B || !A || !A2 || !A3 || !Y) { std::printf("%-22s %-16s tensor descriptors refused\n", s.name, v.name); return; }
  Desc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  int64_t sp = 2, dil[2] = {1, 1}, str[2] = {s.stride, s.stride}, pad[2] = {s.pad, s.pad};
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &v.comp)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &sp)
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil)
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str)
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad)
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  if (!conv.finalize()) { std::printf("%-22s %-16s conv descriptor refused\n", s.name, v.name); return; }
  float alpha = 1, beta = 0;
  Desc cop(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  cop.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, *X).set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, *W)
      .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *A).set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  if (!cop.finalize()) { std::printf("%-22s %-16s conv op refused\n", s.name, v.name); return; }
  std::vector<std::shared_ptr<Desc>> ops_keep;
  auto pw = [&](cudnnPointwiseMode_t m, const P& in, const P& operand, const P& out) -> bool {
    auto d = std::make_shared<Desc>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    d->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m).set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f);
    if (!d->finalize()) return false;
    auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *d).set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *in)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *out);
    if (operand) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *operand);
    if (!op->finalize()) return false;
    ops_keep.push_back(d);
    ops_keep.push_back(op);
    return true;
  };
  bool ok = v.scale ? pw(CUDNN_POINTWISE_MUL, A, S, A2) && pw(CUDNN_POINTWISE_ADD, A2, B, A3)
                    : pw(CUDNN_POINTWISE_ADD, A, B, A3);
  ok = ok && pw(CUDNN_POINTWISE_RELU_FWD, A3, nullptr, Y);
  if (!ok) { std::printf("%-22s %-16s pointwise ops refused\n", s.name, v.name); return; }
  std::vector<cudnnBackendDescriptor_t> raw = {cop.d};
  for (size_t i = 1; i < ops_keep.size(); i += 2) raw.push_back(ops_keep[i]->d);
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)raw.size(), raw.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  if (!graph.finalize()) { std::printf("%-22s %-16s operation graph refused\n", s.name, v.name); return; }
  int total = 0, finalized = 0;
  float best = -1;
  std::string best_name;
  for (cudnnBackendHeurMode_t hm : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph).set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm);
    if (!heur.finalize()) continue;
    int64_t count = 0;
    cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
    std::vector<cudnnBackendDescriptor_t> cfgs(count);
    for (auto& c : cfgs) cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c);
    int64_t got = 0;
    cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs.data());
    for (int64_t i = 0; i < got && i < 12; ++i) {
      ++total;
      Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
      if (!plan.finalize()) continue;
      int64_t wsz = 0, n = 0;
      cudnnBackendGetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &wsz);
      if ((size_t)wsz > ws_bytes) continue;
      ++finalized;
      std::vector<int64_t> uids = {'x', 'w', 'b', 'y'};
      std::vector<void*> ptrs = {x, w, bias, y};
      if (v.scale) { uids.push_back('s'); ptrs.push_back(sc); }
      Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
      pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data())
          .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data())
          .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
      if (!pack.finalize()) continue;
      float ms = time_ms([&] { return cudnnBackendExecute(h, plan.d, pack.d) == CUDNN_STATUS_SUCCESS; });
      if (ms > 0 && (best < 0 || ms < best)) {
        best = ms;
        Desc eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        int64_t idx = -1;
        cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng.d);
        cudnnBackendGetAttribute(eng.d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &idx);
        best_name = (hm == CUDNN_HEUR_MODE_A ? "A:eng" : "F:eng") + std::to_string(idx);
      }
    }
    for (auto& c : cfgs) cudnnBackendDestroyDescriptor(c);
  }
  // Every engine of the library (not only the heuristics' list), with default knobs.
  if (getenv("PROBE_ALL_ENGINES")) {
    int64_t count = 0, n = 0;
    cudnnBackendGetAttribute(graph.d, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &n, &count);
    for (int64_t e = 0; e < count; ++e) {
      Desc eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      eng.set_desc(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph).set(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &e);
      if (!eng.finalize()) continue;
      Desc cfg(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      cfg.set_desc(CUDNN_ATTR_ENGINECFG_ENGINE, eng);
      if (!cfg.finalize()) continue;
      Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg.d);
      if (!plan.finalize()) continue;
      int64_t wsz = 0;
      cudnnBackendGetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &wsz);
      if ((size_t)wsz > ws_bytes) continue;
      ++total, ++finalized;
      std::vector<int64_t> uids = {'x', 'w', 'b', 'y'};
      std::vector<void*> ptrs = {x, w, bias, y};
      if (v.scale) { uids.push_back('s'); ptrs.push_back(sc); }
      Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
      pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data())
          .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data())
          .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
      if (!pack.finalize()) continue;
      float ms = time_ms([&] { return cudnnBackendExecute(h, plan.d, pack.d) == CUDNN_STATUS_SUCCESS; });
      std::printf("%-22s %-16s   engine %lld: %.4f ms\n", s.name, v.name, (long long)e, ms);
      if (ms > 0 && (best < 0 || ms < best)) best = ms, best_name = "G:eng" + std::to_string(e);
    }
  }
  const double flops = 2.0 * s.n * s.k * oh * ow * s.c * s.r * s.s;
  if (best > 0)
    std::printf("%-22s %-16s %2d cand %2d ok  best %.4f ms  %6.1f TOPS  %s\n", s.name, v.name, total, finalized, best,
                flops / best / 1e9, best_name.c_str());
  else
    std::printf("%-22s %-16s %2d cand %2d ok  none ran\n", s.name, v.name, total, finalized);
}

// --- residual epilogues: which form of "+ Z" costs what (PROBE_RESIDUAL=1) ------------------
// mode 0: int8 X/W, MUL s, ADD b, ADD Z(int8), MUL m, RELU -> int8      (kiln v1)
// mode 1: same with Z float16, no MUL m
// mode 2: same with Z int8, no MUL m (equal scales)
// mode 3: Z int8 pre-scaled by its own MUL (a DAG), then ADD, RELU
// mode 4: float16 conv: ADD b, ADD Z(fp16), RELU -> fp16                (the fp16 engine)
// mode 5: int8 X/W, MUL s, ADD b, ADD Z(int8), RELU, MUL m -> int8 (multiplier after the activation)
static void probe_residual(cudnnHandle_t h, const Shape& s, int mode, void* x, void* w, void* sc, void* bias, void* z,
                           void* y, void* ws, size_t ws_bytes) {
  const int oh = out_dim(s.h, s.r, s.stride, s.pad), ow = out_dim(s.w, s.s, s.stride, s.pad);
  std::vector<int64_t> xd = {s.n, s.c, s.h, s.w}, wd = {s.k, s.c, s.r, s.s}, yd = {s.n, s.k, oh, ow}, cd = {1, s.k, 1, 1};
  const bool fp16 = mode == 4;
  const cudnnDataType_t in = fp16 ? CUDNN_DATA_HALF : CUDNN_DATA_INT8;
  const cudnnDataType_t zt = (mode == 1 || mode == 4) ? CUDNN_DATA_HALF : CUDNN_DATA_INT8;
  auto X = tensor('x', in, xd, false, false), W = tensor('w', in, wd, false, false);
  auto S = tensor('s', CUDNN_DATA_FLOAT, cd, true, false), B = tensor('b', fp16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT, cd, true, false);
  auto M = tensor('m', CUDNN_DATA_FLOAT, cd, true, false), Z = tensor('z', zt, yd, false, false);
  auto Y = tensor('y', fp16 ? CUDNN_DATA_HALF : CUDNN_DATA_INT8, yd, false, false);
  int64_t vid = 200;
  auto V = [&](cudnnDataType_t t) { return tensor(vid++, t, yd, false, true); };
  Desc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  int64_t sp = 2, dil[2] = {1, 1}, str[2] = {s.stride, s.stride}, pad[2] = {s.pad, s.pad};
  cudnnConvolutionMode_t cm = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t comp = fp16 ? CUDNN_DATA_FLOAT : CUDNN_DATA_INT32;
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &cm)
      .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &sp)
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil)
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str)
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad)
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  conv.finalize();
  auto A = V(fp16 ? CUDNN_DATA_FLOAT : CUDNN_DATA_INT32);
  float alpha = 1, beta = 0;
  Desc cop(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  cop.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, *X).set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, *W)
      .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *A).set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  cop.finalize();
  std::vector<std::shared_ptr<Desc>> keep;
  std::vector<cudnnBackendDescriptor_t> raw = {cop.d};
  auto pw = [&](cudnnPointwiseMode_t m, const P& a, const P& b, const P& out) {
    auto d = std::make_shared<Desc>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    d->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m).set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f);
    d->finalize();
    auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *d).set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *a)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *out);
    if (b) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    op->finalize();
    keep.push_back(d), keep.push_back(op);
    raw.push_back(op->d);
  };
  std::vector<int64_t> uids = {'x', 'w', 'b', 'z', 'y'};
  std::vector<void*> ptrs = {x, w, bias, z, y};
  if (fp16) {
    auto a1 = V(CUDNN_DATA_FLOAT), a2 = V(CUDNN_DATA_FLOAT);
    pw(CUDNN_POINTWISE_ADD, A, B, a1), pw(CUDNN_POINTWISE_ADD, a1, Z, a2), pw(CUDNN_POINTWISE_RELU_FWD, a2, nullptr, Y);
  } else {
    uids.push_back('s'), ptrs.push_back(sc);
    auto a1 = V(CUDNN_DATA_FLOAT), a2 = V(CUDNN_DATA_FLOAT), a3 = V(CUDNN_DATA_FLOAT);
    pw(CUDNN_POINTWISE_MUL, A, S, a1), pw(CUDNN_POINTWISE_ADD, a1, B, a2);
    if (mode == 0) {
      auto a4 = V(CUDNN_DATA_FLOAT);
      pw(CUDNN_POINTWISE_ADD, a2, Z, a3), pw(CUDNN_POINTWISE_MUL, a3, M, a4), pw(CUDNN_POINTWISE_RELU_FWD, a4, nullptr, Y);
      uids.push_back('m'), ptrs.push_back(sc);
    } else if (mode == 1 || mode == 2) {
      pw(CUDNN_POINTWISE_ADD, a2, Z, a3), pw(CUDNN_POINTWISE_RELU_FWD, a3, nullptr, Y);
    } else if (mode == 3) {
      auto zs = V(CUDNN_DATA_FLOAT);
      pw(CUDNN_POINTWISE_MUL, Z, M, zs), pw(CUDNN_POINTWISE_ADD, a2, zs, a3), pw(CUDNN_POINTWISE_RELU_FWD, a3, nullptr, Y);
      uids.push_back('m'), ptrs.push_back(sc);
    } else if (mode == 5) {
      auto a4 = V(CUDNN_DATA_FLOAT);
      pw(CUDNN_POINTWISE_ADD, a2, Z, a3), pw(CUDNN_POINTWISE_RELU_FWD, a3, nullptr, a4), pw(CUDNN_POINTWISE_MUL, a4, M, Y);
      uids.push_back('m'), ptrs.push_back(sc);
    }
  }
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)raw.size(), raw.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  if (!graph.finalize()) { std::printf("%-22s residual mode %d: graph refused\n", s.name, mode); return; }
  float best = -1; int64_t best_e = -1; int ran = 0;
  int64_t count = 0, n = 0;
  cudnnBackendGetAttribute(graph.d, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &n, &count);
  for (int64_t e = 0; e < count; ++e) {
    Desc eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    eng.set_desc(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph).set(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &e);
    if (!eng.finalize()) continue;
    Desc cfg(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    cfg.set_desc(CUDNN_ATTR_ENGINECFG_ENGINE, eng);
    if (!cfg.finalize()) continue;
    Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h)
        .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg.d);
    if (!plan.finalize()) continue;
    int64_t wsz = 0;
    cudnnBackendGetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &wsz);
    if ((size_t)wsz > ws_bytes) continue;
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data())
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data())
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (!pack.finalize()) continue;
    float ms = time_ms([&] { return cudnnBackendExecute(h, plan.d, pack.d) == CUDNN_STATUS_SUCCESS; });
    if (ms > 0) ++ran;
    if (ms > 0 && (best < 0 || ms < best)) best = ms, best_e = e;
  }
  std::printf("%-22s residual mode %d: %d engines ran, best %.4f ms (engine %lld)\n", s.name, mode, ran, best, (long long)best_e);
}

// --- legacy cuDNN int8 --------------------------------------------------------------------
static void probe_legacy_int8(cudnnHandle_t h, const Shape& s, bool float_out, void* x, void* w, void* y, void* ws, size_t ws_bytes) {
  const int oh = out_dim(s.h, s.r, s.stride, s.pad), ow = out_dim(s.w, s.s, s.stride, s.pad);
  cudnnTensorDescriptor_t xd, yd; cudnnFilterDescriptor_t wd; cudnnConvolutionDescriptor_t cd;
  cudnnCreateTensorDescriptor(&xd); cudnnCreateTensorDescriptor(&yd); cudnnCreateFilterDescriptor(&wd); cudnnCreateConvolutionDescriptor(&cd);
  cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NHWC, CUDNN_DATA_INT8, s.n, s.c, s.h, s.w);
  cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NHWC, float_out ? CUDNN_DATA_FLOAT : CUDNN_DATA_INT8, s.n, s.k, oh, ow);
  cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_INT8, CUDNN_TENSOR_NHWC, s.k, s.c, s.r, s.s);
  cudnnSetConvolution2dDescriptor(cd, s.pad, s.pad, s.stride, s.stride, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_INT32);
  cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH);
  float best = -1; int best_algo = -1;
  for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; ++a) {
    size_t need = 0;
    if (cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, (cudnnConvolutionFwdAlgo_t)a, &need) != CUDNN_STATUS_SUCCESS) continue;
    if (need > ws_bytes) continue;
    float alpha = 1, beta = 0;
    float ms = time_ms([&] {
      return cudnnConvolutionForward(h, &alpha, xd, x, wd, w, cd, (cudnnConvolutionFwdAlgo_t)a, ws, ws_bytes, &beta, yd, y) == CUDNN_STATUS_SUCCESS;
    });
    if (ms > 0 && (best < 0 || ms < best)) best = ms, best_algo = a;
  }
  const double flops = 2.0 * s.n * s.k * oh * ow * s.c * s.r * s.s;
  if (best > 0) std::printf("%-22s %-16s best %.4f ms  %6.1f TOPS  algo %d\n", s.name, float_out ? "legacy int8>f32" : "legacy int8>i8", best, flops / best / 1e9, best_algo);
  else std::printf("%-22s %-16s none ran\n", s.name, float_out ? "legacy int8>f32" : "legacy int8>i8");
  cudnnDestroyTensorDescriptor(xd); cudnnDestroyTensorDescriptor(yd); cudnnDestroyFilterDescriptor(wd); cudnnDestroyConvolutionDescriptor(cd);
}

// --- cuBLASLt GEMMs for 1x1 convs: D[Cout, P] = W^T(Cout x Cin) * X(Cin x P), all column-major.
struct LtVariant { const char* name; cudaDataType_t ab, d; cublasComputeType_t comp; cudaDataType_t scale; int mode; };
// mode 0: plain; 1: alpha per row (device vector); 2: bias+relu epilogue (fp8/fp16); 3: fp8 with A/B scale pointers + bias relu

static void probe_lt(cublasLtHandle_t lt, const Shape& s, const LtVariant& v, void* a, void* b, void* d, void* alpha_vec,
                     void* bias, void* scale_ab, void* ws, size_t ws_bytes) {
  const int64_t M = s.k, N = (int64_t)s.n * s.h * s.w, K = s.c;
  cublasLtMatmulDesc_t op; cublasLtMatrixLayout_t la, lb, ld; cublasLtMatmulPreference_t pref;
  if (cublasLtMatmulDescCreate(&op, v.comp, v.scale) != CUBLAS_STATUS_SUCCESS) { std::printf("%-22s %-16s desc refused\n", s.name, v.name); return; }
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  if (v.mode == 1) {
    cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm);
  }
  if (v.mode >= 2) {
    cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_RELU_BIAS;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    cudaDataType_t bt = CUDA_R_16F;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
  }
  if (v.mode == 3) {
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_ab, sizeof scale_ab);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_ab, sizeof scale_ab);
  }
  cublasLtMatrixLayoutCreate(&la, v.ab, K, M, K);
  cublasLtMatrixLayoutCreate(&lb, v.ab, K, N, K);
  cublasLtMatrixLayoutCreate(&ld, v.d, M, N, M);
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
  cublasLtMatmulHeuristicResult_t res[16];
  int got = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 16, res, &got);
  float best = -1; int best_i = -1;
  float one = 1, zero = 0;
  int32_t ione = 1, izero = 0;
  const void* alpha = v.mode == 1 ? alpha_vec : (v.scale == CUDA_R_32I ? (const void*)&ione : (const void*)&one);
  const void* beta = v.scale == CUDA_R_32I ? (const void*)&izero : (const void*)&zero;
  for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < got; ++i) {
    float ms = time_ms([&] {
      return cublasLtMatmul(lt, op, alpha, a, la, b, lb, beta, d, ld, d, ld, &res[i].algo, ws, ws_bytes, 0) == CUBLAS_STATUS_SUCCESS;
    });
    if (ms > 0 && (best < 0 || ms < best)) best = ms, best_i = i;
  }
  const double flops = 2.0 * M * N * K;
  if (best > 0) std::printf("%-22s %-16s %2d cand  best %.4f ms  %6.1f TOPS  #%d\n", s.name, v.name, got, best, flops / best / 1e9, best_i);
  else std::printf("%-22s %-16s heuristic status %d, %d cand, none ran\n", s.name, v.name, (int)st, got);
  cublasLtMatmulPreferenceDestroy(pref); cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld); cublasLtMatmulDescDestroy(op);
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 128;
  cudaDeviceProp prop; cudaGetDeviceProperties(&prop, 0);
  std::printf("GPU %s, cuDNN %zu, cuBLASLt %zu, batch %d\n", prop.name, cudnnGetVersion(), cublasLtGetVersion(), n);
  std::vector<Shape> shapes = {
      {"1x1 56x56 64->256", n, 64, 56, 56, 256, 1, 1, 1, 0},   {"1x1 56x56 256->64", n, 256, 56, 56, 64, 1, 1, 1, 0},
      {"1x1 28x28 512->128", n, 512, 28, 28, 128, 1, 1, 1, 0}, {"1x1 14x14 1024->256", n, 1024, 14, 14, 256, 1, 1, 1, 0},
      {"1x1 7x7 2048->512", n, 2048, 7, 7, 512, 1, 1, 1, 0},    {"1x1 28x28 128->512", n, 128, 28, 28, 512, 1, 1, 1, 0},    {"3x3 56x56 64", n, 64, 56, 56, 64, 3, 3, 1, 1},
      {"3x3 28x28 128", n, 128, 28, 28, 128, 3, 3, 1, 1},       {"3x3 14x14 256", n, 256, 14, 14, 256, 3, 3, 1, 1},
      {"3x3 7x7 512", n, 512, 7, 7, 512, 3, 3, 1, 1},           {"3x3 s2 56->28 128", n, 128, 56, 56, 128, 3, 3, 2, 1},
  };
  cudnnHandle_t h; cudnnCreate(&h);
  cublasLtHandle_t lt; cublasLtCreate(&lt);
  const size_t big = size_t(512) << 20, ws_bytes = size_t(256) << 20;
  void *x, *w, *y, *sc, *bias, *ws, *alpha_vec, *scale_ab, *bias16;
  CUDA_OK(cudaMalloc(&x, big)); CUDA_OK(cudaMalloc(&w, 64 << 20)); CUDA_OK(cudaMalloc(&y, big));
  CUDA_OK(cudaMalloc(&sc, 1 << 16)); CUDA_OK(cudaMalloc(&bias, 1 << 16)); CUDA_OK(cudaMalloc(&ws, ws_bytes));
  CUDA_OK(cudaMalloc(&alpha_vec, 1 << 16)); CUDA_OK(cudaMalloc(&scale_ab, 64)); CUDA_OK(cudaMalloc(&bias16, 1 << 16));
  CUDA_OK(cudaMemset(x, 1, big)); CUDA_OK(cudaMemset(w, 1, 64 << 20)); CUDA_OK(cudaMemset(sc, 0, 1 << 16));
  CUDA_OK(cudaMemset(bias, 0, 1 << 16)); CUDA_OK(cudaMemset(alpha_vec, 0, 1 << 16)); CUDA_OK(cudaMemset(scale_ab, 0, 64));
  CUDA_OK(cudaMemset(bias16, 0, 1 << 16));
  const GraphVariant graph_variants[] = {
      {"graph fp16", CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DATA_HALF, false},
      {"graph int8>i8", CUDNN_DATA_INT8, CUDNN_DATA_INT32, CUDNN_DATA_INT32, CUDNN_DATA_INT8, true},
      {"graph int8>i8 f", CUDNN_DATA_INT8, CUDNN_DATA_INT32, CUDNN_DATA_FLOAT, CUDNN_DATA_INT8, true},
      {"graph int8>f16", CUDNN_DATA_INT8, CUDNN_DATA_INT32, CUDNN_DATA_INT32, CUDNN_DATA_HALF, true},
      {"graph fp8>f16", CUDNN_DATA_FP8_E4M3, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DATA_HALF, false},
      {"graph fp8>fp8", CUDNN_DATA_FP8_E4M3, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DATA_FP8_E4M3, true},
  };
  const LtVariant lt_variants[] = {
      {"lt fp16 bias", CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, 2},
      {"lt int8>i32", CUDA_R_8I, CUDA_R_32I, CUBLAS_COMPUTE_32I, CUDA_R_32I, 0},
      {"lt int8>i8 avec", CUDA_R_8I, CUDA_R_8I, CUBLAS_COMPUTE_32I, CUDA_R_32F, 1},
      {"lt int8>i8", CUDA_R_8I, CUDA_R_8I, CUBLAS_COMPUTE_32I, CUDA_R_32F, 0},
      {"lt fp8>f16 bias", CUDA_R_8F_E4M3, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, 3},
  };
  if (getenv("PROBE_RESIDUAL")) {
    void* z;
    CUDA_OK(cudaMalloc(&z, big));
    CUDA_OK(cudaMemset(z, 1, big));
    for (const Shape& s : shapes)
      if (s.r == 1 || s.k == 64)
        for (int mode = 0; mode <= 5; ++mode) probe_residual(h, s, mode, x, w, sc, bias, z, y, ws, ws_bytes), std::fflush(stdout);
    return 0;
  }
  const bool only_int8 = getenv("PROBE_ALL_ENGINES") != nullptr;
  for (const Shape& s : shapes) {
    for (const GraphVariant& v : graph_variants)
      if (!only_int8 || std::string(v.name) == "graph int8>i8" || std::string(v.name) == "graph fp16")
        probe_graph(h, s, v, x, w, sc, bias, y, ws, ws_bytes);
    if (only_int8) continue;
    probe_legacy_int8(h, s, false, x, w, y, ws, ws_bytes);
    probe_legacy_int8(h, s, true, x, w, y, ws, ws_bytes);
    if (s.r == 1)
      for (const LtVariant& v : lt_variants) probe_lt(lt, s, v, w, x, y, alpha_vec, bias16, scale_ab, ws, ws_bytes);
    std::fflush(stdout);
  }
  return 0;
}
