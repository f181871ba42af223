#pragma once
// Host-kernel calls queued on the stream (see QueuedHostKernel.cpp).
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <memory>
#include <string>

namespace my_device {

// Queues the host kernel call on `stack` (the op's arguments) as a kernel on
// `device`'s current stream, leaving its results on the stack, if the op and
// the call allow it (Plan.h). Returns false, with the stack untouched, when
// the call must run in stream order now instead.
//
// A declined call whose first run at the call is to confirm its signature
// (see Signature in MetaCache.h) gets `pending` filled in. It belongs to the
// call: a run that raises drops it with the call, so that nothing left over
// confirms another call's signature (a later call of a new signature once
// "confirmed" the failed call's, which was then queued and failed on the worker).
struct Plan;
struct Signature;
struct PendingConfirmation {
  const Plan* plan = nullptr;
  std::shared_ptr<const Signature> signature;  // a known signature's, or null for a new one
  std::string new_key;                                // a new signature's key
  bool awaiting() const {
    return plan != nullptr;
  }
};
bool queue_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device,
                       PendingConfirmation& pending);
// Notes whether a warning was raised on this thread while it lives, and
// passes each on to the handler it replaced (Python's, in a call from Python)
// if `forward`, or drops it.
class WarningWatch : public c10::WarningHandler {
 public:
  explicit WarningWatch(bool forward)
      : previous_(c10::WarningUtils::get_warning_handler()), forward_(forward) {
    c10::WarningUtils::set_warning_handler(this);
  }
  ~WarningWatch() override {
    c10::WarningUtils::set_warning_handler(previous_);
  }
  WarningWatch(const WarningWatch&) = delete;
  WarningWatch& operator=(const WarningWatch&) = delete;
  void process(const c10::Warning& warning) override {
    warned_ = true;
    if (forward_) previous_->process(warning);
  }
  bool warned() const {
    return warned_;
  }

 private:
  c10::WarningHandler* previous_;
  bool forward_;
  bool warned_ = false;
};

// Call after a declined call's run at the call ended without error, with its
// `nreturns` results on top of `stack`, and whether it warned: later calls of
// the same signature are then queued, provided the results have the sizes,
// dtypes and layout the Meta kernel gave and it did not warn.
void confirm_signature(PendingConfirmation& pending, const torch::jit::Stack& stack, size_t nreturns, bool warned);

} // namespace my_device
