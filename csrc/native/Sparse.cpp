#include "Sparse.h"

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseCsrTensorUtils.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/native/SparseTensorUtils.h>

namespace my_device {
namespace {

bool is_coo(const at::Tensor& t) {
  return t.layout() == c10::kSparse;
}

c10::DispatchKeySet sparse_keys(const at::Tensor& like, c10::Device device) {
  const bool cpu = device.is_cpu();
  if (is_coo(like)) {
    return c10::DispatchKeySet(cpu ? c10::DispatchKey::SparseCPU : c10::DispatchKey::SparsePrivateUse1);
  }
  return c10::DispatchKeySet(cpu ? c10::DispatchKey::SparseCsrCPU : c10::DispatchKey::SparseCsrPrivateUse1);
}

} // namespace

SparseMembers sparse_members(const at::Tensor& t) {
  if (is_coo(t)) {
    const auto* impl = at::sparse::get_sparse_impl(t);
    return {impl->indices(), impl->values()};
  }
  const auto* impl = at::sparse_csr::get_sparse_csr_impl(t);
  return {impl->compressed_indices(), impl->plain_indices(), impl->values()};
}

void set_sparse_members(const at::Tensor& target, const at::Tensor& like, const SparseMembers& members) {
  if (is_coo(like)) {
    const auto* src = at::sparse::get_sparse_impl(like);
    auto* impl = at::sparse::get_sparse_impl(target);
    impl->resize_(src->sparse_dim(), src->dense_dim(), like.sizes());
    impl->set_indices_and_values_unsafe(members[0], members[1]);
    impl->set_coalesced(src->coalesced());
    return;
  }
  auto* impl = at::sparse_csr::get_sparse_csr_impl(target);
  impl->set_layout(like.layout());
  impl->set_member_tensors(members[0], members[1], members[2], like.sizes());
}

at::Tensor make_sparse(const at::Tensor& like, const SparseMembers& members, c10::Device device) {
  at::Tensor out;
  if (is_coo(like)) {
    // (The constructor allocates empty members on the key's device type; the
    // caller runs under a guard for `device`, so they land there too.)
    out = at::detail::make_tensor<at::SparseTensorImpl>(sparse_keys(like, device), like.dtype());
  } else {
    out = at::detail::make_tensor<at::SparseCsrTensorImpl>(sparse_keys(like, device), device, like.layout(),
                                                          like.dtype());
  }
  set_sparse_members(out, like, members);
  return out;
}

} // namespace my_device
