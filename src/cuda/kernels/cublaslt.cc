#include "cuda/kernels/cublaslt.h"

#include "cuda/runtime/check.h"

namespace kiln::cuda {

int cublaslt_candidates(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                        cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, size_t workspace_bytes, int max,
                        cublasLtMatmulHeuristicResult_t* results) {
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = workspace_bytes;
  const cublasStatus_t set =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  int count = 0;
  const cublasStatus_t st =
      set == CUBLAS_STATUS_SUCCESS ? cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref, max, results, &count) : set;
  cublasLtMatmulPreferenceDestroy(pref);
  KILN_CUBLAS_CHECK(set);
  return st == CUBLAS_STATUS_SUCCESS ? count : 0;
}

}  // namespace kiln::cuda
