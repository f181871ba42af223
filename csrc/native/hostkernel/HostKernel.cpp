#include "HostKernel.h"

#include <c10/core/impl/COW.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "Breakdown.h"
#include "QueuedHostKernel.h"

namespace my_device {

namespace {

constexpr c10::DeviceType kCPU = c10::DeviceType::CPU;

[[noreturn]] void device_mismatch(c10::Device first, c10::Device other) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
              first, " and ", other, "!");
}

// Finds the device of the call and rejects mixed devices, as CUDA does: a 0-dim
// CPU tensor read as a scalar is fine, as are CPU index tensors inside
// Tensor?[]; a written one is not (an out= or in-place target on the host).
class DeviceScan {
 public:
  void tensor(const at::Tensor& t, bool cpu_allowed, bool written = false) {
    if (!t.defined()) return;
    const c10::Device d = t.device();
    if (d.type() == kMyDev) {
      if (!device_) {
        device_ = d;
        if (other_) device_mismatch(*device_, *other_);
      } else if (*device_ != d) {
        device_mismatch(*device_, d);
      }
    } else if (!(d.type() == kCPU && !written && (cpu_allowed || t.dim() == 0))) {
      if (device_) device_mismatch(*device_, d);
      if (!other_) other_ = d;
    }
  }
  void device(const c10::Device& d) {
    if (d.type() == kMyDev && !device_) device_ = d;
  }
  c10::DeviceIndex result() const {
    if (!device_) return current_device();
    return device_->has_index() ? device_->index() : current_device();
  }

 private:
  std::optional<c10::Device> device_;
  std::optional<c10::Device> other_;
};

// A lazy clone (torch._lazy_clone, copy-on-write) the op writes gets bytes of
// its own now, in stream order (the allocator's copy_data): the CPU kernel
// reaches its operands through host aliases over the bytes as they are
// (host_storage_over), which do not copy on write, and must not write bytes
// other tensors share. Tensors it only reads stay shared, as on the CPU.
void materialize_written(const at::Tensor& t) {
  if (t.defined() && t.has_storage() && c10::impl::cow::is_cow_data_ptr(t.storage().data_ptr())) {
    (void)t.storage().mutable_data();
  }
}

} // namespace

bool writes_unannotated(const c10::Argument& a) {
  return a.name() == "running_mean" || a.name() == "running_var";
}

void host_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  breakdown::Clock clock;

  DeviceScan scan;
  const auto& arguments = schema.arguments();
  for (size_t i = first; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      const auto* alias = arguments[i - first].alias_info();
      const bool written = (alias != nullptr && alias->isWrite()) || writes_unannotated(arguments[i - first]);
      scan.tensor(v.toTensor(), false, written);
      if (written) materialize_written(v.toTensor());
    } else if (v.isTensorList()) {
      const bool written = arguments[i - first].alias_info() != nullptr;  // Tensor(a!)[]
      for (const at::Tensor& t : v.toTensorList()) {
        scan.tensor(t, false);
        if (written) materialize_written(t);
      }
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) scan.tensor(e.toTensor(), true);
      }
    } else if (v.isDevice()) {
      scan.device(v.toDevice());
    }
  }
  const c10::DeviceIndex device = scan.result();
  check_device_index(device);
  clock.mark(breakdown::kDeviceScan);
  PendingConfirmation pending;
  if (queue_host_kernel(op, stack, device, pending)) {
    breakdown::count(/*queued=*/true);
    return;
  }
  breakdown::Clock inline_clock;

  RuntimeDeviceGuard on_device(device);
  // A first run that confirms a signature must not warn (confirm_signature);
  // its wait is the emulator's, which the sync debug mode does not report.
  std::optional<WarningWatch> watch;
  std::optional<UnreportedSync> unreported;
  if (pending.awaiting()) {
    watch.emplace(/*forward=*/true);
    unreported.emplace();
  }
  launch_inline(device, [&] {
    HostCall call(device);
    auto host = [&](const at::Tensor& t) { return call.to_host(t); };
    for (size_t i = first; i < stack->size(); ++i) {
      c10::IValue& v = (*stack)[i];
      if (v.isDevice() && v.toDevice().type() == kMyDev) {
        v = c10::Device(kCPU);
      } else {
        v = map_tensors(host_generator(v, schema.arguments()[i - first], device), host);
      }
    }
    // A sparse factory (no sparse argument) was dispatched here by its layout.
    c10::DispatchKeySet keys = call.host_keys();
    if (ks.has(c10::DispatchKey::SparsePrivateUse1)) keys = keys | c10::DispatchKeySet(c10::DispatchKey::SparseCPU);
    if (ks.has(c10::DispatchKey::SparseCsrPrivateUse1)) {
      keys = keys | c10::DispatchKeySet(c10::DispatchKey::SparseCsrCPU);
    }
    op.redispatchBoxed(keys, stack);
    call.write_back();
    const size_t nrets = schema.returns().size();
    for (size_t i = stack->size() - nrets; i < stack->size(); ++i) {
      c10::IValue& v = (*stack)[i];
      if (v.isTensor()) {
        v = call.to_device(v.toTensor());
      } else if (v.isTensorList()) {
        c10::List<at::Tensor> out;
        out.reserve(v.toTensorList().size());
        for (const at::Tensor& t : v.toTensorList()) out.push_back(call.to_device(t));
        v = std::move(out);
      }
    }
  });
  confirm_signature(pending, *stack, schema.returns().size(), watch && watch->warned());
  inline_clock.mark(breakdown::kInline);
  breakdown::count(/*queued=*/false);
}

const c10::OperatorHandle& op_named(const char* label) {
  static std::mutex mutex;
  static std::unordered_map<std::string, c10::OperatorHandle> ops;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = ops.find(label);
  if (it == ops.end()) {
    const std::string full(label);
    const size_t dot = full.find('.');
    const std::string name = full.substr(0, dot);
    const std::string overload = dot == std::string::npos ? "" : full.substr(dot + 1);
    it = ops.emplace(full, c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str())).first;
  }
  return it->second;
}

} // namespace my_device
