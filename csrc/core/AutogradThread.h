#pragma once

namespace my_device {

// Called once on each host thread, the first time it asks for a current mydev
// stream (every kernel launch does). See AutogradThread.cpp.
void configure_backward_thread();

} // namespace my_device
