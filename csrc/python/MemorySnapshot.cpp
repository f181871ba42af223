// torch.mydev.memory._record_memory_history / _snapshot: the allocator's
// history (core/MemoryHistory.h) and state (memory_snapshot) as the Python
// dictionaries torch.cuda.memory._snapshot() returns, so PyTorch's own
// torch.cuda._memory_viz and the memory_viz web page read them.
//
// Stacks are PyTorch's CapturedTraceback, as CUDA's allocator records them:
// cheap to gather (code object and instruction per frame), symbolized into
// {"filename", "line", "name"} frames only when a snapshot is taken.
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "../core/Device.h"
#include "../core/MemoryHistory.h"
#include "../core/MemorySnapshot.h"

// Declared in torch/csrc/profiler/python/combined_traceback.h, which the wheel
// ships but cannot be included from an extension: it includes
// <nlohmann/json.hpp>, which the wheel does not ship. Both are exported by
// libtorch_python.
namespace torch {
TORCH_API std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
TORCH_PYTHON_API void installCapturedTracebackPython();
} // namespace torch

namespace my_device {
namespace {

StackContext gather_python() {
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false);
}
StackContext gather_python_and_cpp() {
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/true);
}

// torch.cuda.memory._record_memory_history's arguments, with its checks.
void record_memory_history(std::optional<std::string> enabled, std::optional<std::string> context,
                           const std::string& stacks, size_t max_entries, bool clear_history) {
  TORCH_CHECK(!enabled || *enabled == "state" || *enabled == "all",
              "expected enabled to be 'state', 'all', or None, got ", *enabled);
  TORCH_CHECK(!context || *context == "state" || *context == "alloc" || *context == "all",
              "expected context to be 'state', 'alloc', 'all', or None, got ", *context);
  TORCH_CHECK(stacks == "python" || stacks == "all", "expected stacks to be 'python', or 'all', got ", stacks);
  MemoryHistoryConfig config;
  config.enabled = enabled.has_value();
  config.trace = enabled && *enabled == "all";
  config.alloc_context = context.has_value();
  config.free_context = context && *context == "all";
  config.max_entries = max_entries;
  if (config.enabled && context) {
    torch::installCapturedTracebackPython();  // once per interpreter; later calls do nothing
    config.recorder = stacks == "all" ? &gather_python_and_cpp : &gather_python;
  }
  set_memory_history(config, clear_history);
}

const char* action_name(TraceEntry::Action action) {
  switch (action) {
    case TraceEntry::Action::Alloc: return "alloc";
    case TraceEntry::Action::FreeRequested: return "free_requested";
    case TraceEntry::Action::FreeCompleted: return "free_completed";
    case TraceEntry::Action::SegmentAlloc: return "segment_alloc";
    case TraceEntry::Action::SegmentFree: return "segment_free";
    case TraceEntry::Action::Oom: return "oom";
    case TraceEntry::Action::Snapshot: return "snapshot";
  }
  return "unknown";
}

const char* state_name(BlockSnapshot::State state) {
  switch (state) {
    case BlockSnapshot::State::ActiveAllocated: return "active_allocated";
    case BlockSnapshot::State::ActiveAwaitingFree: return "active_awaiting_free";
    case BlockSnapshot::State::Inactive: return "inactive";
  }
  return "unknown";
}

// Symbolizes every recorded stack at once (frames shared between stacks are
// converted once), then hands out each one's frame list.
class Frames {
 public:
  void add(const StackContext& context) {
    auto* tb = dynamic_cast<torch::CapturedTraceback*>(context.get());
    if (tb != nullptr && index_.emplace(tb, pending_.size()).second) pending_.push_back(tb);
  }
  void symbolize() {
    symbolized_ = torch::py_symbolize(pending_);
  }
  py::object get(const StackContext& context) const {
    auto* tb = dynamic_cast<torch::CapturedTraceback*>(context.get());
    auto it = index_.find(tb);
    return it == index_.end() ? py::list() : symbolized_[it->second];
  }

 private:
  std::unordered_map<torch::CapturedTraceback*, size_t> index_;
  std::vector<torch::CapturedTraceback*> pending_;
  std::vector<py::object> symbolized_;
};

py::dict snapshot() {
  const std::vector<SegmentSnapshot> segments = memory_snapshot();
  std::vector<std::vector<TraceEntry>> traces;
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) traces.push_back(device_trace(d));

  Frames frames;
  for (const auto& seg : segments) {
    for (const auto& b : seg.blocks) frames.add(b.context);
  }
  for (const auto& trace : traces) {
    for (const auto& e : trace) frames.add(e.context);
  }
  frames.symbolize();

  py::list py_segments;
  for (const auto& seg : segments) {
    py::dict s;
    s["device"] = static_cast<int>(seg.device);
    s["address"] = seg.address;
    s["total_size"] = seg.total_size;
    s["allocated_size"] = seg.allocated_size;
    s["active_size"] = seg.active_size;
    s["requested_size"] = [&] {
      size_t n = 0;
      for (const auto& b : seg.blocks) n += b.requested_size;
      return n;
    }();
    s["stream"] = seg.stream;
    s["segment_type"] = seg.small ? "small" : "large";
    s["segment_pool_id"] = py::make_tuple(0, 0);  // no private pools (graph capture) on mydev
    s["is_expandable"] = false;
    s["frames"] = seg.blocks.empty() ? py::list() : frames.get(seg.blocks.front().context);
    py::list blocks;
    for (const auto& b : seg.blocks) {
      py::dict d;
      d["address"] = b.address;
      d["size"] = b.size;
      d["requested_size"] = b.requested_size;
      d["state"] = state_name(b.state);
      d["frames"] = frames.get(b.context);
      blocks.append(d);
    }
    s["blocks"] = blocks;
    py_segments.append(s);
  }
  py::list device_traces;
  for (const auto& trace : traces) {
    py::list entries;
    for (const auto& e : trace) {
      py::dict d;
      d["action"] = action_name(e.action);
      d["addr"] = e.addr;
      d["size"] = e.size;
      d["stream"] = e.stream;
      d["time_us"] = e.time_us;
      d["frames"] = frames.get(e.context);
      if (e.action == TraceEntry::Action::Oom) d["device_free"] = e.device_free;
      entries.append(d);
    }
    device_traces.append(entries);
  }
  py::dict settings;
  settings["PYTORCH_MYDEV_ALLOC_CONF"] = "";
  py::dict out;
  out["segments"] = py_segments;
  out["device_traces"] = device_traces;
  out["allocator_settings"] = settings;
  return out;
}

} // namespace

void init_memory_snapshot_bindings(py::module& m) {
  m.def("_record_memory_history", &record_memory_history, py::arg("enabled"), py::arg("context"),
        py::arg("stacks"), py::arg("max_entries"), py::arg("clear_history"));
  m.def("_memory_snapshot", &snapshot);
  m.def("_memory_history_enabled", [] { return recording_memory_history(); });
}

} // namespace my_device
