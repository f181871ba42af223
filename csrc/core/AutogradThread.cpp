#include "AutogradThread.h"

#include <c10/core/AutogradState.h>
#include <c10/util/env.h>

namespace my_device {

// PyTorch's autograd engine runs the backward nodes of every device type other
// than CPU, Meta and Lazy on one engine thread per device (engine.cpp,
// `should_run_in_cpu_ready_queue`), with no way for a backend to opt out. For
// CUDA that thread lets host work of one device overlap another's. mydev's
// kernels are queued on its streams already, so the engine thread adds nothing
// but two thread hand-offs per backward() and a copy of the thread-local state
// per graph task: the tiny training step's backward took 186 us against 120 us
// on the calling thread. The one switch PyTorch offers is the
// per-thread `multithreading_enabled` flag (`torch.autograd.
// set_multithreading_enabled`), which sends every device's nodes to the calling
// thread, as CPU's always are. mydev turns it off on each thread that uses the
// device. A user's own setting made later wins, and
// MYDEV_AUTOGRAD_DEVICE_THREADS=1 keeps PyTorch's default.
// test_autograd_thread.py checks that the engine still needs this.
void configure_backward_thread() {
  static const bool keep_default = c10::utils::check_env("MYDEV_AUTOGRAD_DEVICE_THREADS") == true;
  if (!keep_default) c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
}

} // namespace my_device
