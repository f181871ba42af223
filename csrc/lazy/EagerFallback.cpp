// The Lazy backend's eager fallback: an op without a lazy kernel runs on the
// device itself. Its lazy tensor arguments are materialised as mydev tensors,
// the op runs as an ordinary mydev kernel, results become lazy tensors again
// (with mydev data) and in-place arguments are updated. PyTorch's TorchScript fallback is
// not exported, and it would run on the CPU.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/library.h>

#include "Lazy.h"
#include "core/Device.h"
#include "native/Fallback.h"

namespace my_device::lazy {

namespace {

// A lazy tensor's value as a mydev tensor (materialising its graph), and back.
at::Tensor to_eager(const at::Tensor& t) {
  auto ltc = torch::lazy::TryGetLtcTensor(t);
  TORCH_CHECK(ltc, "mydev lazy fallback: not a lazy tensor");
  return ltc->ToTensor(/*detached=*/true);
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
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (lazy argument, its eager stand-in)
  std::optional<torch::lazy::BackendDevice> device;
  for (size_t i = first; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    const c10::Argument& formal = schema.arguments()[i - first];
    const bool writes = formal.alias_info() && formal.alias_info()->isWrite();
    if (v.isTensor() && is_lazy(v.toTensor())) {
      const at::Tensor lazy = v.toTensor();
      if (!device) device = torch::lazy::TryGetLtcTensor(lazy)->GetDevice();
      at::Tensor eager = to_eager(lazy);
      if (writes) written.emplace_back(lazy, eager);
      v = eager;
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> eager;
      for (const at::Tensor& t : v.toTensorList()) eager.push_back(is_lazy(t) ? to_eager(t) : t);
      v = eager;
    }
  }
  op.callBoxed(stack);
  for (auto& [lazy, eager] : written) torch::lazy::TryGetLtcTensor(lazy)->UpdateFromTensor(eager, /*sync=*/false);
  const size_t nrets = schema.returns().size();
  for (size_t r = 0; r < nrets; ++r) {
    c10::IValue& v = (*stack)[stack->size() - nrets + r];
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    bool aliased = false;  // a return aliasing a written argument is that argument
    for (auto& [lazy, eager] : written) {
      if (!aliased && v.toTensor().is_same(eager)) {
        v = lazy;
        aliased = true;
      }
    }
    if (!aliased) {
      TORCH_CHECK(device.has_value(), "mydev lazy fallback: ", schema.name(), " has no lazy tensor argument");
      v = torch::lazy::CreateAtenFromLtcTensor(torch::lazy::LazyTensor::Create(v.toTensor(), *device));
    }
  }
}

} // namespace

void register_eager_fallback() {
  static torch::Library library(torch::Library::IMPL, "_", c10::DispatchKey::Lazy, __FILE__, __LINE__);
  library.fallback(torch::CppFunction::makeFromBoxedFunction<&eager_fallback>());
}

} // namespace my_device::lazy
