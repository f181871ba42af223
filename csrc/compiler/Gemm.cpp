#include "Gemm.h"

#include <c10/util/Exception.h>

#include <vector>

namespace my_device::compiler {

bool GemmKernel::suits(int64_t m, int64_t n, int64_t k) {
  return m > 0 && n > 0 && k > 0 && n <= kMaxGemmColumns && m * n * k <= kMaxGemmWork;
}

namespace {

// Strides that broadcast `bias` over an [m, n] result (0 along broadcast dims).
void bias_strides(const at::Tensor& bias, int64_t m, int64_t n, int64_t& si, int64_t& sj) {
  si = sj = 0;
  const int64_t d = bias.dim();
  TORCH_CHECK(d <= 2, "mydev gemm: bias of ", d, " dims");
  if (d >= 1 && bias.size(d - 1) == n && n > 1) sj = bias.stride(d - 1);
  if (d == 2 && bias.size(0) == m && m > 1) si = bias.stride(0);
}

} // namespace

void GemmKernel::run(const at::Tensor& out, const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) const {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  TORCH_CHECK(b.size(0) == k && out.size(0) == m && out.size(1) == n, "mydev gemm: shapes [", m, ",", k, "] @ [",
              b.size(0), ",", n, "] -> [", out.size(0), ",", out.size(1), "]");
  const float* A = a.const_data_ptr<float>();
  const int64_t as0 = a.stride(0), as1 = a.stride(1);
  // The inner loop runs along b's rows: make them contiguous unless they are.
  thread_local std::vector<float> packed;
  const float* B = b.const_data_ptr<float>();
  if (b.stride(1) != 1 || (k > 1 && b.stride(0) != n)) {
    packed.resize(static_cast<size_t>(k * n));
    const int64_t bs0 = b.stride(0), bs1 = b.stride(1);
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t j = 0; j < n; ++j) packed[kk * n + j] = B[kk * bs0 + j * bs1];
    }
    B = packed.data();
  }
  const bool use_bias = has_bias && beta != 0;
  const float* C = use_bias ? bias.const_data_ptr<float>() : nullptr;
  int64_t ci = 0, cj = 0;
  if (use_bias) bias_strides(bias, m, n, ci, cj);
  float* O = out.mutable_data_ptr<float>();
  const int64_t os0 = out.stride(0), os1 = out.stride(1);
  float acc[kMaxGemmColumns];
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) acc[j] = 0;
    for (int64_t kk = 0; kk < k; ++kk) {
      const float x = A[i * as0 + kk * as1];
      const float* __restrict row = B + kk * n;
      float* __restrict dst = acc;
      for (int64_t j = 0; j < n; ++j) dst[j] += x * row[j];
    }
    float* o = O + i * os0;
    for (int64_t j = 0; j < n; ++j) {
      float v = alpha == 1 ? acc[j] : alpha * acc[j];
      if (use_bias) v += (beta == 1 ? C[i * ci + j * cj] : beta * C[i * ci + j * cj]);
      o[j * os1] = v;
    }
  }
}

} // namespace my_device::compiler
