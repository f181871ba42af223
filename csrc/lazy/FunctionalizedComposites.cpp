// Composite kernels run with functionalization on, for every functional op
// whose kernel is a composite (CompositeExplicitAutograd: ATen's, and a
// torch.library.custom_op's Python implementation) and that mydev's Lazy
// backend does not trace itself.
//
// Functionalization sits above the Lazy key and rewrites the views and
// in-place writes a program makes. A composite kernel runs below it, so the
// views and writes it makes inside reach the Lazy key as themselves: repeat
// copies into an unfold of an alias of its result, and a lazy tensor cannot
// alias another, so the eager fallback made each view a copy and the write into
// it was lost (a wrong value, or a view of a copy that no longer fits). Run
// with functionalization on, those views and writes trace as copy and scatter
// ops, as PyTorch's functionalize_aten_op does for one op at a time. An op added
// to PyTorch inherits the rule.
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "Lazy.h"
#include "native/hostkernel/HostCall.h"

namespace my_device::lazy {

namespace {

// The dispatcher reaches an alias key's kernel (CompositeExplicitAutograd)
// only through a runtime key whose slot it fills. No library registers
// anything for PrivateUse3, so its slot in an op's table holds the composite.
constexpr c10::DispatchKey kCompositeSlot = c10::DispatchKey::PrivateUse3;

bool is_functional_composite(const c10::OperatorHandle& op) {
  using c10::DispatchKey;
  if (!op.hasSchema()) return false;
  if (!op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd)) return false;
  if (op.hasKernelForDispatchKey(DispatchKey::Lazy) || op.hasKernelForDispatchKey(kCompositeSlot)) return false;
  const c10::FunctionSchema& schema = op.schema();
  if (schema.is_mutable()) return false;
  // A view op's result aliases its input; functionalization above turns every
  // view a program makes into a copy op already.
  return std::none_of(schema.returns().begin(), schema.returns().end(),
                      [](const c10::Argument& r) { return r.alias_info() != nullptr; });
}

void run_functionalized(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // A composite that writes its result in place (fill is empty_like, then
  // fill_) comes back here through functionalization, which rewrites the
  // write into the op itself: that call runs the composite as it is, its
  // write reaching the Lazy kernel of the in-place op.
  static thread_local std::vector<c10::OperatorName> running;
  const c10::OperatorName& name = op.operator_name();
  if (std::find(running.begin(), running.end(), name) != running.end()) {
    op.redispatchBoxed(c10::DispatchKeySet(kCompositeSlot), stack);
    return;
  }
  // Called with functionalization on (a factory such as zeros inside another
  // composite: no tensor argument brings the call through the Functionalize
  // key), the composite's ops are functionalized already, and its results
  // must stay functional tensors for the caller.
  const c10::impl::LocalDispatchKeySet tls = c10::impl::tls_local_dispatch_key_set();
  if (!tls.excluded_.has(c10::DispatchKey::Functionalize)) {
    op.redispatchBoxed(c10::DispatchKeySet(kCompositeSlot), stack);
    return;
  }
  running.push_back(name);
  struct Pop {
    ~Pop() { running.pop_back(); }
  } pop;

  const size_t nargs = op.schema().arguments().size();
  for (size_t i = stack->size() - nargs; i < stack->size(); ++i) {
    (*stack)[i] = map_tensors((*stack)[i], [](const at::Tensor& t) {
      return t.defined() && !at::functionalization::impl::isFunctionalTensor(t)
                 ? at::functionalization::impl::to_functional_tensor(t)
                 : t;
    });
  }
  {
    // Functionalization already ran above this call and excluded itself for
    // the rest of it; it is let in again for the composite's ops.
    c10::impl::PODLocalDispatchKeySet enabled;
    enabled.set_included(tls.included_);
    enabled.set_excluded(tls.excluded_.remove(c10::DispatchKey::Functionalize));
    c10::impl::ForceDispatchKeyGuard guard(enabled);
    op.redispatchBoxed(c10::DispatchKeySet(kCompositeSlot), stack);
  }
  const size_t nrets = op.schema().returns().size();
  for (size_t i = stack->size() - nrets; i < stack->size(); ++i) {
    (*stack)[i] = map_tensors((*stack)[i], [](const at::Tensor& t) {
      if (!t.defined() || !at::functionalization::impl::isFunctionalTensor(t)) return t;
      at::functionalization::impl::sync(t);
      return at::functionalization::impl::from_functional_tensor(t);
    });
  }
}

} // namespace

void register_functionalized_composites() {
  // Idempotent (an op given the kernel has a Lazy kernel, and is skipped), and called again from
  // my_device.lazy.init() for the ops defined since.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(name);
    if (!op || !is_functional_composite(*op)) continue;
    // One library per namespace: a library implements only its own namespace's ops.
    const std::string ns = name.name.substr(0, name.name.find("::"));
    static std::unordered_map<std::string, std::unique_ptr<torch::Library>> libraries;
    auto& library = libraries[ns];
    if (!library) {
      library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::Lazy, __FILE__, __LINE__);
    }
    const std::string qualified = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&run_functionalized>());
  }
}

} // namespace my_device::lazy
