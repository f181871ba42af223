#pragma once
// Which steps of a program may run side by side, and running them so.
//
// A program is one task on its stream, but its steps need not run one after
// another: a backward's two matrix products of one layer (the gradients of its
// input and of its weight) read the same tensors and write different ones. As
// a device runs independent kernels at once, the task runs such steps on the
// device's compute units at the same time (core/Launch.h,
// run_on_compute_units), each step after every earlier step that writes
// memory it touches or touches memory it writes (an arena buffer's bytes are
// reused by later values: the reuse orders them too). A step may also come in
// parts that run side by side (a large matrix product, by rows): the
// device's units then share one step as a GPU's blocks share a kernel.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace my_device::compiler {

// Memory a step reads or writes. The inputs are one region, since two of them
// may share a storage; each output buffer and each result a call allocated
// is its own; arena buffers are byte ranges of the arena.
struct Touch {
  enum Kind : uint8_t { Inputs, Output, Arena, Held } kind;
  int64_t id;          // output slot, or held value
  size_t begin, end;   // bytes, for Arena
  bool written;
};

class StepSchedule {
 public:
  // `touches`: per step. `in_order`: steps that must keep their order among
  // themselves whatever they touch (those drawing random numbers from one
  // generator). `parts`: per step, how many parts it runs in (at least 1).
  static StepSchedule plan(const std::vector<std::vector<Touch>>& touches, const std::vector<bool>& in_order,
                           const std::vector<int>& parts);

  // Whether any two steps, or parts of one, may run at once.
  bool has_parallel_steps() const {
    return !successors_.empty();
  }
  // Whether running side by side shortens a run enough to pay for handing
  // steps between threads, by the steps' times in a run one after another
  // (nanoseconds, each step whole): the longest path (a step in parts counting
  // for one part) at most 0.9 of the total, steps averaging at least 10 us.
  // `parts_in_order`: runs in order cut a step in parts too (as blocks for
  // whichever unit is free), so a step in parts counts for one part in the
  // total as well, and only independent steps can gain.
  bool worth_it(const std::vector<int64_t>& took, bool parts_in_order) const;
  // Runs step(i, part) for every part of every step, on the compute units,
  // each once its step's predecessors have run (in index order when only one
  // thread runs them). finished(i) runs under the schedule's lock after step
  // i's last part. The first step to
  // throw (the lowest index, if several) stops the run: no further step
  // starts, and its exception is rethrown once the running ones end.
  void run(const std::function<void(size_t, int)>& step, const std::function<void(size_t)>& finished) const;

 private:
  std::vector<std::vector<uint32_t>> successors_;
  std::vector<uint32_t> waits_for_;
  std::vector<int> parts_;
};

} // namespace my_device::compiler
