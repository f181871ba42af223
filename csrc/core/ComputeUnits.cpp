#include "ComputeUnits.h"

#include <mydev_emulator.h>  // the emulator's compute units: a port rewrites this file

#include <ATen/Config.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <sched.h>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "Launch.h"

#if AT_PARALLEL_OPENMP
extern "C" int omp_get_max_threads();
extern "C" void omp_set_num_threads(int);
#endif
#if AT_MKL_ENABLED()
// mkl_service.h maps mkl_set_num_threads_local to this C entry point (the lower-case symbol is the Fortran one).
extern "C" int MKL_Set_Num_Threads_Local(int);
#endif

namespace my_device {
namespace {

struct ComputeUnitsCall {
  const std::function<void()>* work;
  std::thread::id caller;
  KernelContext context;
  int threads;  // each unit's share of the intra-op threads
  std::mutex mutex;
  std::exception_ptr failure;
};

// The runtime calls this once per unit; nothing may unwind through it.
void run_on_unit(void* data) {
  auto* call = static_cast<ComputeUnitsCall*>(data);
  try {
    if (std::this_thread::get_id() == call->caller) {
      IntraOpThreads share(call->threads);
      (*call->work)();
    } else {
      // A helper is a thread of its own: it takes on what a stream's worker has around a queued kernel.
      KernelThreadState state;
      KernelScope in_kernel(call->context);
      c10::WarningUtils::WarningHandlerGuard keep_warnings(kernel_warning_collector());
      IntraOpThreads share(call->threads);
      (*call->work)();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(call->mutex);
    if (!call->failure) call->failure = std::current_exception();
  }
}

// The device's compute units, and whether MYDEV_COMPUTE_UNITS asked for them: fixed for the process.
struct Units {
  int count = 1;
  int asked = 0;
};
const Units& units() {
  static const Units u = [] {
    Units got;
    MYDEV_CHECK(mydevGetComputeUnits(&got.count, &got.asked));
    return got;
  }();
  return u;
}

} // namespace

// Units side by side each using every intra-op thread would ask for units x threads cores: with the machine's
// default of one thread a core, programs on two units ran 1.15-1.42x eager's time.
IntraOpThreads::IntraOpThreads(int threads) {
  // ATen sets a thread's OpenMP and MKL threads to torch's setting at the thread's first parallel call, once
  // per thread as libtorch's flag records (at::internal::lazy_init_num_threads, inline, may keep a flag of its
  // own in this library): asking libtorch now means it cannot undo the setting below later. A BLAS call alone
  // does not ask, so a fresh thread whose first kernel is a matrix product would use every core.
  if (at::get_num_threads() == threads) return;  // (OpenMP builds: this thread's own count)
  changed_ = true;
#if AT_PARALLEL_OPENMP
  omp_saved_ = omp_get_max_threads();
  omp_set_num_threads(threads);
#endif
#if AT_MKL_ENABLED()
  mkl_saved_ = MKL_Set_Num_Threads_Local(threads);
#endif
}

IntraOpThreads::~IntraOpThreads() {
  if (!changed_) return;
#if AT_MKL_ENABLED()
  MKL_Set_Num_Threads_Local(mkl_saved_);
#endif
#if AT_PARALLEL_OPENMP
  omp_set_num_threads(omp_saved_);
#endif
}

int kernel_intra_op_threads() {
  // MYDEV_KERNEL_THREADS=torch: torch's setting as it is, for the CPU's bits at any setting.
  static const int cores = [] {  // (0: no limit)
    const char* v = std::getenv("MYDEV_KERNEL_THREADS");
    if (v != nullptr && std::string_view(v) == "torch") return 0;
    TORCH_CHECK(v == nullptr || *v == '\0', "MYDEV_KERNEL_THREADS: expected unset or 'torch', got '", v, "'");
    cpu_set_t usable;
    if (sched_getaffinity(0, sizeof(usable), &usable) == 0) return std::max(1, CPU_COUNT(&usable));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  const int asked = at::get_num_threads();
  if (cores == 0 || asked < cores) return asked;
  return std::max(1, cores - 1);
}

void run_on_compute_units(const std::function<void()>& work) {
  const KernelContext* kernel = current_kernel();
  if (kernel == nullptr) {
    work();
    return;
  }
  ComputeUnitsCall call{&work, std::this_thread::get_id(), *kernel,
                        std::max(1, at::get_num_threads() / std::max(1, units().count)), {}, nullptr};
  MYDEV_CHECK(mydevRunOnComputeUnits(run_on_unit, &call));
  if (call.failure) std::rethrow_exception(call.failure);
}

namespace {
std::atomic<int64_t> g_blocks_elsewhere{0};
} // namespace

int block_count(int64_t items, int64_t min_items, int64_t work, int64_t min_work) {
  constexpr int64_t kMaxParts = 2;
  const int64_t parts =
      std::min({items / std::max<int64_t>(1, min_items), work / std::max<int64_t>(1, min_work), kMaxParts});
  return static_cast<int>(std::max<int64_t>(1, parts));
}

bool blocks_split() {
  const KernelContext* kernel = current_kernel();
  // Only a kernel of one intra-op thread (one fewer than the cores: two cores) is cut: the units run their blocks
  // with a thread each, so a kernel of more would run its blocks with fewer threads than the whole call, for other
  // bits (a BLAS's or oneDNN's partial sums per thread) and less speed.
  return units().count >= 2 && kernel != nullptr && !kernel->at_call && kernel->threads == 1;
}

void run_blocks(int64_t items, int parts, const std::function<void(int64_t lo, int64_t count)>& part) {
  if (parts < 2 || !blocks_split()) {
    part(0, items);
    return;
  }
  std::atomic<int> next{0};
  const std::thread::id caller = std::this_thread::get_id();
  run_on_compute_units([&] {
    for (int p = next.fetch_add(1); p < parts; p = next.fetch_add(1)) {
      const int64_t lo = items * p / parts;
      part(lo, items * (p + 1) / parts - lo);
      if (std::this_thread::get_id() != caller) g_blocks_elsewhere.fetch_add(1, std::memory_order_relaxed);
    }
  });
}

int64_t blocks_run_by_other_units() {
  return g_blocks_elsewhere.load(std::memory_order_relaxed);
}

int kernel_team_threads() {
  return units().count > 1 && kernel_intra_op_threads() == 1 ? units().count : 0;
}

std::pair<uint64_t, uint64_t> team_thread_counts() {
  unsigned long long elsewhere = 0, switched = 0;
  MYDEV_CHECK(mydevGetTeamCounts(&elsewhere, &switched));
  return {elsewhere, switched};
}

SideBySide side_by_side_asked() {
  if (!units().asked) return SideBySide::Decide;
  return units().count > 1 ? SideBySide::Always : SideBySide::Never;
}

} // namespace my_device
