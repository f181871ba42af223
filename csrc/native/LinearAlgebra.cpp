// Matrix products as queued structured kernels (StructuredKernel.h): the
// shape of a product is known before it runs, so mm/addmm/bmm on any size go to
// the stream instead of running at the call.
#include "StructuredKernel.h"

#include "core/ComputeUnits.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/addmm_native.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/bmm_native.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mm_native.h>
#include <torch/library.h>

namespace my_device::structured {

// A queued product big enough for it runs in row blocks on the device's
// compute units, as a compiled program's products do. Its kernel runs with one
// intra-op thread fewer than the cores (kernel_intra_op_threads), the host's;
// but while the host waits for the device that core idles, and a model whose
// time is its products (nanoGPT's at two threads) ran 1.3x the CPU's eager
// step. A block of rows is the whole product's rows, bit for bit: each output
// element's sum runs over the same depth in the same order.
struct mm_in_row_blocks : at::native::structured_mm_out_cpu {
  void impl(const at::Tensor& self, const at::Tensor& mat2, const at::Tensor& out) {
    run_blocks(out.size(0), product_row_parts(out.size(0), out.size(1), self.size(1)),
                   [&](int64_t lo, int64_t rows) {
                     if (rows == out.size(0)) return structured_mm_out_cpu::impl(self, mat2, out);
                     structured_mm_out_cpu::impl(self.narrow(0, lo, rows), mat2, out.narrow(0, lo, rows));
                   });
  }
};

struct addmm_in_row_blocks : at::native::structured_addmm_out_cpu {
  void impl(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const at::Scalar& beta,
            const at::Scalar& alpha, const at::Tensor& out) {
    const int64_t m = out.size(0);
    run_blocks(m, product_row_parts(m, out.size(1), mat1.size(1)), [&](int64_t lo, int64_t rows) {
      if (rows == m) return structured_addmm_out_cpu::impl(self, mat1, mat2, beta, alpha, out);
      // (impl() broadcasts the bias to its rows: one with a row per output row gives its block.)
      const at::Tensor bias = self.dim() == 2 && self.size(0) == m && m > 1 ? self.narrow(0, lo, rows) : self;
      structured_addmm_out_cpu::impl(bias, mat1.narrow(0, lo, rows), mat2, beta, alpha, out.narrow(0, lo, rows));
    });
  }
};

// mm's and addmm's impl() call BLAS on the data pointers, with the operands'
// strides; an operand BLAS cannot take as it is gets cloned, and addmm copies
// its bias into the output (ops on the tensors). On x86 it has no oneDNN path.
// (Not bmm: its impl() may hand the tensors to oneDNN, which takes CPU tensors only.)
template <>
struct RunsOnDeviceTensors<mm_in_row_blocks> : OnDeviceTensors {};
template <>
struct RunsOnDeviceTensors<addmm_in_row_blocks> : OnDeviceTensors {};
} // namespace my_device::structured

namespace my_device {
namespace {

using namespace structured;

// The CPU kernels lack some dtypes (bool) and say so only when they run. Such
// calls go through the host kernel, which runs a dtype signature's first call
// at the call, so that the error comes there, and queues later ones.
bool queueable(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type());
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  check_same_device("mm", {{"self", self}, {"mat2", mat2}});
  if (!queueable(self)) return run_host_kernel("aten::mm", self, mat2)[0].toTensor();
  return functional<mm_in_row_blocks>("aten::mm", self, mat2);
}

at::Tensor bmm(const at::Tensor& self, const at::Tensor& mat2) {
  check_same_device("bmm", {{"self", self}, {"mat2", mat2}});
  if (!queueable(self)) return run_host_kernel("aten::bmm", self, mat2)[0].toTensor();
  return functional<at::native::structured_bmm_out_cpu>("aten::bmm", self, mat2);
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  check_same_device("addmm", {{"self", self}, {"mat1", mat1}, {"mat2", mat2}});
  if (!queueable(mat1)) return run_host_kernel("aten::addmm", self, mat1, mat2, beta, alpha)[0].toTensor();
  return functional<addmm_in_row_blocks>("aten::addmm", self, mat1, mat2, beta, alpha);
}

// out= (Inductor's extern products write into its buffers this way). An out
// sharing memory with an operand takes the host kernel, which runs the CPU's
// kernel whole: a block of rows would read what another block wrote.
bool shares_memory(const at::Tensor& out, std::initializer_list<const at::Tensor*> operands) {
  for (const at::Tensor* t : operands) {
    if (t->defined() && out.is_alias_of(*t)) return true;
  }
  return false;
}

at::Tensor& mm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  check_same_device("mm", {{"self", self}, {"mat2", mat2}, {"out", out}});
  at::assert_no_internal_overlap(out);  // (the CPU kernel's check, which a queued call would make on the worker)
  if (!queueable(self) || shares_memory(out, {&self, &mat2})) {
    run_host_kernel("aten::mm.out", self, mat2, out);
    return out;
  }
  return out_variant<mm_in_row_blocks>("aten::mm.out", out, self, mat2);
}

at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const at::Scalar& beta,
                      const at::Scalar& alpha, at::Tensor& out) {
  check_same_device("addmm", {{"self", self}, {"mat1", mat1}, {"mat2", mat2}, {"out", out}});
  at::assert_no_internal_overlap(out);
  if (!queueable(mat1) || shares_memory(out, {&self, &mat1, &mat2})) {
    run_host_kernel("aten::addmm.out", self, mat1, mat2, beta, alpha, out);
    return out;
  }
  return out_variant<addmm_in_row_blocks>("aten::addmm.out", out, self, mat1, mat2, beta, alpha);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mm.out", TORCH_FN(mm_out));
  m.impl("addmm.out", TORCH_FN(addmm_out));
  m.impl("mm", TORCH_FN(mm));
  m.impl("bmm", TORCH_FN(bmm));
  m.impl("addmm", TORCH_FN(addmm));
}

} // namespace
} // namespace my_device
