// Which aten ops run as host kernels on mydev: every operator overload that has
// a CPU kernel of its own, minus the exclusions below.
//
// The registration runs at module init (register_all_host_kernels, called from
// Module.cpp), not from a static initialiser: it must see every static
// PrivateUse1 registration of this library (views, copies, factories,
// convolution, dropout, BinaryOps) so that it never replaces one, and static
// initialisers across translation units run in no defined order.
//
// Ops that need no kernel at all are the composite ones, which have no CPU
// kernel of their own, so the rule leaves them alone:
// - CompositeImplicitAutograd ops (linear, matmul, softmax, dropout, embedding,
//   transpose, reshape, ...) decompose above autograd; mydev only sees their parts.
// - CompositeExplicitAutograd ops (stack, diagonal, full, zeros_like, rand, ...)
//   have one kernel for every backend, written in terms of other ops.
// Two overlaps are decided here. An op with both a CPU and a
// CompositeImplicitAutograd kernel (silu_backward, mish_backward,
// native_channel_shuffle) gets the host kernel, as it has a CPU and a CUDA
// kernel: its derivative comes from its Autograd kernel either way, and its
// decomposition would round half and bfloat16 at every step where the CPU
// kernel computes in float (silu's half gradients differed from the CPU's).
// An op with a CPU kernel and a CompositeExplicitAutograd* kernel
// (the functional and in-place forms of every structured op, addr, ...) gets
// the host kernel: the composite one would run the op as several ops (meta,
// empty, out=) where the CPU kernel is one call.
#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>

#include "HostKernel.h"
#include "Plan.h"
#include "Registration.h"

namespace my_device {
namespace {

struct Exclusion {
  std::string_view prefix;  // of the op name without "aten::"; "=" prefix: this exact name
  std::string_view reason;
};

// Ops whose CPU kernel must not serve mydev tensors. Everything else with a
// CPU kernel runs as a host kernel. The copying fallback still serves these
// (except views, which it refuses), and my_device.fallback_counts() shows it.
constexpr Exclusion kExclusions[] = {
    // Their CPU kernels produce or consume tensors of another layout or
    // backend (MkldnnCPU, NestedTensorCPU), which mydev cannot represent.
    // (Sparse layouts and quantized tensors it can: see Sparse.h, Quantized.cpp.)
    {"mkldnn", "produces or needs oneDNN (mkldnn) layout tensors"},
    {"_mkldnn", "produces or needs oneDNN (mkldnn) layout tensors"},
    {"to_mkldnn", "produces oneDNN (mkldnn) layout tensors"},
    {"fbgemm_", "packs weights into opaque fbgemm buffers"},
    {"_nested", "produces NestedTensorCPU tensors"},
    // The CPU's narrow_copy kernel indexes sizes by an unchecked dim (an
    // out-of-range dim is an internal check's error, not narrow's IndexError);
    // without it, mydev takes the composite kernel (narrow, then clone), as CUDA does.
    {"=narrow_copy", "the CPU kernel skips narrow's dimension check; the composite kernel, CUDA's, makes it"},
    // Pinning is a property of host memory; device tensors are never pinned,
    // and their answer comes from the device hooks, not from a CPU kernel.
    {"=_pin_memory", "host-memory pinning, meaningless for device tensors"},
    {"=is_pinned", "host-memory pinning, meaningless for device tensors"},
};

// Composite ops (no CPU kernel of their own) that still run as host kernels:
// their composite kernel, run on mydev tensors, would not do what it does on
// CPU ones.
struct CompositeOnHost {
  std::string_view name;  // with the overload: "mode.values"
  std::string_view reason;
};
constexpr CompositeOnHost kCompositesOnHost[] = {
    // addr_ calls addr_out(self, self, ...), and the CPU kernel tells in-place
    // from out= by the address of the two Tensor references. A boxed call (as
    // every host kernel is) gives each argument its own address, so on mydev
    // addr_ broadcast a 0-d self where the CPU rejects it. Run on host tensors,
    // the composite makes its unboxed CPU call with one reference.
    {"addr_", "addr_out tells in-place use by reference address, which a boxed call loses"},
    // mode's out= variant checks the device type against a fixed list
    // (CPU, CUDA, XPU); on host tensors it passes and calls the CPU kernel.
    {"mode.values", "checks the device type against CPU, CUDA and XPU"},
    // conj_physical_ runs conj_physical_stub on its argument's device type
    // itself: on mydev tensors the stub has no kernel (svd's out= variant
    // reaches it too, for complex results).
    {"conj_physical_", "calls the CPU loop's DispatchStub with the tensor's own device type"},
};

// oneDNN ops that work on ordinary dense CPU tensors, served like any other:
// the CPU's LSTM path (native/RNN.cpp's lstm) runs these.
constexpr std::string_view kDenseOneDnnOps[] = {"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"};

const Exclusion* find_exclusion(std::string_view name) {
  for (std::string_view dense : kDenseOneDnnOps) {
    if (name == dense) return nullptr;
  }
  for (const auto& e : kExclusions) {
    if (e.prefix.front() == '=' ? name == e.prefix.substr(1) : name.substr(0, e.prefix.size()) == e.prefix) {
      return &e;
    }
  }
  return nullptr;
}


// The quantized:: ops served besides aten's: those that take and return
// tensors and plain values only. An op holding packed weights (a custom class,
// quantized::linear's LinearPackedParamsBase) would keep host aliases of device
// memory inside an object that outlives the call.
bool is_plain_quantized_op(const c10::OperatorHandle& op) {
  if (op.operator_name().name.rfind("quantized::", 0) != 0 || !op.hasSchema()) return false;
  auto plain = [](const c10::Argument& a) { return a.type()->kind() != c10::TypeKind::ClassType; };
  const auto& schema = op.schema();
  return std::all_of(schema.arguments().begin(), schema.arguments().end(), plain) &&
         std::all_of(schema.returns().begin(), schema.returns().end(), plain);
}

std::string full_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

HostKernelCoverage g_coverage;

} // namespace

namespace {

// Each CPU backend key, and the mydev key its host kernels are registered for.
struct BackendPair {
  c10::DispatchKey cpu;
  c10::DispatchKey mydev;
  std::vector<std::string>* registered;
};

} // namespace

void register_all_host_kernels() {
  static bool done = false;
  if (done) return;
  done = true;
  // The dense pair comes first: the composites run as host kernels register in libs[0].
  const BackendPair pairs[] = {
      {c10::DispatchKey::CPU, c10::DispatchKey::PrivateUse1, &g_coverage.host_kernel},
      // Sparse layouts: HostCall maps a sparse tensor through its dense members.
      {c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1, &g_coverage.sparse_host_kernel},
      {c10::DispatchKey::SparseCsrCPU, c10::DispatchKey::SparseCsrPrivateUse1, &g_coverage.sparse_host_kernel},
      // Quantized tensors: HostCall maps them with their quantizers.
      {c10::DispatchKey::QuantizedCPU, c10::DispatchKey::QuantizedPrivateUse1, &g_coverage.quantized_host_kernel},
  };
  // The registrations live as long as the process; a Library's destructor
  // would unregister them.
  torch::Library* libs[std::size(pairs)];
  for (size_t i = 0; i < std::size(pairs); ++i) {
    libs[i] = new torch::Library(torch::Library::IMPL, "aten", pairs[i].mydev, __FILE__, __LINE__);
  }
  auto* quantized_lib = new torch::Library(torch::Library::IMPL, "quantized", c10::DispatchKey::QuantizedPrivateUse1,
                                           __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto handle = dispatcher.findOp(name);
    const bool aten = name.name.rfind("aten::", 0) == 0;
    if (!handle || (!aten && !is_plain_quantized_op(*handle))) continue;
    const std::string full = full_name(name);
    const Exclusion* exclusion = find_exclusion(std::string_view(name.name).substr(name.name.find("::") + 2));
    bool excluded = false;
    for (size_t i = 0; i < std::size(pairs); ++i) {
      const BackendPair& pair = pairs[i];
      if (!handle->hasKernelForDispatchKey(pair.cpu) || (!aten && pair.cpu != c10::DispatchKey::QuantizedCPU)) {
        continue;
      }
      if (handle->hasKernelForDispatchKey(pair.mydev)) {
        if (pair.mydev == c10::DispatchKey::PrivateUse1) g_coverage.own_kernel.push_back(full);
      } else if (exclusion != nullptr) {
        excluded = true;
      } else {
        (aten ? libs[i] : quantized_lib)
            ->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&host_kernel>());
        pair.registered->push_back(full);
      }
    }
    if (excluded) g_coverage.excluded.emplace_back(full, std::string(exclusion->reason));
  }
  // The in-place foreach ops have no CPU kernel: their composite kernel runs
  // one op per tensor, on CPU as on mydev. As host kernels they are one
  // queued kernel per call (Plan.h, Kind::InPlaceList), as CUDA's foreach
  // kernels are one launch per chunk of tensors.
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto handle = dispatcher.findOp(name);
    if (!handle || !handle->hasSchema() || !is_in_place_list_op(handle->schema()) ||
        handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
        !handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)) {
      continue;
    }
    const std::string full = full_name(name);
    libs[0]->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&host_kernel>());
    g_coverage.host_kernel.push_back(full);
  }
  for (const auto& c : kCompositesOnHost) {
    const std::string full = "aten::" + std::string(c.name);
    libs[0]->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&host_kernel>());
    g_coverage.host_kernel.push_back(full);
  }
}

const HostKernelCoverage& host_kernel_coverage() {
  return g_coverage;
}

} // namespace my_device
