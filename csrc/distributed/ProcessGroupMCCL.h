#pragma once
// mccl: the collective backend for mydev tensors, a c10d::Backend.
//
// Transport. mccl moves bytes with gloo (an existing engine, no new wire
// protocol): it holds a ProcessGroupGloo (`transport_`, built by
// my_device/distributed.py, since the wheel ships no gloo headers and so only
// the c10d::Backend interface is reachable from here) and hands it CPU tensors
// that alias the device memory itself. The emulated device's memory is host
// memory, so there is no staging copy; inside the operation the memory is
// reached at kernel addresses, as every kernel reaches it (strict mode).
// A vendor with a real interconnect replaces the transport and keeps the rest.
//
// Stream order, as NCCL's. An operation is a task on the group's
// communication stream for the device: that stream first waits for the work
// queued on the caller's current stream, so the operation sees every earlier
// kernel's writes, and the task then runs the gloo operation to its end while
// the caller's thread goes on. The returned Work completes asynchronously;
// Work::wait() makes the caller's current stream wait for it (the host does not
// wait, except for barrier, as NCCL's barrier), and so does the Work's Future.
//
// Point-to-point. A send that waits for its receiver must not hold up the
// receive queued behind it on the same rank (isend then irecv on both ranks of
// a ring), so send/recv tasks only start their transfer; a second stream per
// device completes them in order, and their Work waits for that. A later
// operation that touches the same memory (a recv's buffer, or anything a
// collective writes) waits for the transfer first.
//
// Failures (a peer that died, a timeout) name the collective and the rank:
// Work::wait() raises them when already known, and they are reported at the
// next synchronisation like a failed kernel, since the memory is unreliable.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include <mydev_runtime.h>

namespace my_device::distributed {

struct CommOp;
struct GroupState;

class ProcessGroupMCCL final : public c10d::Backend {
 public:
  ProcessGroupMCCL(c10::intrusive_ptr<c10d::Backend> transport, int rank, int size,
                   std::chrono::milliseconds timeout);
  ~ProcessGroupMCCL() override;

  const std::string getBackendName() const override {
    return "mccl";
  }
  c10::intrusive_ptr<Options> getBackendOptions() override {
    return options_;
  }
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // How an operation is queued; see ProcessGroupMCCL.cpp.
  struct Call;

 private:
  c10::intrusive_ptr<c10d::Work> enqueue(Call call);

  std::shared_ptr<GroupState> state_;
  c10::intrusive_ptr<Options> options_;
};

} // namespace my_device::distributed
