#include "StepSchedule.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>

#include "core/ComputeUnits.h"

namespace my_device::compiler {
namespace {

bool conflict(const Touch& a, const Touch& b) {
  if (!(a.written || b.written) || a.kind != b.kind) return false;
  if (a.kind == Touch::Arena) return a.begin < b.end && b.begin < a.end;
  return a.id == b.id;
}

bool conflict(const std::vector<Touch>& a, const std::vector<Touch>& b) {
  for (const Touch& x : a) {
    for (const Touch& y : b) {
      if (conflict(x, y)) return true;
    }
  }
  return false;
}

constexpr double kParallelGain = 0.9;
constexpr int64_t kMinParallelStepNs = 10000;

} // namespace

StepSchedule StepSchedule::plan(const std::vector<std::vector<Touch>>& touches, const std::vector<bool>& in_order,
                                const std::vector<int>& parts) {
  const auto n = static_cast<uint32_t>(touches.size());
  StepSchedule s;
  std::vector<std::vector<uint32_t>> successors(n);
  std::vector<uint32_t> waits_for(n, 0);
  bool chain = true;
  int64_t last_in_order = -1;
  for (uint32_t j = 0; j < n; ++j) {
    for (uint32_t i = 0; i < j; ++i) {
      if (conflict(touches[i], touches[j]) || (in_order[j] && static_cast<int64_t>(i) == last_in_order)) {
        successors[i].push_back(j);
        ++waits_for[j];
      }
    }
    if (in_order[j]) last_in_order = j;
    if (j > 0 && (successors[j - 1].empty() || successors[j - 1].back() != j)) chain = false;  // j may run before j - 1
  }
  if (!chain || std::any_of(parts.begin(), parts.end(), [](int p) { return p > 1; })) {
    s.successors_ = std::move(successors);
    s.waits_for_ = std::move(waits_for);
    s.parts_ = parts;
  }
  return s;
}

bool StepSchedule::worth_it(const std::vector<int64_t>& took, bool parts_in_order) const {
  const size_t n = took.size();
  if (n == 0 || successors_.size() != n) return false;
  int64_t total = 0;
  std::vector<int64_t> finish(n, 0);  // the longest path ending with each step
  for (size_t i = 0; i < n; ++i) {
    total += parts_in_order ? took[i] / parts_[i] : took[i];
    finish[i] += took[i] / parts_[i];
    for (uint32_t next : successors_[i]) finish[next] = std::max(finish[next], finish[i]);
  }
  const int64_t longest = *std::max_element(finish.begin(), finish.end());
  return total / static_cast<int64_t>(n) >= kMinParallelStepNs &&
         static_cast<double>(longest) <= kParallelGain * static_cast<double>(total);
}

void StepSchedule::run(const std::function<void(size_t, int)>& step,
                       const std::function<void(size_t)>& finished) const {
  const size_t n = successors_.size();
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<uint32_t> waiting = waits_for_;
  std::vector<int> parts_left = parts_;
  // A min-heap of (step, part): one thread alone runs the steps in index order.
  std::vector<std::pair<uint32_t, int>> ready;
  auto make_ready = [&](uint32_t i) {
    for (int part = 0; part < parts_[i]; ++part) {
      ready.emplace_back(i, part);
      std::push_heap(ready.begin(), ready.end(), std::greater<>());
    }
  };
  for (uint32_t i = 0; i < n; ++i) {
    if (waiting[i] == 0) make_ready(i);
  }
  size_t done = 0;
  int running = 0;
  const int all_threads = at::get_num_threads();  // (on a unit it is the unit's share)
  bool failed = false;
  size_t failed_step = n;
  std::exception_ptr failure;
  run_on_compute_units([&] {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      changed.wait(lock, [&] { return failed || !ready.empty() || done == n; });
      if (failed || ready.empty()) return;
      std::pop_heap(ready.begin(), ready.end(), std::greater<>());
      const auto [i, part] = ready.back();
      ready.pop_back();
      // Another thread may take this step's next part, or a step made ready meanwhile.
      if (!ready.empty()) changed.notify_one();
      // A step nothing else can run beside (the others wait for it: no step runs, none is ready, and
      // none can become ready until it ends) gets every intra-op thread: a chain of convolutions
      // would otherwise run each on one unit's share of them while the other units sleep.
      const bool alone = ready.empty() && running == 0;
      ++running;
      lock.unlock();
      std::exception_ptr thrown;
      try {
        std::optional<IntraOpThreads> all;
        if (alone) all.emplace(all_threads);
        step(i, part);
      } catch (...) {
        thrown = std::current_exception();
      }
      lock.lock();
      --running;
      if (thrown) {
        if (i < failed_step) {
          failed_step = i;
          failure = thrown;
        }
        failed = true;
        changed.notify_all();
        continue;
      }
      if (--parts_left[i] > 0) continue;
      ++done;
      finished(i);
      for (uint32_t next : successors_[i]) {
        if (--waiting[next] == 0) make_ready(next);
      }
      // This thread takes the next one itself: another is woken only for a second.
      if (ready.size() > 1 || done == n) changed.notify_all();
    }
  });
  if (failure) std::rethrow_exception(failure);
}

} // namespace my_device::compiler
