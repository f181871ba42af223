#pragma once
// HostCall: PyTorch's own CPU kernels executed on mydev memory.
//
// The emulated device's memory is host memory, so the CPU implementation of an
// op *is* the device's kernel: it only has to be pointed at the device bytes.
// A HostCall swaps each mydev tensor for a CPU tensor viewing the same bytes,
// routes the CPU kernel's output allocations to device memory, and maps results
// back: an input returned (in-place, out=) becomes the original mydev tensor, a
// view of an input becomes a mydev view of the same storage, and a fresh output
// becomes a mydev tensor over the device bytes it was written into. No data is
// copied on any of these paths.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include "native/Sparse.h"
#include "core/Device.h"
#include "core/Launch.h"

namespace my_device {

class HostCall {
 public:
  explicit HostCall(c10::DeviceIndex device);
  ~HostCall();
  HostCall(const HostCall&) = delete;
  HostCall& operator=(const HostCall&) = delete;

  c10::DeviceIndex device() const {
    return device_;
  }
  // A CPU tensor over the same bytes as mydev tensor `t`.
  at::Tensor to_host(const at::Tensor& t);
  std::optional<at::Tensor> to_host(const std::optional<at::Tensor>& t);
  // The mydev tensor a CPU kernel's result stands for (see above).
  at::Tensor to_device(const at::Tensor& host_result);
  // Propagates what the CPU kernel did to its inputs' metadata (out= resizes,
  // in-place restrides, new members of a sparse tensor) back to the mydev
  // tensors. Call before to_device().
  void write_back();
  // For a queued kernel, whose caller already holds its outputs: a CPU kernel
  // that reallocated a storage on the way (mse_loss.out grows its 0-d out to
  // the input's size, then reduces into it) left its final bytes in the new
  // allocation; they are copied back into the storage the caller holds.
  void copy_back_reallocated();
  // The CPU dispatch keys of the mapped tensors' layouts, for redispatching.
  c10::DispatchKeySet host_keys() const {
    return host_keys_;
  }

 private:
  struct StoragePair {
    c10::StorageImpl* device;
    c10::Storage host;
  };
  struct TensorPair {
    at::Tensor host;
    at::Tensor device;
    // A quantized pair: the quantizer the host tensor was given, so that
    // write_back() sees a kernel replace it (copy_ does).
    const void* host_quantizer = nullptr;
  };
  struct Adopted {
    c10::StorageImpl* host;
    c10::Storage device;
  };
  // `q` for a quantized tensor on the other side of the call: a per-channel
  // quantizer's scales and zero points are tensors, which move with it.
  at::QuantizerPtr moved_quantizer(const at::QuantizerPtr& q, bool to_host_side);

  c10::DeviceIndex device_;
  c10::DeviceIndex previous_output_device_;
  c10::SmallVector<StoragePair, 4> storages_;
  c10::SmallVector<TensorPair, 4> tensors_;
  c10::SmallVector<Adopted, 2> adopted_;
  c10::SmallVector<TensorPair, 1> sparse_;
  c10::DispatchKeySet host_keys_{c10::DispatchKey::CPU};
};

// Runs `body(call)` as a kernel on `device`, with a fresh HostCall. It runs
// inline (launch_inline): a CPU kernel's output shapes are only known once it
// has run, so its caller cannot continue before that.
template <class F>
auto run_on_host(c10::DeviceIndex device, F&& body) {
  RuntimeDeviceGuard on_device(device);
  std::optional<decltype(body(std::declval<HostCall&>()))> result;
  launch_inline(device, [&] {
    HostCall call(device);
    result.emplace(body(call));
  });
  return std::move(*result);
}

// Applies f to each tensor in a boxed argument (a Tensor, a Tensor[] or a Tensor?[]).
template <class F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    out.reserve(v.toTensorList().size());
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isList()) {
    auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    out.reserve(list.size());
    for (const c10::IValue& e : list) out.push_back(e.isTensor() ? c10::IValue(f(e.toTensor())) : e);
    return out;
  }
  return v;
}

// Calls f on each tensor in a boxed argument (a Tensor, a Tensor[] or a Tensor?[]).
template <class F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) f(e.toTensor());
    }
  }
}

// A CPU storage over a device storage's bytes, reached at their kernel address.
c10::Storage host_storage_over(c10::StorageImpl* device_storage, c10::Allocator* allocator, bool resizable);
// A CPU tensor over `host` with `t`'s geometry and conj/neg bits: the host view of a device tensor.
at::Tensor host_tensor_like(const at::Tensor& t, const c10::Storage& host);
// A quantized tensor (QTensorImpl under `key`) over `storage` with `geometry`'s
// sizes, strides and offset, `quantizer` and dtype.
at::Tensor qtensor_over(const at::Tensor& geometry, c10::Storage storage, c10::DispatchKey key,
                        at::QuantizerPtr quantizer);

// Whether an argument is a Generator or a Generator?.
bool is_optional_generator(const c10::Argument& arg);
// A mydev Generator argument, or None for a Generator? one, replaced by a CPU
// engine drawn from the mydev generator (see next_engine); `v` otherwise.
c10::IValue host_generator(const c10::IValue& v, const c10::Argument& arg, c10::DeviceIndex device);

} // namespace my_device
