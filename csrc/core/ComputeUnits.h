#pragma once
// A kernel's work shared among the device's compute units.
#include <functional>

namespace my_device {

// Inside a kernel: runs `work` on this thread and, at the same time, on each
// of the device's other compute units that is free (the emulator's, mydev_emulator.h),
// each call as this kernel's own code (its context, thread state and warning
// handling). `work` shares the kernel's work among however many calls there
// are: one when no unit is free, or outside a kernel. An exception from any
// call is rethrown here once every call has returned.
void run_on_compute_units(const std::function<void()>& work);

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
  int omp_saved_ = 0;
  int mkl_saved_ = 0;
};

// How work that could run side by side should: on every unit always, never
// (one unit), or as the caller's own timing decides (the device's default).
enum class SideBySide { Decide, Always, Never };
SideBySide side_by_side_asked();

} // namespace my_device
