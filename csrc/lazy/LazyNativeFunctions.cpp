// The Lazy kernels torchgen cannot generate (the `supported` list of mydev_lazy_ops.yaml): where lazy
// tensors come from and how they leave (empty, _to_copy, _copy_from, lift), the ops that only move values
// around (copy, clone, fill_, _unsafe_view), and backward ops whose ATen kernels are views.
//
// Every lazy tensor handed to the user is wrapped for functionalization (empty, _to_copy from another
// device, lift): the Functionalize key then turns views into *_copy ops and in-place ops into their
// functional forms before they reach the Lazy key, so the traced graph holds only value semantics.
// Below that key (inside these kernels) tensors are plain lazy tensors.
#include <ATen/ExpandUtils.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/_to_copy_ops.h>
#include <ATen/ops/select_backward_ops.h>
#include <ATen/ops/slice_backward_ops.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/lazy/core/ir_builder.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/core/tensor_impl.h>
#include <torch/library.h>

#include "ShapeInference.h"
#include "core/Device.h"
#include "../build/generated/mydev_lazy/LazyIr.h"
#include "../build/generated/mydev_lazy/LazyNativeFunctions.h"

namespace my_device::lazy {

namespace {

// Under the Functionalize key (a kernel called through its wrapper) results must come back unwrapped:
// the wrapper's kernel wraps them itself.
at::Tensor functional_unless_inside(const at::Tensor& t) {
  if (c10::impl::tls_local_dispatch_key_set().excluded_.has(c10::DispatchKey::Functionalize)) return t;
  return at::functionalization::impl::to_functional_tensor(t);
}

torch::lazy::BackendDevice backend_device(const std::optional<c10::Device>& device) {
  return torch::lazy::atenDeviceToBackendDevice(device.value_or(c10::Device(c10::kLazy)));
}

// The eager device a lazy device's data lives on.
c10::Device data_device(const torch::lazy::BackendDevice& device) {
  return c10::Device(kMyDev, static_cast<c10::DeviceIndex>(device.ordinal()));
}

at::Tensor wrap(torch::lazy::LazyTensorPtr t) {
  return torch::lazy::CreateAtenFromLtcTensor(std::move(t));
}

// LTC's hashes have no case for ComplexHalf (an internal assert in hash.h): refused where lazy tensors of a
// dtype come from, with an error that says so.
void check_lazy_dtype(at::ScalarType dtype) {
  TORCH_CHECK_NOT_IMPLEMENTED(dtype != at::kComplexHalf,
                              "mydev lazy tensors cannot be complex32: Lazy Tensor Core cannot hash ComplexHalf");
}

} // namespace

at::Tensor LazyNativeFunctions::empty_symint(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                                             std::optional<at::Layout> layout, std::optional<at::Device> device,
                                             std::optional<bool> pin_memory,
                                             std::optional<at::MemoryFormat> memory_format) {
  const torch::lazy::BackendDevice lazy_device = backend_device(device);
  check_lazy_dtype(dtype.value_or(c10::typeMetaToScalarType(at::get_default_dtype())));
  // Uninitialised mydev memory: whatever uses the tensor writes it first (zeros() = empty + fill_).
  at::Tensor data = at::empty(C10_AS_INTARRAYREF_SLOW(size),
                              at::TensorOptions().dtype(dtype).layout(layout).device(data_device(lazy_device)),
                              memory_format);
  return functional_unless_inside(wrap(torch::lazy::LazyTensor::Create(data, lazy_device)));
}

at::Tensor LazyNativeFunctions::empty_strided_symint(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                                                     std::optional<at::ScalarType> dtype,
                                                     std::optional<at::Layout> layout,
                                                     std::optional<at::Device> device,
                                                     std::optional<bool> pin_memory) {
  // A lazy tensor has the strides of a contiguous tensor of its sizes whatever its history (LTC's
  // TensorImpl computes them so), hence `stride` cannot be kept.
  return empty_symint(size, dtype, layout, device, pin_memory, std::nullopt);
}

at::Tensor LazyNativeFunctions::_to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                                         std::optional<bool> pin_memory, bool non_blocking,
                                         std::optional<at::MemoryFormat> memory_format) {
  torch::lazy::LazyTensorPtr lazy_self = torch::lazy::TryGetLtcTensor(self);
  const bool to_lazy = !device || device->type() == c10::kLazy;
  if (to_lazy) check_lazy_dtype(dtype.value_or(self.scalar_type()));
  if (!lazy_self) {
    // Into a lazy tensor: its value stays on its device until a graph needs it (Backend.cpp's
    // MakeComputationDataFromTensor uploads it and counts host bytes); copied now, as .to() promises.
    TORCH_INTERNAL_ASSERT(to_lazy);
    at::Tensor value = self.to(self.options().dtype(dtype.value_or(self.scalar_type())), non_blocking, /*copy=*/true);
    return functional_unless_inside(wrap(torch::lazy::LazyTensor::Create(value, backend_device(device))));
  }
  if (!to_lazy) {
    // Out of the lazy world: runs the pending graph.
    at::TensorOptions options = self.options().device(device).dtype(dtype.value_or(self.scalar_type()));
    if (layout) options = options.layout(layout);
    return lazy_self->ToTensor(/*detached=*/true).to(options, non_blocking, /*copy=*/true, memory_format);
  }
  if (device->has_index() && device->index() != lazy_self->GetDevice().ordinal()) {
    // lazy:0 -> lazy:1: one graph per device, so through the data.
    at::Tensor value = lazy_self->ToTensor(/*detached=*/true);
    const torch::lazy::BackendDevice target = backend_device(device);
    value = value.to(data_device(target), dtype.value_or(value.scalar_type()), non_blocking, /*copy=*/true);
    return wrap(torch::lazy::LazyTensor::Create(value, target));
  }
  // lazy -> lazy (a dtype or memory-format change): a graph node. It must not name the lazy device: the
  // program runs on the device's data.
  std::vector<torch::lazy::Shape> shapes =
      torch::lazy::compute_shape__to_copy(self, dtype, layout, std::nullopt, pin_memory, non_blocking, memory_format);
  torch::lazy::NodePtr node = torch::lazy::MakeNode<ToCopy>(lazy_self->GetIrValue(), dtype, layout, std::nullopt,
                                                            pin_memory, non_blocking, memory_format,
                                                            std::move(shapes));
  return wrap(torch::lazy::LazyTensor::Create(std::move(node), lazy_self->GetDevice()));
}

namespace {

// mydev -> lazy takes the path CPU -> lazy takes. _to_copy's BackendSelect kernel dispatches on the target
// device and the source's backend together, and PrivateUse1 outranks Lazy where CPU does not: without this
// kernel a mydev source reached the composite _to_copy, an empty lazy tensor and a copy_ into it, and the
// copy_ is a mutation functionalization records. Every view later taken of such a tensor (the conj view
// ConjBackward makes of an incoming gradient) is rebuilt from its base at its first use, which replaces
// the view's inner value; PyTorch's fft_r2c_backward holds that value's sizes (an ArrayRef) across such a
// use, so it read freed memory (fft.ihfft's backward through a lazy tensor failed on a size of 10 that
// was another tensor's). Here the value arrives as a fresh lazy tensor, with no history, as from the CPU.
at::Tensor mydev_to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory, bool non_blocking,
                         std::optional<at::MemoryFormat> memory_format) {
  if (device && device->type() == c10::kLazy) {
    return at::_ops::_to_copy::redispatch(c10::DispatchKeySet(c10::DispatchKey::Lazy), self, dtype, layout, device,
                                          pin_memory, non_blocking, memory_format);
  }
  return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_to_copy", TORCH_FN(mydev_to_copy));
}

} // namespace

at::Tensor LazyNativeFunctions::_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  torch::lazy::LazyTensorPtr src = torch::lazy::TryGetLtcTensor(self);
  torch::lazy::LazyTensorPtr target = torch::lazy::TryGetLtcTensor(dst);
  if (!src) {
    // An eager value for a lazy tensor, uploaded now: the caller may change `self` afterwards.
    TORCH_INTERNAL_ASSERT(target);
    target->UpdateFromTensor(self, /*sync=*/true);
  } else if (!target) {
    const_cast<at::Tensor&>(dst).copy_(src->ToTensor(/*detached=*/false), non_blocking);
  } else {
    // copy_ between lazy tensors: dst takes self's value, broadcast to its shape (SetInPlaceIrValue casts
    // to dst's dtype).
    at::Tensor value = self.sizes() == dst.sizes() ? self : expand_copy(self, dst.sizes(), false);
    target->SetInPlaceIrValue(torch::lazy::TryGetLtcTensor(value)->GetIrValue());
  }
  return dst;
}

at::Tensor LazyNativeFunctions::_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  torch::lazy::LazyTensorPtr src = torch::lazy::TryGetLtcTensor(self);
  torch::lazy::LazyTensorPtr target = torch::lazy::TryGetLtcTensor(dst);
  if (!src) {
    TORCH_INTERNAL_ASSERT(target);
    target->UpdateFromTensorOut(self);
  } else if (!target) {
    at::Tensor value = src->ToTensor(/*detached=*/true);
    const_cast<at::Tensor&>(dst).resize_(value.sizes()).copy_(value);
  } else {
    target->UpdateFromTensorOut(src);
    // The impl caches sizes from its LazyTensor; a resized dst has new ones.
    static_cast<torch::lazy::LTCTensorImpl*>(dst.unsafeGetTensorImpl())->force_refresh_sizes();
  }
  return dst;
}

// copy_ as functionalization rewrites it (x[0] = v, eager.to("lazy")): a tensor like self holding src's
// values. src may be an eager tensor (mydev or CPU), which becomes the graph's device data.
at::Tensor LazyNativeFunctions::copy(const at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  torch::lazy::LazyTensorPtr target = torch::lazy::TryGetLtcTensor(self);
  torch::lazy::LazyTensorPtr value = torch::lazy::TryGetLtcTensor(src);
  if (!value) value = torch::lazy::LazyTensor::Create(src.detach(), target->GetDevice());
  torch::lazy::NodePtr node =
      torch::lazy::MakeNode<Copy>(target->GetIrValue(), value->GetIrValue(), non_blocking,
                                  torch::lazy::compute_shape_copy(self, src, non_blocking));
  return wrap(torch::lazy::LazyTensor::Create(std::move(node), target->GetDevice()));
}

// The result has the broadcast shape of self and mask (x.masked_fill(m) of an x of shape [5] and an m of
// [5, 5] is [5, 5]); torch's compute_shape_masked_fill gives self's.
at::Tensor LazyNativeFunctions::masked_fill(const at::Tensor& self, const at::Tensor& mask, const at::Scalar& value) {
  std::optional<torch::lazy::BackendDevice> device = torch::lazy::GetBackendDevice(self, mask);
  TORCH_INTERNAL_ASSERT(device);
  const std::vector<int64_t> shape = at::infer_size(self.sizes(), mask.sizes());
  const at::Tensor full = self.sizes().equals(shape) ? self : expand_copy(self, shape, false);
  torch::lazy::LazyTensorPtr lazy_self = torch::lazy::GetLtcTensorOrCreateForWrappedNumber(full, *device);
  torch::lazy::LazyTensorPtr lazy_mask = torch::lazy::GetLtcTensorOrCreateForWrappedNumber(mask, *device);
  torch::lazy::Value fill = torch::lazy::LazyGraphExecutor::Get()->GetIrValueForScalarFromCodegen(value, *device);
  torch::lazy::NodePtr node =
      torch::lazy::MakeNode<MaskedFillScalar>(lazy_self->GetIrValue(), lazy_mask->GetIrValue(), fill,
                                              std::vector<torch::lazy::Shape>{
                                                  torch::lazy::Shape(self.scalar_type(), shape)});
  return wrap(torch::lazy::LazyTensor::Create(std::move(node), *device));
}

// Outside training the CPU's kernel, which the program runs, saves no statistics: its second and third
// results are empty. torch's compute_shape_native_batch_norm gives them the channel count's size always.
std::tuple<at::Tensor, at::Tensor, at::Tensor> LazyNativeFunctions::native_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps) {
  std::optional<torch::lazy::BackendDevice> device =
      torch::lazy::GetBackendDevice(input, weight, bias, running_mean, running_var);
  TORCH_INTERNAL_ASSERT(device);
  auto value_of = [](const std::optional<at::Tensor>& t) -> std::optional<torch::lazy::Value> {
    torch::lazy::LazyTensorPtr lazy = torch::lazy::TryGetLtcTensor(t.value_or(at::Tensor()));
    return lazy ? std::make_optional(lazy->GetIrValue()) : std::nullopt;
  };
  std::vector<torch::lazy::Shape> shapes =
      torch::lazy::compute_shape_native_batch_norm(input, weight, bias, running_mean, running_var, training,
                                                   momentum, eps);
  if (!training) {
    for (size_t i : {1, 2}) shapes[i] = torch::lazy::Shape(shapes[i].scalar_type(), {0});
  }
  torch::lazy::NodePtr node = torch::lazy::MakeNode<NativeBatchNorm>(
      torch::lazy::GetLtcTensorOrCreateForWrappedNumber(input, *device)->GetIrValue(), value_of(weight),
      value_of(bias), value_of(running_mean), value_of(running_var), training, momentum, eps, std::move(shapes));
  std::vector<torch::lazy::LazyTensorPtr> results;
  for (size_t i = 0; i < 3; ++i) results.push_back(torch::lazy::LazyTensor::Create(torch::lazy::Value(node, i), *device));
  return torch::lazy::TupleAtenFromLtcTensors<3>(results);
}

// A lazy tensor is a value: a clone is the same value.
at::Tensor LazyNativeFunctions::clone(const at::Tensor& self, std::optional<at::MemoryFormat> memory_format) {
  torch::lazy::LazyTensorPtr t = torch::lazy::TryGetLtcTensor(self);
  return wrap(torch::lazy::LazyTensor::Create(t->GetIrValue(), t->GetDevice()));
}

at::Tensor& LazyNativeFunctions::fill_(at::Tensor& self, const at::Scalar& value) {
  torch::lazy::LazyTensorPtr t = torch::lazy::TryGetLtcTensor(self);
  t->SetInPlaceIrValue(
      torch::lazy::LazyGraphExecutor::Get()->GetIrValueForExpandedScalar(value, t->shape().Get(), t->GetDevice()));
  return self;
}

at::Tensor LazyNativeFunctions::_unsafe_view(const at::Tensor& self, at::IntArrayRef size) {
  return view_copy(self, size);
}

// torch.tensor(...) and friends on the lazy device: a new lazy tensor joins functionalization.
at::Tensor LazyNativeFunctions::lift(const at::Tensor& self) {
  return at::functionalization::impl::to_functional_tensor(self);
}

at::Tensor LazyNativeFunctions::lift_fresh(const at::Tensor& self) {
  return at::functionalization::impl::to_functional_tensor(self);
}

// ATen's kernels of these backward ops build a zero tensor and write the gradient into a view of it.
// They run below functionalization (they are functional ops), so their views would reach the Lazy key and
// fall back; functionalize_aten_op runs the same kernel with functionalization on, which turns the view
// write into select_scatter / slice_scatter.
at::Tensor LazyNativeFunctions::select_backward_symint(const at::Tensor& grad_output, c10::SymIntArrayRef input_sizes,
                                                      int64_t dim, c10::SymInt index) {
  return at::functionalization::functionalize_aten_op_symint<at::_ops::select_backward>::call(
      grad_output, input_sizes, dim, std::move(index));
}

at::Tensor LazyNativeFunctions::slice_backward_symint(const at::Tensor& grad_output, c10::SymIntArrayRef input_sizes,
                                                     int64_t dim, c10::SymInt start, c10::SymInt end,
                                                     c10::SymInt step) {
  return at::functionalization::functionalize_aten_op_symint<at::_ops::slice_backward>::call(
      grad_output, input_sizes, dim, std::move(start), std::move(end), std::move(step));
}

} // namespace my_device::lazy
