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

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MYDEV_GEMM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MYDEV_GEMM_CLONES
#endif

// Sum of x[i] * y[i] over 8 running partial sums, a pattern the compiler
// turns into vector multiply-adds (a plain float sum is never reordered).
inline float dot(const float* __restrict x, const float* __restrict y, int64_t k) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    for (int l = 0; l < 8; ++l) part[l] += x[i + l] * y[i + l];
  }
  float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < k; ++i) sum += x[i] * y[i];
  return sum;
}

// acc = a_row @ b, b row-major [k, n].
MYDEV_GEMM_CLONES void row_times_matrix(float* __restrict acc, const float* a, int64_t as1, const float* b, int64_t k,
                                        int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] = 0;
  for (int64_t kk = 0; kk < k; ++kk) {
    const float x = a[kk * as1];
    const float* __restrict row = b + kk * n;
    for (int64_t j = 0; j < n; ++j) acc[j] += x * row[j];
  }
}

// acc[j] = a_row . column j of b, each column contiguous (b = w.t(), w row-major).
MYDEV_GEMM_CLONES void row_times_columns(float* __restrict acc, const float* a, const float* b, int64_t bs1, int64_t k,
                                         int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] = dot(a, b + j * bs1, k);
}

} // namespace

void GemmKernel::run(const at::Tensor& out, const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) const {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  TORCH_CHECK(b.size(0) == k && out.size(0) == m && out.size(1) == n, "mydev gemm: shapes [", m, ",", k, "] @ [",
              b.size(0), ",", n, "] -> [", out.size(0), ",", out.size(1), "]");
  const float* A = a.const_data_ptr<float>();
  const int64_t as0 = a.stride(0), as1 = a.stride(1);
  const float* B = b.const_data_ptr<float>();
  // A Linear layer's weight arrives transposed: its columns are contiguous,
  // and each output is a dot product. Otherwise the inner loop runs along b's
  // rows, made contiguous unless they are.
  const bool columns = as1 == 1 && b.stride(0) == 1 && k > 1;
  thread_local std::vector<float> packed;
  if (!columns && (b.stride(1) != 1 || (k > 1 && b.stride(0) != n))) {
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
    if (columns) {
      row_times_columns(acc, A + i * as0, B, b.stride(1), k, n);
    } else {
      row_times_matrix(acc, A + i * as0, as1, B, k, n);
    }
    float* o = O + i * os0;
    for (int64_t j = 0; j < n; ++j) {
      // alpha 0 leaves the product out, Inf and NaN included, as BLAS does.
      float v = alpha == 1 ? acc[j] : (alpha == 0 ? 0.0f : alpha * acc[j]);
      if (use_bias) v += (beta == 1 ? C[i * ci + j * cj] : beta * C[i * ci + j * cj]);
      o[j * os1] = v;
    }
  }
}

} // namespace my_device::compiler
