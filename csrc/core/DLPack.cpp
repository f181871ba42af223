// Tensors imported through DLPack as mydev tensors like any other.
//
// torch.from_dlpack builds its tensor with at::fromDLPack, which goes through
// at::from_blob: a plain c10::TensorImpl over a StorageImpl whose DataPtr does
// not own the bytes and whose deleter releases the DLPack capsule (for a mydev
// producer: drops the producer's tensor, which gives its block back). No
// dispatched op is involved, so the backend has no say in the TensorImpl type.
// as_mydev_tensor re-homes such a tensor: a MyDevTensorImpl over the very same
// StorageImpl, so the capsule's deleter still keeps the producer alive for as
// long as any tensor over that storage lives, and code that tells mydev
// tensors by their TensorImpl (shallow copies, `.data =`, detach, the queue)
// sees one of its own.
#include "DLPack.h"

#include <ATen/core/Tensor.h>

#include <typeinfo>

#include "Device.h"
#include "TensorImpl.h"

namespace my_device {

bool is_mydev_tensor_impl(const at::Tensor& t) {
  return t.defined() && typeid(*t.unsafeGetTensorImpl()) == typeid(MyDevTensorImpl);
}

at::Tensor as_mydev_tensor(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kMyDev || t.layout() != c10::kStrided || is_mydev_tensor_impl(t)) {
    return t;
  }
  at::Tensor out = make_tensor(c10::Storage(t.storage()), t.dtype(), t.sizes(), t.strides(), t.storage_offset());
  // DLPack has no conj/neg bits (PyTorch refuses to export such tensors); kept for any other caller.
  out.unsafeGetTensorImpl()->_set_conj(t.is_conj());
  out.unsafeGetTensorImpl()->_set_neg(t.is_neg());
  out.set_requires_grad(t.requires_grad());
  return out;
}

} // namespace my_device
