#pragma once
// The answers for call signatures: each output's geometry and dtype.
//
// A queued host kernel allocates its outputs before its CPU kernel runs, so
// their shapes must be known at the call. The first call of a signature runs
// at the call, and its outputs are the answer for every later call of it (see
// signature_for in QueuedHostKernel.cpp): a training loop, which repeats the
// same calls, runs each signature at the call once. Kernels of their own that
// allocate outputs before queueing (convolution) keep theirs the same way
// (known_outputs).
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace my_device {

// What the Meta kernel says of a call: each output's geometry and dtype.
struct OutputSpec {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
};
using Specs = std::vector<OutputSpec>;

// A call's signature: what the Meta kernel (and the CPU kernel's argument
// checks) can see of its arguments. Built into a buffer each thread reuses,
// so a lookup allocates nothing.
class CallKey {
 public:
  void clear() {
    shape_.clear();
    values_.clear();
  }
  // Appends what the Meta kernel can see of `v`; false for a kind of argument
  // it cannot describe (the call is then not cached). Floating values change
  // no output geometry but change every step in an optimizer (learning-rate
  // schedules, bias corrections), so unless `exact` only their class goes
  // into the shape key (what Meta kernels' value checks look at: a negative
  // beta, an infinite norm order), and their exact value into values().
  bool add(const c10::IValue& v, bool exact);
  // An out= argument. The Meta kernel is given it empty, so only its dtype
  // shapes the answer; its geometry is in the key for the CPU kernel's checks
  // (a resize, an output that overlaps itself).
  void add_output(const c10::IValue& v);
  // The settings a call's answer depends on that its arguments do not show:
  // the default dtype (bool / bool), grad mode. (Deterministic mode keeps host
  // kernels at the call: see queue_host_kernel.)
  void add_settings();
  // One byte of what the CPU kernel's checks see beyond each tensor alone (how
  // a written tensor overlaps another argument).
  void add_byte(uint8_t b) {
    shape_.push_back(static_cast<char>(b));
  }
  const std::string& shape() const {
    return shape_;
  }
  // shape() followed by the exact floating values: the key of argument checks
  // that depend on values (see Plan::scalar_checks).
  const std::string& exact() {
    exact_.assign(shape_).append(values_);
    return exact_;
  }

 private:
  std::string shape_, values_, exact_;
};

// The answer for a signature: the outputs' specs, or nullopt for a call that
// stays at the call (an output left undefined, or one a queued call could not
// hand out: see answer_from_run).
using Answer = std::optional<Specs>;

// A signature's entry: its answer, and whether the CPU kernel has run a call
// of this exact signature at the call, without an error or a warning (and, for
// an in-place op, left self's geometry as it was). The CPU kernel's checks of anything
// but the data are a function of the signature, so only then may such calls be
// queued: every check a queued kernel could still fail on the worker is one
// that depends on the data (an index out of range), which CUDA defers too.
struct Signature {
  explicit Signature(Answer a) : answer(std::move(a)) {}
  const Answer answer;
  mutable std::atomic<bool> verified{false};
};

// Two generations of entries: once the recent one is full it becomes the older
// one (the older is dropped), and an older entry found again moves back. An
// entry then lasts at least kMaxEntries new signatures after its last use, so
// a process that has seen many shapes keeps those its loop repeats. Clearing
// everything when full instead dropped a signature right after its first run,
// whose next call then ran at the call again.
class MetaCache {
 public:
  std::shared_ptr<const Signature> find(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = recent_.find(key); it != recent_.end()) return it->second;
    auto it = older_.find(key);
    if (it == older_.end()) return nullptr;
    std::shared_ptr<const Signature> entry = it->second;
    keep(key, entry);
    return entry;
  }
  std::shared_ptr<const Signature> insert(const std::string& key, Answer answer) const {
    auto entry = std::make_shared<const Signature>(std::move(answer));
    std::lock_guard<std::mutex> lock(mu_);
    keep(key, entry);
    return entry;
  }

 private:
  using Map = std::unordered_map<std::string, std::shared_ptr<const Signature>>;
  void keep(const std::string& key, const std::shared_ptr<const Signature>& entry) const {  // under mu_
    if (recent_.size() >= kMaxEntries) {
      older_ = std::move(recent_);
      recent_ = Map();
    }
    recent_.emplace(key, entry);
  }
  static constexpr size_t kMaxEntries = 512;
  mutable std::mutex mu_;
  mutable Map recent_, older_;
};

// Runs `op`'s Meta kernel on `args` (mydev tensors stand in as Meta tensors of
// the same geometry). nullopt if it raised: such calls are not cached, so the
// error is raised again, by the CPU kernel at the call, every time.
std::optional<Answer> run_meta(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args);

// For kernels of their own that allocate outputs before queueing
// (convolution): the outputs the first run of a call of this signature gave
// (remember_outputs, after that run at the call), or nullopt for a new one.
std::optional<Specs> known_outputs(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args);
void remember_outputs(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                      const std::vector<at::Tensor>& outputs);

} // namespace my_device
