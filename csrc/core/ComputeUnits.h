#pragma once
// A kernel's work shared among the device's compute units.
#include <cstdint>
#include <functional>
#include <utility>

namespace my_device {

// Inside a kernel: runs `work` on this thread and, at the same time, on each
// of the device's other compute units that is free (the emulator's, mydev_emulator.h),
// each call as this kernel's own code (its context, thread state and warning
// handling). `work` shares the kernel's work among however many calls there
// are: one when no unit is free, or outside a kernel. An exception from any
// call is rethrown here once every call has returned.
void run_on_compute_units(const std::function<void()>& work);

// How many blocks `items` (a product's rows, a batch's samples) are worth
// cutting into for the compute units: each block must have `min_items`, and
// `work` / `min_work` (the kernel's, in whatever unit it counts: a product's
// multiply-adds, a pooling's elements) enough to pay for a hand-over between
// threads (a few microseconds). The same cut whether or not a unit turns out
// free, so the result never depends on which ran it.
int block_count(int64_t items, int64_t min_items, int64_t work, int64_t min_work);
// About 0.1 ms at one core's BLAS speed.
constexpr int64_t kMinMultiplyAddsPerBlock = 1 << 20;
// A pooling's input elements: about 0.1 ms at the CPU loop's speed.
constexpr int64_t kMinPooledPerBlock = 1 << 15;
// An elementwise op's elements: about 0.1 ms of gelu's, 30 us of an add's.
constexpr int64_t kMinElementwisePerBlock = 1 << 17;
// Where an elementwise op's contiguous elements may be cut: at::vec's loops
// take 8 or 16 floats at a time from the start, then finish a tail element by
// element (another code path, whose bits may differ), so blocks that start at
// a multiple of this take each element through the code one call does.
constexpr int64_t kVectorLoopStep = 64;
// Where block `part` of `parts` starts among `items`: at a multiple of `align`,
// the last ending at `items` (part == parts).
inline int64_t block_start(int64_t items, int64_t part, int64_t parts, int64_t align = 1) {
  return part == parts ? items : items * part / parts / align * align;
}
// A matrix product of (rows x depth) by (depth x cols), cut by rows.
inline int product_row_parts(int64_t rows, int64_t cols, int64_t depth) {
  return block_count(rows, 32, rows * cols * depth, kMinMultiplyAddsPerBlock);
}

// Inside a kernel of one intra-op thread on a device with more than one
// compute unit: runs `part(lo, count)` over `items` cut into `parts` blocks,
// each block taken by whichever of this thread and the free units comes
// first. Otherwise (one unit, a kernel of more threads, or one run by
// launch_if_idle on the caller's thread) `part(0, items)` once.
void run_blocks(int64_t items, int parts, const std::function<void(int64_t lo, int64_t count)>& part);
// Whether run_blocks, called here, would cut its items: inside a queued kernel
// of one intra-op thread, on a device with more than one compute unit.
bool blocks_split();
// How many blocks another unit than the kernel's own thread has run (for tests).
int64_t blocks_run_by_other_units();

// This thread's intra-op threads (OpenMP's and MKL's settings, which are per
// thread; ATen's set_num_threads is process-wide) set to `threads` while it
// lives. A unit runs its share of work with its share of them; work the other
// units wait for, with them all.
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int threads);
  ~IntraOpThreads();
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  bool changed_ = false;  // (a thread already at `threads` is left alone)
  int omp_saved_ = 0;
  int mkl_saved_ = 0;
};

// The intra-op threads a kernel launched from this thread runs with, whichever
// thread runs it: torch's setting as this thread sees it (torch.get_num_threads),
// but one fewer than the cores this process may use when it asks for them all.
// The emulated device computes on the host's cores while the host thread keeps
// dispatching: a kernel's team of one thread a core plus that thread made two
// OpenMP teams take turns on the cores, and eager training steps ran 1.4-3x
// slower at two threads on two cores than at one. Fixed at the launch so that a
// kernel's result (a parallel reduction's rounding) never depends on the
// thread that ran it: its stream's worker, the launching thread at the call, a
// waiting host, or a graph replay. MYDEV_KERNEL_THREADS=torch keeps torch's
// setting as it is (the CPU's bits at every setting, at that cost).
int kernel_intra_op_threads();

// The team size Inductor's kernels for this device are written for when their
// OpenMP regions run as teams on its compute units (my_device/inductor/
// kernel_team.h): the units, when a kernel launched from this thread has one
// intra-op thread and the device more than one unit; otherwise 0, and a
// region runs on libgomp with the kernel's intra-op threads.
int kernel_team_threads();
// Team threads run so far on another unit than their kernel's thread, and on
// that thread besides its own (for tests).
std::pair<uint64_t, uint64_t> team_thread_counts();

// How work that could run side by side should: on every unit always, never
// (one unit), or as the caller's own timing decides (the device's default).
enum class SideBySide { Decide, Always, Never };
SideBySide side_by_side_asked();

} // namespace my_device
