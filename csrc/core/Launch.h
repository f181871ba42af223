#pragma once
// Every kernel runs through the runtime's launch entry point, on the current
// stream, so that the runtime decides when and where device memory is touched
// (strict mode opens device pages only inside a launch). C++ exceptions must not
// cross the C API, so the trampoline parks them and they are rethrown here.
#include <exception>
#include <utility>

#include "Exception.h"
#include "Stream.h"

namespace my_device {

template <class F>
void launch(c10::DeviceIndex device, F&& body) {
  struct Closure {
    F* body;
    std::exception_ptr error;
  } closure{&body, nullptr};
  auto trampoline = [](void* data) -> int {
    auto* c = static_cast<Closure*>(data);
    try {
      (*c->body)();
      return 0;
    } catch (...) {
      c->error = std::current_exception();
      return 1;
    }
  };
  mydevError_t err = mydevLaunchHostFunc(current_stream_handle(device), trampoline, &closure);
  if (closure.error) {
    // The runtime keeps a sticky launch failure for the next synchronisation;
    // the op's own exception is the better report, so consume the sticky one.
    mydevStreamSynchronize(current_stream_handle(device));
    std::rethrow_exception(closure.error);
  }
  MYDEV_CHECK(err);
}

} // namespace my_device
