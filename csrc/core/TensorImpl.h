#pragma once
#include <ATen/OpaqueTensorImpl.h>
#include <ATen/core/Tensor.h>

namespace my_device {

// The handle every mydev tensor carries: what the device itself needs to know
// about a tensor beyond PyTorch's sizes/strides/offset. Real accelerators keep
// private layouts here (Ascend's NC1HWC0 "format", oneDNN's blocked layouts),
// and a vendor forking this backend adds theirs. Views share it by value, so it
// must stay small and trivially copyable.
struct TensorDesc {
  // How the bytes are laid out on the device. Strided means exactly what the
  // PyTorch strides say, which is what every kernel here produces and expects.
  enum class Format : uint8_t { Strided = 0 };
  Format format = Format::Strided;
};

// OpaqueTensorImpl in name, with real strides and an accessible storage: the
// measurements in shared/notes (section 1) show that anything less breaks
// torch.compile, FakeTensor, alias detection and serialization of views.
class MyDevTensorImpl final : public at::OpaqueTensorImpl<TensorDesc> {
 public:
  // `extra_keys` adds functionality keys beyond the usual ones (ZeroTensor, for
  // autograd's storage-less zero tensors).
  MyDevTensorImpl(c10::Storage storage, caffe2::TypeMeta dtype, TensorDesc desc = {},
                  c10::DispatchKeySet extra_keys = {});

  // OpaqueTensorImpl forbids these; a strided device tensor needs them (set_, resize_).
  void set_size(int64_t dim, int64_t new_size) override;
  void set_stride(int64_t dim, int64_t new_stride) override;
  void set_storage_offset(int64_t storage_offset) override;

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter,
      bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  const char* tensorimpl_type_name() const override;
  template <class Version>
  c10::intrusive_ptr<c10::TensorImpl> detached_copy(Version&& version, bool allow_change) const;
};

// A new mydev tensor over `storage` with the given geometry.
at::Tensor make_tensor(c10::Storage storage, caffe2::TypeMeta dtype, c10::IntArrayRef sizes,
                       c10::IntArrayRef strides, int64_t storage_offset);
// A view of `base`: same storage, new geometry (and optionally a new dtype).
at::Tensor make_view(const at::Tensor& base, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                     int64_t storage_offset, std::optional<caffe2::TypeMeta> dtype = std::nullopt);

// `t` (same storage, geometry, dtype and conj/neg bits) under a TensorImpl of
// its own, so that a queued kernel and its caller do not share one. If the
// kernel held the TensorImpl a Python tensor wraps and Python dropped that
// tensor first, PyTorch would keep the Python object alive for the TensorImpl's
// sake ("resurrection") until the kernel was reaped, and loops of small ops
// would keep triggering the garbage collector.
// Non-mydev tensors (wrapped CPU scalars) are returned as they are.
at::Tensor kernel_handle(const at::Tensor& t);

} // namespace my_device
