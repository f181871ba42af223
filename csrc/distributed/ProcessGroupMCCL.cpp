#include "ProcessGroupMCCL.h"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <thread>
#include <unordered_map>

#include "core/Device.h"
#include "core/Event.h"
#include "core/Exception.h"
#include "core/Launch.h"
#include "core/Stream.h"

namespace my_device::distributed {

using TransportCall = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)>;

// What a collective asks of enqueue().
struct ProcessGroupMCCL::Call {
  const char* name;   // in torch.distributed's words: "all_reduce"
  const char* label;  // names the task in kernel error reports; a literal ("mccl all_reduce")
  c10d::OpType type;
  c10::DeviceIndex device = -1;
  std::vector<at::Tensor> reads;    // memory the operation reads ...
  std::vector<at::Tensor> writes;   // ... and writes: kept alive until it ran, and checked for overlap
  std::vector<at::Tensor> outputs;  // Work::result() and the Future's value
  bool point_to_point = false;
  bool blocking = false;  // barrier: wait() also makes the host wait
  bool fence = false;     // barrier: starts after every transfer in flight completed
  bool join = false;      // endCoalescing: no transport call, completes after everything before it
  TransportCall run;               // on the stream: the transport call, on host views of the tensors
  std::function<void()> after;     // on the stream, once run's work completed
};

// One operation, shared by its tasks on the streams and its Work.
struct CommOp {
  std::string name;
  int rank = 0;
  int size = 0;
  std::vector<at::Tensor> reads, writes;
  bool point_to_point = false;
  TransportCall run;
  std::function<void()> after;
  c10::intrusive_ptr<c10d::Work> transport_work;  // set on the communication stream
  Event done;                                      // recorded after the operation completed

  std::exception_ptr error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

  // Keeps the failure for Work::wait and raises it for the task, whose report
  // (at the next synchronisation) carries the op's label.
  [[noreturn]] void fail(const std::string& what) {
    const std::string message = "failed on rank " + std::to_string(rank) + " (of " + std::to_string(size) +
                                " ranks): " + what;
    try {
      C10_THROW_ERROR(DistBackendError, "mccl " + name + " " + message);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    throw std::runtime_error(message);
  }

 private:
  mutable std::mutex mutex_;
  std::exception_ptr error_;
};

struct DeviceStreams {
  c10::Stream comm;        // runs every operation of the group on this device, in the callers' order
  c10::Stream completion;  // completes point-to-point transfers, in order
  Event ready;             // re-recorded per operation: the caller's stream reached it
  Event issued;            // re-recorded per operation: the comm stream started it
};

struct GroupState {
  c10::intrusive_ptr<c10d::Backend> transport;
  int rank = 0;
  int size = 0;
  std::chrono::milliseconds timeout;

  // Host side: enqueue() is called by one thread at a time, so operations
  // take their places on the streams in the order the program issued them.
  std::mutex enqueue_mutex;
  std::unordered_map<c10::DeviceIndex, DeviceStreams> streams;
  c10::DeviceIndex last_device = -1;
  bool coalescing = false;

  // Stream side: transfers started on the comm stream, not yet completed.
  std::mutex in_flight_mutex;
  std::vector<std::shared_ptr<CommOp>> in_flight;
};

namespace {

std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

// A CPU tensor over the same bytes, for the transport. Only inside a task on
// a stream: it reaches device memory at its kernel address.
at::Tensor host_view(const at::Tensor& t) {
  if (!t.defined()) return t;
  const auto options = t.options().device(at::kCPU);
  if (t.numel() == 0) return at::empty(t.sizes(), options);
  return at::from_blob(kernel_address(t.data_ptr()), t.sizes(), t.strides(), options);
}

std::vector<at::Tensor> host_views(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> views;
  views.reserve(tensors.size());
  for (const at::Tensor& t : tensors) views.push_back(host_view(t));
  return views;
}

std::vector<std::vector<at::Tensor>> host_views(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<std::vector<at::Tensor>> views;
  views.reserve(lists.size());
  for (const auto& list : lists) views.push_back(host_views(list));
  return views;
}

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> all;
  for (const auto& list : lists) all.insert(all.end(), list.begin(), list.end());
  return all;
}

bool shares_memory(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (const at::Tensor& x : a) {
    if (!x.defined() || !x.has_storage()) continue;
    for (const at::Tensor& y : b) {
      if (y.defined() && y.has_storage() && x.is_alias_of(y)) return true;
    }
  }
  return false;
}

// `later` must wait for `earlier` if either writes what the other touches.
bool conflicts(const CommOp& later, const CommOp& earlier) {
  return shares_memory(later.writes, earlier.reads) || shares_memory(later.writes, earlier.writes) ||
         shares_memory(later.reads, earlier.writes);
}

void check_tensor(const char* name, const at::Tensor& t, c10::DeviceIndex& device) {
  TORCH_CHECK(t.defined(), "mccl ", name, ": got an undefined tensor");
  TORCH_CHECK(t.device().type() == kMyDev, "mccl ", name, ": expected mydev tensors, got a tensor on ", t.device(),
              ". mccl serves mydev tensors only; for CPU tensors use a process group with a CPU backend, "
              "e.g. init_process_group(\"cpu:gloo,mydev:mccl\")");
  TORCH_CHECK(t.layout() == at::kStrided, "mccl ", name, ": only dense (strided) tensors are supported, got ",
              t.layout());
  TORCH_CHECK(t.is_contiguous(), "mccl ", name, ": tensors must be contiguous");
  TORCH_CHECK(device < 0 || t.device().index() == device, "mccl ", name,
              ": all tensors must be on the same mydev device, got mydev:", static_cast<int>(device), " and ",
              t.device());
  device = t.device().index();
}

c10::DeviceIndex check_tensors(const char* name, std::initializer_list<const std::vector<at::Tensor>*> lists) {
  c10::DeviceIndex device = -1;
  for (const auto* list : lists) {
    for (const at::Tensor& t : *list) check_tensor(name, t, device);
  }
  TORCH_CHECK(device >= 0, "mccl ", name, ": got no tensors");
  return device;
}

void check_rank(const char* name, const char* what, int64_t rank, int size) {
  TORCH_CHECK(rank >= 0 && rank < size, "mccl ", name, ": invalid ", what, " ", rank, " for a group of ", size,
              " ranks");
}

void check_same_dtype(const char* name, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "mccl ", name, ": tensors must have the same dtype, got ",
              a.scalar_type(), " and ", b.scalar_type());
}

void check_reduce_op(const char* name, const c10d::ReduceOp& op, const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    const bool integral = at::isIntegralType(t.scalar_type(), /*includeBool=*/true);
    if (op.op_ == c10d::ReduceOp::AVG || op.op_ == c10d::ReduceOp::PREMUL_SUM) {
      TORCH_CHECK(!integral, "mccl ", name, ": ReduceOp.", op.op_ == c10d::ReduceOp::AVG ? "AVG" : "PREMUL_SUM",
                  " needs floating point tensors, got ", t.scalar_type());
    }
    if (op.op_ == c10d::ReduceOp::BAND || op.op_ == c10d::ReduceOp::BOR || op.op_ == c10d::ReduceOp::BXOR) {
      TORCH_CHECK(integral, "mccl ", name, ": bitwise reductions need integral tensors, got ", t.scalar_type());
    }
  }
}

// PREMUL_SUM (a scaled sum, which FSDP uses) is not a gloo operation: the
// transport sums, then the result is scaled, which equals scaling each input.
c10d::ReduceOp transport_op(const c10d::ReduceOp& op) {
  return op.op_ == c10d::ReduceOp::PREMUL_SUM ? c10d::ReduceOp(c10d::ReduceOp::SUM) : op;
}

std::function<void()> premul_scaling(const c10d::ReduceOp& op, std::vector<at::Tensor> outputs) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return nullptr;
  const auto* factor = static_cast<const c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(factor != nullptr, "mccl: ReduceOp.PREMUL_SUM without a factor");
  const double scalar = factor->double_factor;
  const at::Tensor tensor = factor->tensor_factor;
  return [scalar, tensor, outputs] {
    const double f = tensor.defined() ? (tensor.is_cpu() ? tensor : host_view(tensor)).item<double>() : scalar;
    for (const at::Tensor& out : outputs) host_view(out).mul_(f);
  };
}

// Queues body on `stream` as a kernel: launch_async keeps the task's
// references until it ran, names it in failure reports and frees it on a host
// thread. It launches on the current stream, so that is switched for the call.
template <class F>
void launch_on(const c10::Stream& stream, const char* label, F&& body) {
  const c10::Stream previous = current_stream(stream.device_index());
  set_current_stream(stream);
  try {
    launch_async(stream.device_index(), label, std::forward<F>(body));
  } catch (...) {
    set_current_stream(previous);
    throw;
  }
  set_current_stream(previous);
}

// The comm stream's task: waits for transfers in flight that touch the same
// memory, then runs the transport call. A collective runs to its end here, so
// that the stream orders it before what follows; a transfer only starts.
void issue(GroupState& group, const std::shared_ptr<CommOp>& op, bool fence) {
  std::vector<std::shared_ptr<CommOp>> earlier;
  {
    std::lock_guard<std::mutex> lock(group.in_flight_mutex);
    for (const auto& other : group.in_flight) {
      if (fence || conflicts(*op, *other)) earlier.push_back(other);
    }
  }
  for (const auto& other : earlier) {
    try {
      other->transport_work->wait();
    } catch (...) {
      // Reported by that transfer's own completion.
    }
  }
  if (!op->run) return;  // a join
  try {
    op->transport_work = op->run(*group.transport);
    if (op->point_to_point) {
      std::lock_guard<std::mutex> lock(group.in_flight_mutex);
      group.in_flight.push_back(op);
      return;
    }
    op->transport_work->wait();
    if (op->after) op->after();
  } catch (const std::exception& e) {
    op->fail(error_text(e));
  }
}

// The completion stream's task for a transfer.
void complete(GroupState& group, const std::shared_ptr<CommOp>& op) {
  if (!op->transport_work) return;  // it failed to start: reported by the comm stream's task
  auto leave = [&] {
    std::lock_guard<std::mutex> lock(group.in_flight_mutex);
    auto& v = group.in_flight;
    v.erase(std::remove(v.begin(), v.end(), op), v.end());
  };
  try {
    op->transport_work->wait();
  } catch (const std::exception& e) {
    leave();
    op->fail(error_text(e));
  }
  leave();
}

class WorkMCCL final : public c10d::Work {
 public:
  WorkMCCL(std::shared_ptr<CommOp> op, const c10::Stream& done_stream, c10d::OpType type, int rank,
           std::vector<at::Tensor> outputs, bool blocking)
      : Work(rank, type),
        op_(std::move(op)),
        device_(done_stream.device_index()),
        outputs_(std::move(outputs)),
        blocking_(blocking) {
    // As NCCL's: the Future is complete once the operation is queued; its
    // value is usable on the streams that wait for it (it records an event on
    // done_stream, after the operation, and waiting makes the current stream
    // wait for that event).
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{c10::Device(kMyDev, device_)});
    c10::StreamGuard on_done_stream(done_stream);
    future_->markCompleted(c10::IValue(outputs_));
  }

  bool isCompleted() override {
    const mydevError_t err = op_->done.query();
    if (err == mydevErrorNotReady) return false;
    MYDEV_CHECK(err);
    return true;
  }

  bool isSuccess() const override {
    return op_->done.query() == mydevSuccess && !op_->error();
  }

  std::exception_ptr exception() const override {
    return op_->error();
  }

  std::vector<at::Tensor> result() override {
    return outputs_;
  }

  void synchronize() override {
    block_current_stream();
  }

  void blockCurrentStream() override {
    block_current_stream();
  }

  // As NCCL's: the current stream waits, the host does not, so `timeout`
  // bounds only a host wait (barrier); a peer that fails or stops answering
  // fails the operation within the group's timeout either way.
  bool wait(std::chrono::milliseconds timeout) override {
    raise_if_failed();
    block_current_stream();
    // As NCCL's: a timeout given to wait() makes the host wait (and raise once it
    // has passed), even when the group does not block.
    if (blocking_ || timeout != kNoTimeout) {
      if (timeout != kNoTimeout) wait_on_host_for(timeout);
      wait_on_host();
      raise_if_failed();
    }
    return true;
  }

  int sourceRank() const override {
    wait_on_host();
    raise_if_failed();
    TORCH_CHECK(op_->transport_work, "mccl: the receive did not start");
    return op_->transport_work->sourceRank();
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

 private:
  void raise_if_failed() const {
    if (auto error = op_->error()) std::rethrow_exception(error);
  }

  void block_current_stream() {
    RuntimeDeviceGuard on_device(device_);
    MYDEV_CHECK(mydevStreamWaitEvent(current_stream_handle(device_), op_->done.get()));
  }

  void wait_on_host_for(std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (op_->done.query() == mydevErrorNotReady) {
      if (std::chrono::steady_clock::now() >= deadline) {
        C10_THROW_ERROR(DistBackendError, "mccl " + op_->name + ": wait timed out after " +
                                              std::to_string(timeout.count()) + "ms on rank " +
                                              std::to_string(op_->rank) + " (of " + std::to_string(op_->size) +
                                              " ranks)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  void wait_on_host() const {
    // (torch's Python binding of Work.wait releases the GIL.)
    finish_host_wait(op_->done.synchronize());
  }

  std::shared_ptr<CommOp> op_;
  c10::DeviceIndex device_;
  std::vector<at::Tensor> outputs_;
  bool blocking_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

} // namespace

ProcessGroupMCCL::ProcessGroupMCCL(c10::intrusive_ptr<c10d::Backend> transport, int rank, int size,
                                   std::chrono::milliseconds timeout)
    : Backend(rank, size),
      state_(std::make_shared<GroupState>()),
      options_(c10::make_intrusive<Options>("mccl", timeout)) {
  TORCH_CHECK(transport, "mccl: no transport");
  state_->transport = std::move(transport);
  state_->rank = rank;
  state_->size = size;
  state_->timeout = timeout;
  init();
}

ProcessGroupMCCL::~ProcessGroupMCCL() = default;

void ProcessGroupMCCL::setSequenceNumberForGroup() {
  state_->transport->setSequenceNumberForGroup();
}

uint64_t ProcessGroupMCCL::getSequenceNumberForGroup() {
  return state_->transport->getSequenceNumberForGroup();
}

void ProcessGroupMCCL::startCoalescing() {
  std::lock_guard<std::mutex> lock(state_->enqueue_mutex);
  state_->coalescing = true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::endCoalescing() {
  {
    std::lock_guard<std::mutex> lock(state_->enqueue_mutex);
    TORCH_CHECK(state_->coalescing, "mccl: endCoalescing without startCoalescing");
    state_->coalescing = false;
  }
  // Operations run as they are called; the coalesced Work completes after all of them.
  Call call{"coalesced", "mccl coalesced", c10d::OpType::COALESCED};
  call.device = state_->last_device >= 0 ? state_->last_device : current_device();
  call.join = true;
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::enqueue(Call call) {
  auto op = std::make_shared<CommOp>();
  op->name = call.name;
  op->rank = rank_;
  op->size = size_;
  op->reads = std::move(call.reads);
  op->writes = std::move(call.writes);
  op->point_to_point = call.point_to_point;
  op->run = std::move(call.run);
  op->after = std::move(call.after);

  GroupState& g = *state_;
  std::lock_guard<std::mutex> lock(g.enqueue_mutex);
  const c10::DeviceIndex device = call.device;
  RuntimeDeviceGuard on_device(device);
  auto it = g.streams.find(device);
  if (it == g.streams.end()) {
    it = g.streams.emplace(device, DeviceStreams{stream_from_pool(device, 0), stream_from_pool(device, 0), Event(),
                                                 Event()}).first;
  }
  DeviceStreams& s = it->second;
  const mydevStream_t comm = stream_handle(s.comm);
  const mydevStream_t completion = stream_handle(s.completion);

  // After the work queued so far on the caller's stream ...
  MYDEV_CHECK(s.ready.record(current_stream_handle(device)));
  MYDEV_CHECK(mydevStreamWaitEvent(comm, s.ready.get()));
  // ... and after the group's previous operation started, if on another device.
  if (g.last_device >= 0 && g.last_device != device) {
    MYDEV_CHECK(mydevStreamWaitEvent(comm, g.streams.at(g.last_device).issued.get()));
  }
  if (call.join) {
    MYDEV_CHECK(s.ready.record(completion));
    MYDEV_CHECK(mydevStreamWaitEvent(comm, s.ready.get()));
  }
  auto state = state_;
  const bool fence = call.fence;
  launch_on(s.comm, call.label, [state, op, fence] { issue(*state, op, fence); });
  MYDEV_CHECK(s.issued.record(comm));
  g.last_device = device;

  c10::Stream done_stream = s.comm;
  if (call.point_to_point) {
    MYDEV_CHECK(mydevStreamWaitEvent(completion, s.issued.get()));
    launch_on(s.completion, call.label, [state, op] { complete(*state, op); });
    done_stream = s.completion;
  }
  MYDEV_CHECK(op->done.record(stream_handle(done_stream)));
  return c10::make_intrusive<WorkMCCL>(op, done_stream, call.type, rank_, std::move(call.outputs), call.blocking);
}

// ---- collectives ---------------------------------------------------------

namespace {

// The start of every collective that works on `tensors` in place (broadcast,
// the reductions): they are read, written, and the Work's result.
ProcessGroupMCCL::Call in_place_call(const char* name, const char* label, c10d::OpType type,
                                     std::vector<at::Tensor>& tensors) {
  ProcessGroupMCCL::Call call{name, label, type};
  call.device = check_tensors(name, {&tensors});
  call.reads = tensors;
  call.writes = tensors;
  call.outputs = tensors;
  return call;
}

} // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  Call call = in_place_call("broadcast", "mccl broadcast", c10d::OpType::BROADCAST, tensors);
  check_rank(call.name, "root rank", opts.rootRank, size_);
  call.run = [tensors, opts](c10d::Backend& t) {
    auto views = host_views(tensors);
    return t.broadcast(views, opts);
  };
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  Call call = in_place_call("all_reduce", "mccl all_reduce", c10d::OpType::ALLREDUCE, tensors);
  check_reduce_op(call.name, opts.reduceOp, tensors);
  c10d::AllreduceOptions transport_opts = opts;
  transport_opts.reduceOp = transport_op(opts.reduceOp);
  call.run = [tensors, transport_opts](c10d::Backend& t) {
    auto views = host_views(tensors);
    return t.allreduce(views, transport_opts);
  };
  call.after = premul_scaling(opts.reduceOp, tensors);
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  Call call = in_place_call("all_reduce_coalesced", "mccl all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors);
  check_reduce_op(call.name, opts.reduceOp, tensors);
  c10d::AllreduceCoalescedOptions transport_opts = opts;
  transport_opts.reduceOp = transport_op(opts.reduceOp);
  call.run = [tensors, transport_opts](c10d::Backend& t) {
    auto views = host_views(tensors);
    return t.allreduce_coalesced(views, transport_opts);
  };
  call.after = premul_scaling(opts.reduceOp, tensors);
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  Call call = in_place_call("reduce", "mccl reduce", c10d::OpType::REDUCE, tensors);
  check_rank(call.name, "root rank", opts.rootRank, size_);
  check_reduce_op(call.name, opts.reduceOp, tensors);
  c10d::ReduceOptions transport_opts = opts;
  transport_opts.reduceOp = transport_op(opts.reduceOp);
  call.run = [tensors, transport_opts](c10d::Backend& t) {
    auto views = host_views(tensors);
    return t.reduce(views, transport_opts);
  };
  if (opts.rootRank == rank_) call.after = premul_scaling(opts.reduceOp, tensors);
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions& opts) {
  Call call{"all_gather", "mccl all_gather", c10d::OpType::ALLGATHER};
  const auto all_outputs = flat(outputs);
  call.device = check_tensors(call.name, {&inputs, &all_outputs});
  TORCH_CHECK(outputs.size() == inputs.size(), "mccl all_gather: expected ", inputs.size(),
              " output lists (one per input), got ", outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(outputs[i].size() == static_cast<size_t>(size_), "mccl all_gather: expected ", size_,
                " output tensors (one per rank), got ", outputs[i].size());
    for (const at::Tensor& out : outputs[i]) {
      check_same_dtype(call.name, out, inputs[i]);
      TORCH_CHECK(out.sizes() == inputs[i].sizes(), "mccl all_gather: output tensors must have the input's shape ",
                  inputs[i].sizes(), ", got ", out.sizes());
    }
  }
  call.reads = inputs;
  call.writes = all_outputs;
  call.outputs = all_outputs;
  call.run = [outputs, inputs, opts](c10d::Backend& t) {
    auto out_views = host_views(outputs);
    auto in_views = host_views(inputs);
    return t.allgather(out_views, in_views, opts);
  };
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions& opts) {
  Call call{"all_gather_into_tensor", "mccl all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE};
  std::vector<at::Tensor> in{input}, out{output};
  call.device = check_tensors(call.name, {&in, &out});
  check_same_dtype(call.name, output, input);
  TORCH_CHECK(output.numel() == input.numel() * size_, "mccl all_gather_into_tensor: the output must have ", size_,
              " (the group size) times the input's ", input.numel(), " elements, got ", output.numel());
  call.reads = in;
  call.writes = out;
  call.outputs = out;
  call.run = [output, input, opts](c10d::Backend& t) {
    at::Tensor out_view = host_view(output), in_view = host_view(input);
    return t._allgather_base(out_view, in_view, opts);
  };
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  Call call{"all_gather_into_tensor_coalesced", "mccl all_gather_into_tensor_coalesced",
            c10d::OpType::COALESCED};
  call.device = check_tensors(call.name, {&inputs, &outputs});
  TORCH_CHECK(outputs.size() == inputs.size(), "mccl all_gather_into_tensor_coalesced: expected as many outputs as inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_same_dtype(call.name, outputs[i], inputs[i]);
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * size_, "mccl ", call.name, ": output ", i, " must have ",
                size_, " times the input's ", inputs[i].numel(), " elements, got ", outputs[i].numel());
  }
  call.reads = inputs;
  call.writes = outputs;
  call.outputs = outputs;
  call.run = [outputs, inputs, opts](c10d::Backend& t) {
    auto out_views = host_views(outputs);
    auto in_views = host_views(inputs);
    return t.allgather_into_tensor_coalesced(out_views, in_views, opts);
  };
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  Call call{"gather", "mccl gather", c10d::OpType::GATHER};
  const auto all_outputs = flat(outputs);
  call.device = check_tensors(call.name, {&inputs, &all_outputs});
  check_rank(call.name, "root rank", opts.rootRank, size_);
  call.reads = inputs;
  call.writes = all_outputs;
  call.outputs = all_outputs;
  call.run = [outputs, inputs, opts](c10d::Backend& t) {
    auto out_views = host_views(outputs);
    auto in_views = host_views(inputs);
    return t.gather(out_views, in_views, opts);
  };
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  Call call{"scatter", "mccl scatter", c10d::OpType::SCATTER};
  const auto all_inputs = flat(inputs);
  call.device = check_tensors(call.name, {&outputs, &all_inputs});
  check_rank(call.name, "root rank", opts.rootRank, size_);
  call.reads = all_inputs;
  call.writes = outputs;
  call.outputs = outputs;
  call.run = [outputs, inputs, opts](c10d::Backend& t) {
    auto out_views = host_views(outputs);
    auto in_views = host_views(inputs);
    return t.scatter(out_views, in_views, opts);
  };
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  Call call{"reduce_scatter", "mccl reduce_scatter", c10d::OpType::REDUCE_SCATTER};
  const auto all_inputs = flat(inputs);
  call.device = check_tensors(call.name, {&outputs, &all_inputs});
  check_reduce_op(call.name, opts.reduceOp, outputs);
  TORCH_CHECK(inputs.size() == outputs.size(), "mccl reduce_scatter: expected ", outputs.size(),
              " input lists (one per output), got ", inputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    TORCH_CHECK(inputs[i].size() == static_cast<size_t>(size_), "mccl reduce_scatter: expected ", size_,
                " input tensors (one per rank), got ", inputs[i].size());
    for (const at::Tensor& in : inputs[i]) {
      check_same_dtype(call.name, in, outputs[i]);
      TORCH_CHECK(in.sizes() == outputs[i].sizes(), "mccl reduce_scatter: input tensors must have the output's shape ",
                  outputs[i].sizes(), ", got ", in.sizes());
    }
  }
  call.reads = all_inputs;
  call.writes = outputs;
  call.outputs = outputs;
  c10d::ReduceScatterOptions transport_opts = opts;
  transport_opts.reduceOp = transport_op(opts.reduceOp);
  call.run = [outputs, inputs, transport_opts](c10d::Backend& t) {
    auto out_views = host_views(outputs);
    auto in_views = host_views(inputs);
    return t.reduce_scatter(out_views, in_views, transport_opts);
  };
  call.after = premul_scaling(opts.reduceOp, outputs);
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  Call call{"reduce_scatter_tensor", "mccl reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE};
  std::vector<at::Tensor> in{input}, out{output};
  call.device = check_tensors(call.name, {&in, &out});
  check_same_dtype(call.name, output, input);
  check_reduce_op(call.name, opts.reduceOp, out);
  TORCH_CHECK(input.numel() == output.numel() * size_, "mccl reduce_scatter_tensor: the input must have ", size_,
              " (the group size) times the output's ", output.numel(), " elements, got ", input.numel());
  call.reads = in;
  call.writes = out;
  call.outputs = out;
  c10d::ReduceScatterOptions transport_opts = opts;
  transport_opts.reduceOp = transport_op(opts.reduceOp);
  call.run = [output, input, transport_opts](c10d::Backend& t) {
    at::Tensor out_view = host_view(output), in_view = host_view(input);
    return t._reduce_scatter_base(out_view, in_view, transport_opts);
  };
  call.after = premul_scaling(opts.reduceOp, out);
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  Call call{"reduce_scatter_tensor_coalesced", "mccl reduce_scatter_tensor_coalesced",
            c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED};
  call.device = check_tensors(call.name, {&inputs, &outputs});
  check_reduce_op(call.name, opts.reduceOp, outputs);
  TORCH_CHECK(outputs.size() == inputs.size(), "mccl reduce_scatter_tensor_coalesced: expected as many outputs as inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_same_dtype(call.name, outputs[i], inputs[i]);
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * size_, "mccl ", call.name, ": input ", i, " must have ",
                size_, " times the output's ", outputs[i].numel(), " elements, got ", inputs[i].numel());
  }
  call.reads = inputs;
  call.writes = outputs;
  call.outputs = outputs;
  c10d::ReduceScatterOptions transport_opts = opts;
  transport_opts.reduceOp = transport_op(opts.reduceOp);
  call.run = [outputs, inputs, transport_opts](c10d::Backend& t) {
    auto out_views = host_views(outputs);
    auto in_views = host_views(inputs);
    return t.reduce_scatter_tensor_coalesced(out_views, in_views, transport_opts);
  };
  call.after = premul_scaling(opts.reduceOp, outputs);
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& output_split_sizes,
                                                               std::vector<int64_t>& input_split_sizes,
                                                               const c10d::AllToAllOptions& opts) {
  Call call{"all_to_all_single", "mccl all_to_all_single", c10d::OpType::ALLTOALL_BASE};
  std::vector<at::Tensor> in{input}, out{output};
  call.device = check_tensors(call.name, {&in, &out});
  check_same_dtype(call.name, output, input);
  auto check_splits = [&](const std::vector<int64_t>& splits, const at::Tensor& t, const char* which) {
    if (splits.empty()) {
      TORCH_CHECK(t.dim() > 0 && t.size(0) % size_ == 0, "mccl all_to_all_single: the ", which,
                  "'s first dimension must divide evenly among the ", size_, " ranks");
      return;
    }
    TORCH_CHECK(splits.size() == static_cast<size_t>(size_), "mccl all_to_all_single: expected ", size_, " ",
                which, " split sizes, got ", splits.size());
    int64_t total = 0;
    for (int64_t n : splits) total += n;
    TORCH_CHECK(t.dim() > 0 && total == t.size(0), "mccl all_to_all_single: the ", which,
                " split sizes add up to ", total, ", not to the first dimension ", t.dim() > 0 ? t.size(0) : 0);
  };
  check_splits(output_split_sizes, output, "output");
  check_splits(input_split_sizes, input, "input");
  call.reads = in;
  call.writes = out;
  call.outputs = out;
  call.run = [output, input, output_split_sizes, input_split_sizes, opts](c10d::Backend& t) {
    at::Tensor out_view = host_view(output), in_view = host_view(input);
    auto out_splits = output_split_sizes;
    auto in_splits = input_split_sizes;
    return t.alltoall_base(out_view, in_view, out_splits, in_splits, opts);
  };
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  Call call{"all_to_all", "mccl all_to_all", c10d::OpType::ALLTOALL};
  call.device = check_tensors(call.name, {&inputs, &outputs});
  TORCH_CHECK(inputs.size() == static_cast<size_t>(size_) && outputs.size() == static_cast<size_t>(size_),
              "mccl all_to_all: expected ", size_, " input and output tensors (one per rank), got ", inputs.size(),
              " and ", outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) check_same_dtype(call.name, outputs[i], inputs[i]);
  call.reads = inputs;
  call.writes = outputs;
  call.outputs = outputs;
  call.run = [outputs, inputs, opts](c10d::Backend& t) {
    auto out_views = host_views(outputs);
    auto in_views = host_views(inputs);
    return t.alltoall(out_views, in_views, opts);
  };
  return enqueue(std::move(call));
}

// ---- point-to-point ------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  Call call{"send", "mccl send", c10d::OpType::SEND};
  call.device = check_tensors(call.name, {&tensors});
  check_rank(call.name, "destination rank", dst, size_);
  call.point_to_point = true;
  call.reads = tensors;
  call.outputs = tensors;
  call.run = [tensors, dst, tag](c10d::Backend& t) {
    auto views = host_views(tensors);
    return t.send(views, dst, tag);
  };
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  Call call{"recv", "mccl recv", c10d::OpType::RECV};
  call.device = check_tensors(call.name, {&tensors});
  check_rank(call.name, "source rank", src, size_);
  call.point_to_point = true;
  call.writes = tensors;
  call.outputs = tensors;
  call.run = [tensors, src, tag](c10d::Backend& t) {
    auto views = host_views(tensors);
    return t.recv(views, src, tag);
  };
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  Call call{"recv", "mccl recv", c10d::OpType::RECVANYSOURCE};
  call.device = check_tensors(call.name, {&tensors});
  call.point_to_point = true;
  call.writes = tensors;
  call.outputs = tensors;
  call.run = [tensors, tag](c10d::Backend& t) {
    auto views = host_views(tensors);
    return t.recvAnysource(views, tag);
  };
  return enqueue(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::barrier(const c10d::BarrierOptions& opts) {
  Call call{"barrier", "mccl barrier", c10d::OpType::BARRIER};
  call.device = opts.device.has_value() && opts.device->type() == kMyDev && opts.device->has_index()
                    ? opts.device->index()
                    : current_device();
  call.fence = true;
  call.blocking = true;  // as NCCL's: the host waits for the barrier in wait()
  c10d::BarrierOptions transport_opts;
  transport_opts.timeout = opts.timeout;
  call.run = [transport_opts](c10d::Backend& t) { return t.barrier(transport_opts); };
  return enqueue(std::move(call));
}

} // namespace my_device::distributed
