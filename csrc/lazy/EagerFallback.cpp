// The Lazy backend's eager fallback: an op without a lazy kernel runs on the
// device itself. Its lazy tensor arguments are materialised as mydev tensors,
// the op runs as an ordinary mydev kernel, results become lazy tensors again
// (with mydev data) and in-place arguments are updated. PyTorch's TorchScript fallback is
// not exported, and it would run on the CPU.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/core/tensor_impl.h>
#include <torch/library.h>

#include "Lazy.h"
#include "core/Device.h"
#include "native/Fallback.h"
#include "native/hostkernel/HostCall.h"

namespace my_device::lazy {

namespace {

// A lazy tensor's value as a mydev tensor (materialising its graph). A lazy
// tensor made from a host tensor (`.to("lazy")`) gives back that host tensor
// itself: the op must see it on the device, as the traced graph does.
at::Tensor to_eager(const at::Tensor& t, const torch::lazy::BackendDevice& device) {
  auto ltc = torch::lazy::TryGetLtcTensor(t);
  TORCH_CHECK(ltc, "mydev lazy fallback: not a lazy tensor");
  at::Tensor eager = ltc->ToTensor(/*detached=*/true);
  return eager.device().type() == kMyDev ? eager : eager.to(device_of(device));
}

bool is_lazy(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::kLazy;
}

void eager_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  record_fallback("lazy::" + c10::toString(schema.operator_name()), schema, *stack);
  metrics().fallback_ops += 1;
  std::optional<torch::lazy::BackendDevice> device;
  for (size_t i = first; i < stack->size() && !device; ++i) {
    for_each_tensor((*stack)[i], [&](const at::Tensor& t) {
      if (!device && is_lazy(t)) device = torch::lazy::TryGetLtcTensor(t)->GetDevice();
    });
  }
  // A factory (no tensor argument: _efficientzerotensor, a backward's zeros) names the lazy device in its
  // device argument, which would bring the call back here without end: it runs on the device's mydev.
  for (size_t i = first; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isDevice() && v.toDevice().type() == c10::kLazy) {
      const torch::lazy::BackendDevice lazy_device = torch::lazy::atenDeviceToBackendDevice(v.toDevice());
      if (!device) device = lazy_device;
      v = c10::IValue(device_of(lazy_device));
    }
  }
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (lazy argument, its eager stand-in)
  for (size_t i = first; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    const c10::Argument& formal = schema.arguments()[i - first];
    const bool writes = formal.alias_info() && formal.alias_info()->isWrite();
    // Every kind of tensor argument (Tensor, Tensor[], Tensor?[] as indexing's
    // indices): one left lazy would bring the call back here, without end.
    v = map_tensors(v, [&](const at::Tensor& t) {
      if (!is_lazy(t)) return t;
      at::Tensor eager = to_eager(t, *device);
      if (writes) {
        // The op writes a copy: the tensor holding the lazy tensor's value may be the device data of
        // nodes traced before (soft_margin_loss sums its output, then resizes it), which must keep it.
        eager = eager.clone(at::MemoryFormat::Preserve);
        written.emplace_back(t, eager);
      }
      return eager;
    });
  }
  op.callBoxed(stack);
  for (auto& [lazy, eager] : written) {
    torch::lazy::LazyTensorPtr target = torch::lazy::TryGetLtcTensor(lazy);
    if (lazy.sizes() == eager.sizes()) {
      target->UpdateFromTensor(eager, /*sync=*/false);
    } else {
      // An out= argument the op resized (neg_out into an empty tensor): the lazy tensor takes the new
      // shape, and its impl, which caches sizes, is told.
      target->UpdateFromTensorOut(eager);
      static_cast<torch::lazy::LTCTensorImpl*>(lazy.unsafeGetTensorImpl())->force_refresh_sizes();
    }
  }
  const size_t nrets = schema.returns().size();
  for (size_t r = 0; r < nrets; ++r) {
    c10::IValue& v = (*stack)[stack->size() - nrets + r];
    v = map_tensors(v, [&](const at::Tensor& t) {
      if (!t.defined()) return t;
      for (auto& [lazy, eager] : written) {
        if (t.is_same(eager)) return lazy;  // a return aliasing a written argument is that argument
      }
      TORCH_CHECK(device.has_value(), "mydev lazy fallback: ", schema.name(), " has no lazy tensor or device argument");
      // A lazy tensor's value is strided; one holding a sparse value would make every later mark_step
      // fail for as long as it lives.
      TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == at::kStrided, "mydev lazy tensors hold strided values only: ",
                                  schema.name(), " returned a tensor of layout ", t.layout());
      return torch::lazy::CreateAtenFromLtcTensor(torch::lazy::LazyTensor::Create(t, *device));
    });
  }
}

} // namespace

void register_eager_fallback() {
  static torch::Library library(torch::Library::IMPL, "_", c10::DispatchKey::Lazy, __FILE__, __LINE__);
  library.fallback(torch::CppFunction::makeFromBoxedFunction<&eager_fallback>());
}

} // namespace my_device::lazy
