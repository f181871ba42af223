#pragma once
// Sparse layouts on mydev (COO, and the compressed ones: CSR, CSC, BSR, BSC).
//
// A sparse tensor holds no bytes of its own: it is sizes plus a few dense
// member tensors (COO: indices, values; compressed: compressed indices, plain
// indices, values). On mydev the members are ordinary mydev tensors, so a host
// kernel maps a sparse tensor by mapping its members (HostCall), and the CPU's
// sparse kernels run on device memory like the dense ones.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/SmallVector.h>

namespace my_device {

using SparseMembers = c10::SmallVector<at::Tensor, 3>;

inline bool is_sparse_layout(const at::Tensor& t) {
  return t.defined() && t.layout() != c10::kStrided;
}

// The member tensors of sparse tensor `t`, read from its TensorImpl (no dispatch).
SparseMembers sparse_members(const at::Tensor& t);

// A sparse tensor with the layout, sizes, dtype and flags of `like`, on
// `device` (CPU or mydev), over `members` (which must already be on `device`).
at::Tensor make_sparse(const at::Tensor& like, const SparseMembers& members, c10::Device device);

// Makes `target` take the geometry of `like` and `members` as its members (an
// in-place or out= sparse kernel replaced them).
void set_sparse_members(const at::Tensor& target, const at::Tensor& like, const SparseMembers& members);

} // namespace my_device
