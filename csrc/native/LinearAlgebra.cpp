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

namespace my_device {
namespace {

using namespace structured;

// The CPU kernels lack some dtypes (bool) and say so only when they run, which
// on the queue would be at a later synchronisation: such calls run now.
bool queueable(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type());
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  check_same_device("mm", {{"self", self}, {"mat2", mat2}});
  auto on_host = [](const at::Tensor& a, const at::Tensor& b) { return at::mm(a, b); };
  if (!queueable(self)) return on_host_now(self.device().index(), on_host, self, mat2);
  return functional<at::native::structured_mm_out_cpu>("aten::mm", on_host, self, mat2);
}

at::Tensor bmm(const at::Tensor& self, const at::Tensor& mat2) {
  check_same_device("bmm", {{"self", self}, {"mat2", mat2}});
  auto on_host = [](const at::Tensor& a, const at::Tensor& b) { return at::bmm(a, b); };
  if (!queueable(self)) return on_host_now(self.device().index(), on_host, self, mat2);
  return functional<at::native::structured_bmm_out_cpu>("aten::bmm", on_host, self, mat2);
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  check_same_device("addmm", {{"self", self}, {"mat1", mat1}, {"mat2", mat2}});
  auto on_host = [](const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& be,
                    const at::Scalar& al) { return at::addmm(s, a, b, be, al); };
  if (!queueable(mat1)) return on_host_now(mat1.device().index(), on_host, self, mat1, mat2, beta, alpha);
  return functional<at::native::structured_addmm_out_cpu>("aten::addmm", on_host, self, mat1, mat2, beta, alpha);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mm", TORCH_FN(mm));
  m.impl("bmm", TORCH_FN(bmm));
  m.impl("addmm", TORCH_FN(addmm));
}

} // namespace
} // namespace my_device
