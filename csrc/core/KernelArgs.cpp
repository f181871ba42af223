#include "KernelArgs.h"

#include <c10/core/impl/COW.h>

#include "Allocator.h"
#include "Graph.h"
#include "Stream.h"
#include "TensorImpl.h"

namespace my_device {

namespace {

bool is_plain_device_tensor(const at::Tensor& t) {
  return t.defined() && t.device().type() == kMyDev && t.layout() == c10::kStrided;
}

at::Tensor over(const c10::Storage& storage, const at::Tensor& t) {
  at::Tensor out = make_tensor(storage, t.dtype(), t.sizes(), t.strides(), t.storage_offset());
  out.unsafeGetTensorImpl()->_set_conj(t.is_conj());
  out.unsafeGetTensorImpl()->_set_neg(t.is_neg());
  return out;
}

} // namespace

KernelArgs::KernelArgs(c10::DeviceIndex device)
    : device_(device), stream_(device >= 0 ? current_stream_handle(device) : nullptr), recording_(capture_underway()) {}

void KernelArgs::record(const c10::StorageImpl* s, Touch touch) {
  if (C10_LIKELY(!recording_) || s == nullptr || s->nbytes() == 0) return;
  memory_.push_back({s->data(), s->nbytes(), touch == Touch::kWrites});
}

void KernelArgs::record(const at::Tensor& t, Touch touch) {
  if (C10_LIKELY(!recording_) || !t.defined() || t.device().type() != kMyDev) return;
  if (t.layout() != c10::kStrided) {
    incomplete_ = true;
    return;
  }
  record(t.storage().unsafeGetStorageImpl(), touch);
}

void KernelArgs::touch(const c10::Storage& s, Touch touch) {
  if (C10_UNLIKELY(recording_) && s.device_type() == kMyDev) record(s.unsafeGetStorageImpl(), touch);
}

const c10::Storage* KernelArgs::lease(const c10::Storage& s) {
  c10::StorageImpl* impl = s.unsafeGetStorageImpl();
  if (impl == nullptr || device_ < 0) return nullptr;
  // A storage that owns nothing (a graph replay's output, over its pool's
  // memory) is leased whatever its size: holding it would keep nothing alive
  // but the StorageImpl, and would make it look alive to cudagraph trees, which
  // count a storage's references to decide which outputs are dead.
  const bool owns_nothing = impl->data_ptr().get_context() == nullptr && impl->data() != nullptr;
  // While a graph is captured, small blocks are leased too: a captured kernel's
  // references would last as long as its graph, and the graph's pool would
  // count its dead intermediates as allocated (CUDA's pool frees them at the
  // capture's frees, which cudagraph trees rely on).
  if (impl->nbytes() < kLeaseMinBytes && !recording_ && !owns_nothing) return nullptr;
  for (const auto& [original, leased] : leases_) {
    if (original == impl) return &leased;
  }
  // (A lazy clone's bytes are shared with other storages: held by reference.)
  if (c10::impl::cow::is_cow_data_ptr(impl->data_ptr())) return nullptr;
  if (!owns_nothing && !allocated_for_stream(impl->data_ptr(), device_, stream_)) return nullptr;
  leases_.emplace_back(impl, c10::Storage(c10::make_intrusive<c10::StorageImpl>(
                                 c10::StorageImpl::use_byte_size_t(), impl->nbytes(),
                                 c10::DataPtr(impl->mutable_data(), c10::Device(kMyDev, device_)),
                                 /*allocator=*/nullptr, /*resizable=*/false)));
  return &leases_.back().second;
}

// A CPU tensor argument (a 0-dim scalar) is read at the launch, as CUDA reads
// CPU scalars then: the caller may change it before the kernel runs.
// Wrapped Python numbers are the dispatcher's own and cannot change.
bool is_callers_cpu_tensor(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && !t.unsafeGetTensorImpl()->is_wrapped_number();
}

at::Tensor KernelArgs::own(const at::Tensor& t, Touch touch) {
  record(t, touch);
  if (is_callers_cpu_tensor(t)) return t.clone();
  if (!is_plain_device_tensor(t)) return t;
  const c10::Storage* leased = lease(t.storage());
  return leased != nullptr ? over(*leased, t) : kernel_handle(t);
}

at::Tensor KernelArgs::share(const at::Tensor& t, Touch touch) {
  record(t, touch);
  if (is_callers_cpu_tensor(t)) return t.clone();
  if (!is_plain_device_tensor(t)) return t;
  if (const c10::Storage* leased = lease(t.storage())) return over(*leased, t);
  shared_.push_back(t.storage());
  return t;
}

void KernelArgs::lease_in_place(const at::Tensor& t) {
  record(t, Touch::kWrites);
  if (!is_plain_device_tensor(t)) return;
  if (const c10::Storage* leased = lease(t.storage())) {
    t.unsafeGetTensorImpl()->set_storage_keep_dtype(*leased);
  }
}

c10::Storage KernelArgs::keep(const c10::Storage& s, Touch touch) {
  this->touch(s, touch);
  if (s.device_type() == kMyDev && lease(s) != nullptr) return {};
  return s;
}

} // namespace my_device
