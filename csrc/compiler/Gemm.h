#pragma once
// A small matrix product as one program step: out = beta * bias + alpha * (a @ b)
// on Float matrices, the addmm/mm of a Linear layer and of its gradients.
//
// Why not the CPU kernel: at a few thousand multiply-adds, aten::addmm.out
// spends most of its time outside the arithmetic (structured meta checks,
// the bias expand and copy, the BLAS library's call and packing), about 2 us
// per call here, more than the rest of a small program. The compiler knows
// each operand's geometry when it compiles, so it takes this kernel for
// products small enough that a plain loop wins (kMaxGemmWork), and the BLAS
// call above that.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace my_device::compiler {

// Multiply-adds (m * n * k) up to which a product runs as a Gemm step.
constexpr int64_t kMaxGemmWork = 64 * 64 * 64;
// Columns up to which the kernel's accumulator row stays on the stack.
constexpr int64_t kMaxGemmColumns = 1024;

struct GemmKernel {
  bool has_bias = false;
  float beta = 1;
  float alpha = 1;

  // Whether a Float product of these sizes runs as a Gemm step.
  static bool suits(int64_t m, int64_t n, int64_t k);
  // `out` [m, n], `a` [m, k], `b` [k, n], any strides; `bias` broadcasts to
  // [m, n] (ignored when beta is 0, as addmm ignores it). Host tensors.
  void run(const at::Tensor& out, const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) const;
};

} // namespace my_device::compiler
