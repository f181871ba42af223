#include "HostCall.h"

#include <mydev_emulator.h>  // CPU kernels reach device memory at its kernel address

#include <ATen/ops/empty_strided.h>
#include <ATen/quantized/QTensorImpl.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstring>

#include "core/Allocator.h"
#include "core/Generator.h"
#include "core/TensorImpl.h"

namespace my_device {

namespace {

constexpr c10::DeviceType kCPU = c10::DeviceType::CPU;

// The device whose memory CPU allocations on this thread should come from, or
// -1. Set only while a host kernel runs.
thread_local c10::DeviceIndex tls_output_device = -1;

// PyTorch has no per-thread or per-call allocator override, and CPU kernels
// allocate their outputs with the global CPU allocator. This wrapper is that
// allocator: outside host kernels it forwards to the allocator it replaced;
// inside, it hands out device memory (tagged as CPU, because the CPU kernel
// will check) that HostCall::to_device later adopts without a copy.
// test_host_kernel.py::test_cpu_allocator_is_redirect notices if PyTorch ever
// replaces it behind our back.
c10::DeleterFnPtr g_cpu_raw_deleter = nullptr;

void raw_free(void* ptr) {
  void* device_ptr = mydevDeviceAddress(ptr);  // raw_allocate handed out the kernel address
  if (ptr != nullptr && is_device_pointer(device_ptr)) {
    free_device_pointer(device_ptr);
  } else {
    g_cpu_raw_deleter(ptr);
  }
}

class RedirectingCpuAllocator final : public c10::Allocator {
 public:
  explicit RedirectingCpuAllocator(c10::Allocator* cpu) : cpu_(cpu) {
    g_cpu_raw_deleter = cpu->raw_deleter();
  }

  c10::DataPtr allocate(size_t nbytes) override {
    if (tls_output_device < 0) {
      return cpu_->allocate(nbytes);
    }
    return allocate_for_kernel(tls_output_device, nbytes);
  }

  // raw_allocate (oneDNN scratch) may have handed out either kind of memory.
  c10::DeleterFnPtr raw_deleter() const override {
    return &raw_free;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    cpu_->copy_data(dest, src, count);
  }

 private:
  c10::Allocator* cpu_;
};

c10::Allocator* redirecting_allocator() {
  static RedirectingCpuAllocator* allocator = [] {
    auto* a = new RedirectingCpuAllocator(c10::GetAllocator(kCPU));
    c10::SetAllocator(kCPU, a, /*priority=*/1);
    return a;
  }();
  return allocator;
}

const bool g_installed = (redirecting_allocator(), true);

} // namespace

HostCall::HostCall(c10::DeviceIndex device) : device_(device), previous_output_device_(tls_output_device) {
  tls_output_device = device;
}

HostCall::~HostCall() {
  tls_output_device = previous_output_device_;
}

at::Tensor HostCall::to_host(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kMyDev) {
    return t;
  }
  if (is_sparse_layout(t)) {
    for (const auto& pair : sparse_) {
      if (pair.device.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return pair.host;
    }
    SparseMembers members = sparse_members(t);
    for (auto& m : members) m = to_host(m);
    at::Tensor host = make_sparse(t, members, c10::Device(kCPU));
    host_keys_ = host_keys_ | c10::DispatchKeySet(t.layout() == c10::kSparse ? c10::DispatchKey::SparseCPU
                                                                                : c10::DispatchKey::SparseCsrCPU);
    sparse_.push_back({host, t});
    return host;
  }
  // The same tensor passed twice (logical_and_ calls logical_and_out(self, self,
  // other)) must stay one tensor: CPU kernels tell in-place from out= by
  // identity, and check broadcasting differently for each.
  for (const auto& pair : tensors_) {
    if (pair.device.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return pair.host;
  }
  // (First: mapping a per-channel quantizer's tensors adds storages.)
  at::QuantizerPtr quantizer = t.is_quantized() ? moved_quantizer(t.quantizer(), true) : at::QuantizerPtr();
  c10::StorageImpl* device_storage = t.storage().unsafeGetStorageImpl();
  const c10::Storage* host_storage = nullptr;
  for (const auto& pair : storages_) {
    if (pair.device == device_storage) host_storage = &pair.host;
  }
  if (host_storage == nullptr) {
    // Resizable through the redirecting allocator, so a CPU kernel that grows
    // an out= tensor gets device memory that write_back() moves over.
    storages_.push_back({device_storage, host_storage_over(device_storage, redirecting_allocator(), true)});
    host_storage = &storages_.back().host;
  }
  if (quantizer) {
    host_keys_ = host_keys_ | c10::DispatchKeySet(c10::DispatchKey::QuantizedCPU);
    at::Tensor host = qtensor_over(t, *host_storage, c10::DispatchKey::QuantizedCPU, quantizer);
    tensors_.push_back({host, t, quantizer.get()});
    return host;
  }
  at::Tensor host = host_tensor_like(t, *host_storage);
  tensors_.push_back({host, t});
  return host;
}

at::QuantizerPtr HostCall::moved_quantizer(const at::QuantizerPtr& q, bool to_host_side) {
  const auto* per_channel = dynamic_cast<const at::PerChannelAffineQuantizer*>(q.get());
  if (per_channel == nullptr) return q;  // per-tensor and unknown quantizers hold no tensors
  auto move = [&](const at::Tensor& t) { return to_host_side ? to_host(t) : to_device(t); };
  at::Tensor scales = move(per_channel->scales());
  at::Tensor zero_points = move(per_channel->zero_points());
  if (scales.is_same(per_channel->scales()) && zero_points.is_same(per_channel->zero_points())) return q;
  if (dynamic_cast<const at::PerChannelAffineFloatQParamsQuantizer*>(per_channel) != nullptr) {
    return c10::make_intrusive<at::PerChannelAffineFloatQParamsQuantizer>(q->scalar_type(), scales, zero_points,
                                                                          per_channel->axis());
  }
  return c10::make_intrusive<at::PerChannelAffineQuantizer>(q->scalar_type(), scales, zero_points,
                                                            per_channel->axis());
}

at::Tensor qtensor_over(const at::Tensor& geometry, c10::Storage storage, c10::DispatchKey key,
                        at::QuantizerPtr quantizer) {
  at::Tensor out = at::detail::make_tensor<at::QTensorImpl>(std::move(storage), c10::DispatchKeySet(key),
                                                            geometry.dtype(), std::move(quantizer));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(geometry.sizes(), geometry.strides(),
                                                   geometry.storage_offset());
  return out;
}

// Over the bytes as they are: a lazy clone's shared bytes stay shared
// (data(), not mutable_data(), which would copy them). A kernel reads such a
// storage only: a tensor the op writes was given bytes of its own at the call
// (materialize_written).
c10::Storage host_storage_over(c10::StorageImpl* device_storage, c10::Allocator* allocator, bool resizable) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), device_storage->nbytes(),
      c10::DataPtr(kernel_address(const_cast<void*>(device_storage->data())), c10::Device(kCPU)), allocator,
      resizable));
}

at::Tensor host_tensor_like(const at::Tensor& t, const c10::Storage& host) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(host), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                   t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  impl->_set_conj(t.is_conj());
  impl->_set_neg(t.is_neg());
  return at::Tensor(std::move(impl));
}

std::optional<at::Tensor> HostCall::to_host(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return t;
  return to_host(*t);
}

void HostCall::write_back() {
  for (auto& pair : storages_) {
    c10::StorageImpl* host = pair.host.unsafeGetStorageImpl();
    if (host->data() == kernel_address(pair.device->data()) && host->nbytes() == pair.device->nbytes()) continue;
    // The CPU kernel resized this storage; its new bytes are device memory.
    c10::DataPtr data = host->set_data_ptr(c10::DataPtr(nullptr, c10::Device(kCPU)));
    TORCH_INTERNAL_ASSERT(data.get() == nullptr || is_kernel_data_ptr(data),
                          "host kernel resized a device storage into host memory");
    const size_t nbytes = host->nbytes();
    pair.device->set_data_ptr_noswap(data.get() == nullptr ? c10::DataPtr(nullptr, c10::Device(kMyDev, device_))
                                                           : to_device_data_ptr(std::move(data), device_));
    pair.device->set_nbytes(nbytes);
    host->set_data_ptr_noswap(c10::DataPtr(kernel_address(pair.device->mutable_data()), c10::Device(kCPU)));
  }
  for (auto& pair : tensors_) {
    c10::TensorImpl* host = pair.host.unsafeGetTensorImpl();
    c10::TensorImpl* dev = pair.device.unsafeGetTensorImpl();
    if (host->sizes() != dev->sizes() || host->strides() != dev->strides() ||
        host->storage_offset() != dev->storage_offset()) {
      dev->set_sizes_and_strides(host->sizes(), host->strides(), host->storage_offset());
    }
    // (linalg_lu_solve's out= kernel flips its output's conjugate bit for left=False)
    if (host->is_conj() != dev->is_conj()) dev->_set_conj(host->is_conj());
    if (host->is_neg() != dev->is_neg()) dev->_set_neg(host->is_neg());
    if (pair.host_quantizer != nullptr) {
      at::QuantizerPtr q = at::get_qtensorimpl(pair.host)->quantizer();
      if (q.get() != pair.host_quantizer) at::get_qtensorimpl(pair.device)->set_quantizer_(moved_quantizer(q, false));
    }
  }
  for (auto& pair : sparse_) {
    SparseMembers members = sparse_members(pair.host);
    for (auto& m : members) m = to_device(m);
    set_sparse_members(pair.device, pair.host, members);
  }
}

void HostCall::copy_back_reallocated() {
  for (auto& pair : storages_) {
    const c10::StorageImpl* host = pair.host.unsafeGetStorageImpl();
    if (host->data() == kernel_address(pair.device->data())) continue;
    const size_t nbytes = std::min(host->nbytes(), pair.device->nbytes());
    if (nbytes > 0) std::memcpy(kernel_address(pair.device->mutable_data()), host->data(), nbytes);
  }
}

at::Tensor HostCall::to_device(const at::Tensor& r) {
  if (!r.defined() || r.device().type() != kCPU) {
    return r;
  }
  if (is_sparse_layout(r)) {
    for (const auto& pair : sparse_) {
      if (pair.host.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return pair.device;
    }
    SparseMembers members = sparse_members(r);
    for (auto& m : members) m = to_device(m);
    return make_sparse(r, members, c10::Device(kMyDev, device_));
  }
  for (const auto& pair : tensors_) {
    if (pair.host.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return pair.device;
  }
  c10::StorageImpl* host_storage = r.storage().unsafeGetStorageImpl();
  auto device_view = [&](const c10::Storage& storage) {
    if (r.is_quantized()) {
      return qtensor_over(r, storage, c10::DispatchKey::QuantizedPrivateUse1, moved_quantizer(r.quantizer(), false));
    }
    at::Tensor out = make_tensor(storage, r.dtype(), r.sizes(), r.strides(), r.storage_offset());
    out.unsafeGetTensorImpl()->_set_conj(r.is_conj());
    out.unsafeGetTensorImpl()->_set_neg(r.is_neg());
    return out;
  };
  for (const auto& pair : storages_) {
    if (pair.host.unsafeGetStorageImpl() == host_storage) {
      return device_view(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(pair.device)));
    }
  }
  for (const auto& a : adopted_) {
    if (a.host == host_storage) return device_view(a.device);
  }
  c10::Storage storage;
  if (is_kernel_data_ptr(host_storage->data_ptr())) {
    c10::DataPtr data = host_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(kCPU)));
    storage = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), host_storage->nbytes(), to_device_data_ptr(std::move(data), device_),
        device_allocator(), /*resizable=*/true));
    // Leave the CPU tensor valid for anyone else still holding it.
    host_storage->set_data_ptr_noswap(c10::DataPtr(kernel_address(storage.mutable_data()), c10::Device(kCPU)));
  } else {
    // Genuine host memory: the kernel returned a tensor allocated elsewhere
    // (another thread, or a cached constant). Only here are bytes copied.
    const size_t nbytes = host_storage->nbytes();
    storage = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), nbytes, allocate_on(device_, nbytes), device_allocator(),
        /*resizable=*/true));
    if (nbytes > 0) {
      MYDEV_CHECK(mydevMemcpy(storage.mutable_data(), host_storage->data(), nbytes, mydevMemcpyHostToDevice));
    }
  }
  adopted_.push_back({host_storage, storage});
  return device_view(storage);
}

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  if (auto opt = type->cast<c10::OptionalType>()) {
    return opt->getElementType()->kind() == c10::TypeKind::GeneratorType;
  }
  return false;
}

c10::IValue host_generator(const c10::IValue& v, const c10::Argument& arg, c10::DeviceIndex device) {
  if (v.isGenerator()) {
    // A host generator would draw the host's numbers: refused as CUDA refuses it.
    const c10::DeviceType type = v.toGenerator().device().type();
    TORCH_CHECK(type == kMyDev, "Expected a '", c10::DeviceTypeName(kMyDev, /*lower_case=*/true),
                "' device type for generator but found '", c10::DeviceTypeName(type, /*lower_case=*/true), "'");
    return next_engine(v.toGenerator());
  }
  if (v.isNone() && is_optional_generator(arg)) return next_engine(default_generator(device));
  return v;
}

} // namespace my_device
