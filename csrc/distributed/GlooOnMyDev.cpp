// torch.distributed operators on mydev tensors whose process group has no
// stream-ordered backend for mydev.
//
// A "mydev:gloo" process group hands mydev tensors to ProcessGroupGloo, which
// reads and writes their memory from its own threads at the call: before the
// kernels queued on the stream have written it, and while later kernels may
// read it (silently wrong data, seen with send/recv). Gloo cannot wait for a
// mydev stream, so those calls are refused here, before the operator's
// PrivateUse1 kernel gives the tensors to gloo, with an error pointing to mccl,
// which runs on gloo's transport in stream order. An operator on mydev tensors
// of a process group without any mydev backend (init_process_group("gloo"))
// gets the same pointer added to c10d's error.
//
// The check sits on AutogradPrivateUse1, which every mydev tensor's dispatch
// passes and no c10d operator uses, so PyTorch's own PrivateUse1 kernels stay
// in place; after it, the call goes on to them.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

namespace my_device::distributed {
namespace {

constexpr const char* kUseMccl =
    "Use the 'mccl' backend for mydev tensors: init_process_group() with no backend picks it, or "
    "init_process_group(\"cpu:gloo,mydev:mccl\") keeps gloo for CPU tensors.";

c10::intrusive_ptr<c10d::ProcessGroup> process_group_of(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack.size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == "process_group") return stack[first + i].toCustomClass<c10d::ProcessGroup>();
  }
  return nullptr;
}

void check_backend(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto group = process_group_of(op, *stack);
  if (group) {
    c10::intrusive_ptr<c10d::Backend> backend;
    try {
      backend = group->getBackend(c10::DeviceType::PrivateUse1);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, e.what_without_backtrace(), "\n", kUseMccl);
    }
    TORCH_CHECK(backend->getBackendName() != "gloo", op.schema().name(),
                ": the gloo backend cannot serve mydev tensors. It reads and writes their memory from its own "
                "threads, outside mydev's stream order, so kernels still queued would not have written what it "
                "sends, nor waited for what it receives. ",
                kUseMccl);
  }
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

} // namespace

TORCH_LIBRARY_IMPL(c10d, AutogradPrivateUse1, m) {
  // Every c10d operator with a PrivateUse1 kernel that moves tensor data
  // (barrier's tensor only names a device).
  for (const char* name :
       {"send", "recv_", "recv_any_source_", "broadcast_", "allreduce_", "allreduce_coalesced_", "reduce_",
        "allgather_", "_allgather_base_", "allgather_coalesced_", "allgather_into_tensor_coalesced_", "gather_",
        "scatter_", "reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "alltoall_",
        "alltoall_base_"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&check_backend>());
  }
}

} // namespace my_device::distributed
