// The device's kernels in torch.profiler, through Kineto.
//
// torch 2.13 lets a PrivateUse1 backend hand Kineto an IActivityProfiler of its
// own (REGISTER_PRIVATEUSE1_PROFILER, torch/csrc/profiler/standalone/
// privateuse1_profiler.h): when torch.profiler.profile runs with
// ProfilerActivity.PrivateUse1 (use_device="mydev"), the profiler state is
// KINETO_PRIVATEUSE1, the registered factory is forwarded to Kineto, and Kineto
// configures, starts and stops a session of it together with its own CPU
// tracing. This works on the CPU-only wheel: its libtorch links a CPU-only
// Kineto (no CUPTI), and child profilers are independent of CUPTI.
//
// The session collects KernelRecords (KernelTrace.h) and gives Kineto one
// CONCURRENT_KERNEL activity per kernel (GPU_MEMCPY/GPU_MEMSET per copy and
// memset run on a stream): name = the op, device = the mydev
// index, resource = the stream, start/end = when it ran, linked to the CPU op
// that launched it by the op's correlation id (which the session receives from
// Kineto on each op entry, pushCorrelationId). PyTorch turns these into device
// events (DeviceType.PrivateUse1, because the backend is registered): rows of
// export_chrome_trace, and device time per op in key_averages().
// GenericTraceActivity::addMetadata formats with fmt, whose compiled part
// libtorch does not export: use fmt's header-only build in this file.
#define FMT_HEADER_ONLY
#define USE_KINETO  // privateuse1_profiler.h declares the registry only for Kineto builds of PyTorch, as the wheel is
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <kineto/libkineto.h>
#include <kineto/output_base.h>

#include <string>

#include "../core/Device.h"
#include "../core/KernelDebugInfo.h"
#include "KernelTrace.h"

namespace my_device {
namespace {

using libkineto::ActivityType;

ActivityType activity_type(const KernelRecord& r) {
  switch (r.kind) {
    case KernelRecord::Kind::Kernel: return ActivityType::CONCURRENT_KERNEL;
    case KernelRecord::Kind::Memcpy: return ActivityType::GPU_MEMCPY;
    case KernelRecord::Kind::Memset: return ActivityType::GPU_MEMSET;
  }
  return ActivityType::CONCURRENT_KERNEL;
}

// Kernels are named by their launch label (the op); kernels launched without
// one (ops run at the call) by the op that launched them.
std::string activity_name(const KernelRecord& r, const libkineto::ITraceActivity* op) {
  switch (r.kind) {
    case KernelRecord::Kind::Memcpy: return "Memcpy " + r.name + " (mydev)";  // the label is the direction
    case KernelRecord::Kind::Memset: return "Memset (mydev)";
    case KernelRecord::Kind::Kernel: break;
  }
  if (!r.name.empty()) return r.name;
  return op != nullptr ? op->name() : "mydev kernel";
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    // On the profiling thread, whose profiler state workers report their kernels' allocations under.
    capture_profiler_state_for_kernels();
    start_kernel_tracing();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    release_profiler_state_for_kernels();
    records_ = stop_kernel_tracing();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override {
    return {};
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t start_time, int64_t end_time) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_time, end_time, "mydev");
    buffer_->gpuOpCount = static_cast<int>(records_.size());
    for (const KernelRecord& r : records_) {
      uint64_t correlation = r.correlation;
      const libkineto::ITraceActivity* op =
          linked && correlation != 0 ? linked(static_cast<int32_t>(correlation)) : nullptr;
      attribute_copy_to_copy_(linked, op, correlation);
      buffer_->emplace_activity(buffer_->span, activity_type(r), activity_name(r, op));
      auto& act = *buffer_->activities.back();
      act.startTime = r.start_ns;
      act.endTime = r.end_ns;
      act.id = static_cast<int32_t>(correlation);
      act.device = r.device;
      act.resource = static_cast<int32_t>(r.stream);
      act.threadId = static_cast<int32_t>(r.stream);
      act.linked = op;
      act.addMetadata("device", static_cast<int>(r.device));
      act.addMetadata("stream", r.stream);
      act.addMetadata("correlation", correlation);
      if (r.kind == KernelRecord::Kind::Kernel) {
        act.addMetadataQuoted("launch", r.at_the_call ? "at the call" : "queued");
      } else {
        act.addMetadata("bytes", r.bytes);
      }
      devices_.insert(r.device);
      streams_.insert({r.device, r.stream});
      logger.handleActivity(act);
    }
    records_.clear();
    status_ = libkineto::TraceStatus::READY;
  }

  // A copy on CUDA is the work of aten::copy_, which launches it. PyTorch's
  // copy_ hands every copy touching a PrivateUse1 device to aten::_copy_from
  // (the backend's kernel), so here the copy's memcpy or kernel was launched
  // inside _copy_from: it is shown as the work of the copy_ that called it, as
  // on CUDA. A _copy_from called by anything else keeps its work.
  static void attribute_copy_to_copy_(const libkineto::getLinkedActivityCallback& linked,
                                      const libkineto::ITraceActivity*& op, uint64_t& correlation) {
    if (op == nullptr || op->name() != "aten::_copy_from") return;
    const uint64_t caller = caller_correlation(correlation);
    const libkineto::ITraceActivity* copy = caller != 0 ? linked(static_cast<int32_t>(caller)) : nullptr;
    if (copy == nullptr || copy->name() != "aten::copy_") return;
    op = copy;
    correlation = caller;
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    // Kineto takes one device row per session; with kernels on several devices
    // each keeps its own pid (the device index) and row.
    const int device = devices_.empty() ? 0 : *devices_.begin();
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        device, device + 1000, "mydev " + std::to_string(device), "mydev " + std::to_string(device)});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [device, stream] : streams_) {
      out.push_back({stream, stream, device, "stream " + std::to_string(stream)});
    }
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);  // Kineto keeps it: the logger's activities point into it
  }

  void pushCorrelationId(uint64_t id) override {
    push_correlation(id);
  }
  void popCorrelationId() override {
    pop_correlation();
  }

 private:
  std::vector<KernelRecord> records_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::set<int> devices_;
  std::set<std::pair<int, int64_t>> streams_;
};

class MyDevActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    return name_;
  }

  const std::set<ActivityType>& availableActivities() const override {
    return activities_;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& activity_types,
                                                                 const libkineto::Config& /*config*/) override {
    // Only for profiles of the device: PRIVATEUSE1_RUNTIME alone is one of the
    // CPU activities, which a CPU-only profile asks for too.
    if (activity_types.count(ActivityType::CONCURRENT_KERNEL) == 0 &&
        activity_types.count(ActivityType::GPU_MEMCPY) == 0) {
      return nullptr;
    }
    return std::make_unique<Session>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<ActivityType>& activity_types,
                                                                 const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_{"mydev"};
  std::set<ActivityType> activities_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                     ActivityType::GPU_MEMSET};
};

} // namespace

REGISTER_PRIVATEUSE1_PROFILER(MyDevActivityProfiler);

bool kineto_profiler_registered() {
  return torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().hasFactory();
}

} // namespace my_device
