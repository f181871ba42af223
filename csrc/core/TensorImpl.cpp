#include "TensorImpl.h"
#include "Device.h"

#include <c10/core/InferenceMode.h>

namespace my_device {

namespace {
// The storage constructor of TensorImpl adds no Autograd/ADInplaceOrView or
// Autocast keys, which would make every tensor an inference tensor; add them
// here, except under InferenceMode, as TensorImpl does for plain tensors.
c10::DispatchKeySet key_set_for_new_tensor() {
  constexpr auto backend = c10::BackendComponent::PrivateUse1Bit;
  static const c10::DispatchKeySet base = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) |
                                          c10::getAutocastRelatedKeySetFromBackend(backend);
  static const c10::DispatchKeySet with_autograd =
      base | c10::getAutogradRelatedKeySetFromBackend(backend);
  return c10::InferenceMode::is_enabled() ? base : with_autograd;
}
} // namespace

MyDevTensorImpl::MyDevTensorImpl(c10::Storage storage, caffe2::TypeMeta dtype, TensorDesc desc,
                                 c10::DispatchKeySet extra_keys)
    : at::OpaqueTensorImpl<TensorDesc>(c10::TensorImpl::VIEW, std::move(storage),
                                       key_set_for_new_tensor() | extra_keys, dtype, desc, {0}) {
  set_custom_sizes_strides(SizesStridesPolicy::Default);
  storage_access_should_throw_ = false;
}

void MyDevTensorImpl::set_size(int64_t dim, int64_t new_size) {
  c10::TensorImpl::set_size(dim, new_size);
}

void MyDevTensorImpl::set_stride(int64_t dim, int64_t new_stride) {
  c10::TensorImpl::set_stride(dim, new_stride);
}

void MyDevTensorImpl::set_storage_offset(int64_t storage_offset) {
  c10::TensorImpl::set_storage_offset(storage_offset);
}

template <class Version>
c10::intrusive_ptr<c10::TensorImpl> MyDevTensorImpl::detached_copy(Version&& version,
                                                                   bool allow_change) const {
  auto impl = c10::make_intrusive<MyDevTensorImpl>(c10::Storage(storage()), dtype(), opaque_handle());
  copy_tensor_metadata(this, impl.get(), std::forward<Version>(version), allow_change);
  impl->refresh_numel();
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> MyDevTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  return detached_copy(version_counter, allow_tensor_metadata_change);
}

c10::intrusive_ptr<c10::TensorImpl> MyDevTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  return detached_copy(std::move(version_counter), allow_tensor_metadata_change);
}

void MyDevTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  TORCH_INTERNAL_ASSERT(has_compatible_shallow_copy_type(impl->key_set()));
  copy_tensor_metadata(static_cast<const MyDevTensorImpl*>(impl.get()), this, version_counter(),
                       allow_tensor_metadata_change());
  refresh_numel();
}

const char* MyDevTensorImpl::tensorimpl_type_name() const {
  return "MyDevTensorImpl";
}

at::Tensor make_tensor(c10::Storage storage, caffe2::TypeMeta dtype, c10::IntArrayRef sizes,
                       c10::IntArrayRef strides, int64_t storage_offset) {
  auto impl = c10::make_intrusive<MyDevTensorImpl>(std::move(storage), dtype);
  impl->set_sizes_and_strides(sizes, strides, storage_offset);
  return at::Tensor(std::move(impl));
}

at::Tensor make_view(const at::Tensor& base, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                     int64_t storage_offset, std::optional<caffe2::TypeMeta> dtype) {
  auto impl = c10::make_intrusive<MyDevTensorImpl>(c10::Storage(base.storage()),
                                                   dtype.value_or(base.dtype()));
  impl->set_sizes_and_strides(sizes, strides, storage_offset);
  // Lazy conjugation and negation are properties of the view, not of the bytes.
  impl->_set_conj(base.is_conj());
  impl->_set_neg(base.is_neg());
  return at::Tensor(std::move(impl));
}

at::Tensor kernel_handle(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kMyDev || t.layout() != c10::kStrided) return t;
  return make_view(t, t.sizes(), t.strides(), t.storage_offset());
}

} // namespace my_device
