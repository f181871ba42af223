// my_device._C: the Python entry points into the integration. Each binding is
// a thin call into csrc/core or csrc/native; policy lives in my_device/.
#include <c10/util/typeid.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <dlfcn.h>

#include <mydev_emulator.h>  // the strict-mode query, test hooks, the wait behind settings

#include <atomic>
#include <chrono>
#include <thread>

#include "core/Allocator.h"
#include "core/Device.h"
#include "core/Exception.h"
#include "core/Generator.h"
#include "core/Launch.h"
#include "core/Stream.h"
#include "native/Fallback.h"
#include "native/hostkernel/Breakdown.h"
#include "native/hostkernel/Registration.h"

namespace my_device::compiler {
void init_bindings(pybind11::module& parent);  // compiler/Bindings.cpp
}
namespace my_device::jit {
void init_bindings(pybind11::module& parent);  // jit/Bindings.cpp
}
namespace my_device::lazy {
void init_bindings(pybind11::module& parent);  // lazy/Bindings.cpp
}
namespace my_device::inductor {
void init_bindings(pybind11::module& parent);  // inductor/KernelLaunch.cpp
}
namespace my_device::distributed {
void init_bindings(pybind11::module& parent);  // distributed/Bindings.cpp
}

namespace my_device {
void init_memory_snapshot_bindings(pybind11::module& m);  // python/MemorySnapshot.cpp
void init_profiler_bindings(pybind11::module& m);         // profiler/Bindings.cpp
void init_dlpack_bindings(pybind11::module& m);           // python/DLPack.cpp
void init_graph_bindings(pybind11::module& m);            // python/Graph.cpp

namespace {

void synchronize(c10::DeviceIndex device) {
  RuntimeDeviceGuard on_device(device < 0 ? current_device() : device);
  mydevError_t err;
  {
    py::gil_scoped_release no_gil;  // as torch.cuda.synchronize: other Python threads keep running
    err = mydevDeviceSynchronize();
  }
  finish_host_wait(err);
}

// Waits for the work queued on every device, leaving kernel failures for the
// next synchronisation: for a change of a process-wide setting that kernels
// read when they run (my_device/_settings.py).
void wait_for_queued_work() {
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
    RuntimeDeviceGuard on_device(d);
    py::gil_scoped_release no_gil;
    MYDEV_CHECK(mydevDeviceWaitIdle());
  }
}

// The flat "name.pool.metric" dictionary torch.cuda.memory_stats returns.
py::dict memory_info(c10::DeviceIndex device) {
  const DeviceStats stats = memory_stats(device);
  py::dict d;
  const std::pair<const char*, const c10::CachingAllocator::StatArray*> arrays[] = {
      {"allocation", &stats.allocation},         {"segment", &stats.segment},
      {"active", &stats.active},                 {"inactive_split", &stats.inactive_split},
      {"allocated_bytes", &stats.allocated_bytes}, {"reserved_bytes", &stats.reserved_bytes},
      {"active_bytes", &stats.active_bytes},     {"inactive_split_bytes", &stats.inactive_split_bytes},
      {"requested_bytes", &stats.requested_bytes}};
  const char* pools[] = {"all", "small_pool", "large_pool"};
  for (const auto& [name, array] : arrays) {
    for (size_t p = 0; p < 3; ++p) {
      const auto& stat = (*array)[p];
      const std::string prefix = std::string(name) + "." + pools[p] + ".";
      d[py::str(prefix + "current")] = stat.current;
      d[py::str(prefix + "peak")] = stat.peak;
      d[py::str(prefix + "allocated")] = stat.allocated;
      d[py::str(prefix + "freed")] = stat.freed;
    }
  }
  d["num_alloc_retries"] = stats.num_alloc_retries;
  d["num_ooms"] = stats.num_ooms;
  d["num_device_alloc"] = stats.num_device_alloc;
  d["num_device_free"] = stats.num_device_free;
  return d;
}

py::tuple stream_tuple(const c10::Stream& s) {
  return py::make_tuple(s.id(), static_cast<int>(s.device_index()), static_cast<int>(s.device_type()));
}

std::pair<size_t, size_t> mem_get_info(c10::DeviceIndex device) {
  check_device_index(device);
  RuntimeDeviceGuard on_device(device);
  size_t free_bytes = 0, total = 0;
  MYDEV_CHECK(mydevMemGetInfo(&free_bytes, &total));
  return {free_bytes, total};
}

py::dict device_properties(c10::DeviceIndex device) {
  check_device_index(device);
  mydevDeviceProp prop{};
  MYDEV_CHECK(mydevGetDeviceProperties(&prop, device));
  py::dict d;
  d["name"] = std::string(prop.name);
  d["total_memory"] = prop.totalGlobalMem;
  d["multi_processor_count"] = prop.multiProcessorCount;
  d["major"] = prop.major;
  d["minor"] = prop.minor;
  return d;
}

// Mean nanoseconds of one cached allocate + free of `nbytes` through the device
// allocator, timed in C++ so that Python's call overhead does not drown it.
double bench_cached_allocation(int64_t iterations, int64_t nbytes) {
  c10::Allocator* allocator = device_allocator();
  { auto warm = allocator->allocate(nbytes); }
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    auto data = allocator->allocate(nbytes);
  }
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() / static_cast<double>(iterations);
}

// Mean nanoseconds of one launch_async of an empty kernel onto the current
// stream, the queue drained at the end: the launch path's own cost, with no
// op around it (bench/bench_runtime.py).
double bench_empty_launches(int64_t iterations) {
  const c10::DeviceIndex device = current_device();
  synchronize(device);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) launch_async(device, "empty", [] {});
  synchronize(device);
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() / static_cast<double>(iterations);
}

// Mean nanoseconds of what a short kernel on an idle stream pays to run at the
// call, with an empty kernel: the idle hint its caller asks (stream_idle) and
// launch_if_idle (bench/bench_runtime.py).
double bench_idle_launches(int64_t iterations) {
  const c10::DeviceIndex device = current_device();
  synchronize(device);
  int64_t ran = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    if (stream_idle(device) && launch_if_idle(device, "empty", [] {})) ++ran;
  }
  const auto end = std::chrono::steady_clock::now();
  TORCH_CHECK(ran == iterations, "the stream was not idle: ", iterations - ran, " launches did not run");
  return std::chrono::duration<double, std::nano>(end - start).count() / static_cast<double>(iterations);
}

// _test_launch_hold's kernel: queued, running, or told to finish.
enum HoldState { kHoldQueued, kHoldRunning, kHoldReleased };
std::atomic<int> g_hold{kHoldReleased};

} // namespace
} // namespace my_device

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace my_device;
  m.def("_device_count", [] { return static_cast<int>(device_count()); });
  m.def("_init", [] {
    int device = 0;
    MYDEV_CHECK(mydevGetDevice(&device));
  });
  m.def("_is_initialized", [] { return mydevIsInitialized() != 0; });
  m.def("_is_in_bad_fork", &in_bad_fork);
  m.def("_current_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int device) {
    check_device_index(static_cast<c10::DeviceIndex>(device));
    set_device(static_cast<c10::DeviceIndex>(device));
  });
  m.def("_exchange_device", [](int device) {
    const int previous = current_device();
    if (device >= 0 && device != previous) {
      check_device_index(static_cast<c10::DeviceIndex>(device));
      set_device(static_cast<c10::DeviceIndex>(device));
    }
    return previous;
  });
  // Wrapped so that the queued kernels' warnings it raises become Python warnings.
  m.def("_synchronize", torch::wrap_pybind_function([](int device) { synchronize(static_cast<c10::DeviceIndex>(device)); }));
  m.def("_wait_for_queued_work", &wait_for_queued_work);
  m.def("_set_sync_debug_mode", &set_sync_debug_mode);
  m.def("_get_sync_debug_mode", &sync_debug_mode);
  m.def("_get_device_properties", [](int device) { return device_properties(static_cast<c10::DeviceIndex>(device)); });
  m.def("_mem_get_info", [](int device) { return mem_get_info(static_cast<c10::DeviceIndex>(device)); });
  m.def("_memory_stats", [](int device) { return memory_info(static_cast<c10::DeviceIndex>(device)); });
  m.def("_empty_cache", [] {
    py::gil_scoped_release no_gil;  // it waits for streams with cached memory, as a synchronisation does
    empty_cache();
  });
  // torch.mydev.caching_allocator_alloc/_delete: a block of the caching
  // allocator handed out as a bare address, as torch.cuda's are.
  m.def("_raw_alloc", [](size_t nbytes, int device) {
    c10::DataPtr data = allocate_on(static_cast<c10::DeviceIndex>(device), nbytes);
    return reinterpret_cast<uintptr_t>(data.release_context());  // owned by the caller now
  });
  m.def("_raw_delete", [](uintptr_t address) {
    void* ptr = reinterpret_cast<void*>(address);
    TORCH_CHECK(is_device_pointer(ptr), "invalid device pointer: ", ptr);
    free_device_pointer(ptr);
  });
  m.def("_reset_peak_memory_stats", [](int device) { reset_peak_memory_stats(static_cast<c10::DeviceIndex>(device)); });
  m.def("_reset_accumulated_memory_stats",
        [](int device) { reset_accumulated_memory_stats(static_cast<c10::DeviceIndex>(device)); });
  m.def("_set_memory_fraction", [](double fraction, int device) {
    set_memory_fraction(fraction, static_cast<c10::DeviceIndex>(device));
  });
  m.def("_current_stream", [](int device) { return stream_tuple(current_stream(static_cast<c10::DeviceIndex>(device))); });
  m.def("_default_stream", [](int device) { return stream_tuple(default_stream(static_cast<c10::DeviceIndex>(device))); });
  m.def("_set_stream", [](int64_t id, int device) {
    set_current_stream(c10::Stream(c10::Stream::UNSAFE, c10::Device(kMyDev, static_cast<c10::DeviceIndex>(device)), id));
  });
  m.def("_stream_priority_range", &stream_priority_range);
  m.def("_event_elapsed_time", [](int64_t start, int64_t end) {
    TORCH_CHECK(start != 0 && end != 0, "Both events must be recorded before calculating elapsed time.");
    float ms = 0;
    const mydevError_t err = mydevEventElapsedTime(&ms, reinterpret_cast<mydevEvent_t>(start),
                                                   reinterpret_cast<mydevEvent_t>(end));
    TORCH_CHECK_VALUE(err != mydevErrorTimingDisabled,
                      "Both events must be created with argument 'enable_timing=True'.");
    MYDEV_CHECK(err);
    return ms;
  });
  m.def("_stream_priority", [](int64_t id, int device) {
    return stream_priority(c10::Stream(c10::Stream::UNSAFE, c10::Device(kMyDev, static_cast<c10::DeviceIndex>(device)), id));
  });
  m.def("_strict_mode", [] { return mydevStrictMode() != 0; });
  m.def("_default_generator", [](int device) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(device))));
  });
  m.def("_bench_cached_allocation", &bench_cached_allocation);
  m.def("_bench_empty_launches", &bench_empty_launches);
  m.def("_bench_idle_launches", &bench_idle_launches);
  // Test hooks: a stream whose worker waits before each task, and a kernel that fails when it runs.
  m.def("_test_set_stream_delay", [](int64_t id, int device, unsigned microseconds) {
    const c10::Stream stream(c10::Stream::UNSAFE, c10::Device(kMyDev, static_cast<c10::DeviceIndex>(device)), id);
    RuntimeDeviceGuard on_device(static_cast<c10::DeviceIndex>(device));
    MYDEV_CHECK(mydevTestSetStreamDelay(stream_handle(stream), microseconds));
  });
  m.def("_test_inject_kernel_failure", &inject_kernel_failure);
  // OpenMP's thread count for the kernels of `device`'s current stream, as its
  // worker sees it (omp_get_max_threads is per thread; found in the process,
  // as libtorch_cpu loads it): -1 without OpenMP.
  m.def("_test_worker_omp_threads", [](int device) {
    using Fn = int (*)();
    static const auto omp_max = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    if (omp_max == nullptr) return -1;
    auto seen = std::make_shared<std::atomic<int>>(0);
    const auto d = static_cast<c10::DeviceIndex>(device);
    launch_async(d, "test worker threads", [seen] { seen->store(omp_max()); });
    synchronize(d);
    return seen->load();
  });
  // The intra-op threads of kernels this thread launches (core/ComputeUnits.h).
  m.def("_kernel_intra_op_threads", &kernel_intra_op_threads);
  m.def("_test_blocks_run_by_other_units", &blocks_run_by_other_units);
  // The team size Inductor writes mydev's kernels for, 0 for none (core/ComputeUnits.h).
  m.def("_kernel_team_threads", &kernel_team_threads);
  m.def("_test_team_thread_counts", &team_thread_counts);
  // bench/bench_launch.py --breakdown: turns the host kernel's stage timing on
  // or off and returns the totals since the last call (ns per stage, calls).
  m.def("_host_kernel_breakdown", [](bool enable) {
    auto totals = breakdown::take();
    breakdown::g_enabled.store(enable);
    return totals;
  });
  // A kernel that keeps running, on the device's current stream, until released:
  // returns once it has started, so tests can act while a kernel provably runs.
  m.def("_test_launch_hold", [](int device) {
    py::gil_scoped_release no_gil;
    g_hold.store(kHoldQueued);
    launch_async(static_cast<c10::DeviceIndex>(device), "test hold", [] {
      g_hold.store(kHoldRunning);
      while (g_hold.load() != kHoldReleased) std::this_thread::sleep_for(std::chrono::microseconds(100));
    });
    while (g_hold.load() == kHoldQueued) std::this_thread::sleep_for(std::chrono::microseconds(100));
  });
  m.def("_test_release_hold", [] { g_hold.store(kHoldReleased); });
  m.def("impl_type_name", [](const at::Tensor& t) {
    return c10::demangle(typeid(*t.unsafeGetTensorImpl()).name());
  }, "The C++ class of a tensor's TensorImpl, e.g. 'my_device::MyDevTensorImpl'.");
  m.def("fallback_counts", &fallback_counts,
        "How many times each op (by 'aten::name.overload') ran through the copying CPU fallback.");
  m.def("reset_fallback_counts", &reset_fallback_counts);
  init_memory_snapshot_bindings(m);
  init_profiler_bindings(m);
  init_dlpack_bindings(m);
  init_graph_bindings(m);
  compiler::init_bindings(m);
  jit::init_bindings(m);
  lazy::init_bindings(m);
  inductor::init_bindings(m);
  distributed::init_bindings(m);

  // Operator coverage: the generic host-kernel registration, which must follow
  // every static registration of this library, and the fallback tracker.
  register_all_host_kernels();
  check_fallback_setting();
  m.def("_host_kernel_coverage", [] {
    const HostKernelCoverage& c = host_kernel_coverage();
    return py::make_tuple(c.host_kernel, c.own_kernel, c.excluded, c.sparse_host_kernel, c.quantized_host_kernel);
  }, "(host-kernel overloads, overloads with their own mydev kernel, [(excluded overload, reason)], "
     "sparse-layout host-kernel overloads, quantized host-kernel overloads).");
  m.def("_start_fallback_tracking", &start_fallback_tracking);
  m.def("_stop_fallback_tracking", &stop_fallback_tracking);
  m.def("_fallback_records", [] {
    py::list out;
    for (const auto& [sig, calls] : fallback_records()) {
      py::list inputs;
      for (const auto& in : sig.inputs) inputs.append(py::make_tuple(py::reinterpret_borrow<py::object>(
            reinterpret_cast<PyObject*>(torch::getTHPDtype(in.dtype))), py::tuple(py::cast(in.shape))));
      out.append(py::make_tuple(sig.op, py::tuple(inputs), calls));
    }
    return out;
  }, "[(op, ((dtype, shape), ...), calls)] recorded since fallback tracking began.");
}
