// Matrix products as queued structured kernels (StructuredKernel.h): the
// shape of a product is known before it runs, so mm/addmm/bmm on any size go to
// the stream instead of running at the call.
#include "StructuredKernel.h"

#include <ATen/ops/addmm.h>
#include <ATen/ops/addmm_native.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/bmm_native.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mm_native.h>
#include <torch/library.h>

namespace my_device::structured {
// mm's and addmm's impl() call BLAS on the data pointers, with the operands'
// strides; an operand BLAS cannot take as it is gets cloned, and addmm copies
// its bias into the output (ops on the tensors). On x86 it has no oneDNN path.
// (Not bmm: its impl() may hand the tensors to oneDNN, which takes CPU tensors only.)
template <>
struct RunsOnDeviceTensors<at::native::structured_mm_out_cpu> : OnDeviceTensors {};
template <>
struct RunsOnDeviceTensors<at::native::structured_addmm_out_cpu> : OnDeviceTensors {};
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
  return functional<at::native::structured_mm_out_cpu>("aten::mm", self, mat2);
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
  return functional<at::native::structured_addmm_out_cpu>("aten::addmm", self, mat1, mat2, beta, alpha);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mm", TORCH_FN(mm));
  m.impl("bmm", TORCH_FN(bmm));
  m.impl("addmm", TORCH_FN(addmm));
}

} // namespace
} // namespace my_device
