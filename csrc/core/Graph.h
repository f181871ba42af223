#pragma once
// Device graphs: a stream's work captured once and replayed as one launch
// (the runtime's stream capture, mydev_runtime.h "graphs"), behind PyTorch's
// at::GraphImplInterface, so torch.accelerator.Graph and torch.mydev's
// graph API (my_device/mydev/graphs.py) drive it.
//
// What the integration adds to the runtime's capture:
//  - captured kernels are not retired after they run but kept by the graph
//    (launch_async hands them to the capture: Launch.h);
//  - memory allocated during capture comes from the graph's private pool
//    (Allocator.h), kept for the replays until the graph is reset;
//  - random kernels draw, at each replay, the numbers eager calls would have
//    drawn at that point of the generator's sequence (capture_engine).
#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>
#include <mydev_runtime.h>

#include <atomic>

namespace my_device {

// Captures underway in this process: the launch path asks the runtime about
// its stream only while there are some.
inline std::atomic<int>& captures_underway() {
  static std::atomic<int> count{0};
  return count;
}
inline bool capture_underway() {
  return captures_underway().load(std::memory_order_relaxed) != 0;
}
// Whether `stream` takes part in a capture (any state), and its id.
bool stream_capturing(mydevStream_t stream, unsigned long long* capture_id = nullptr);
// Whether `device`'s current stream is capturing (torch.mydev.is_current_stream_capturing).
bool current_stream_capturing(c10::DeviceIndex device);

// The CPU engine a random kernel captured on `capture_id` draws from: it is
// reseeded before each replay from the mydev generator's (seed, offset) then.
at::Generator capture_engine(unsigned long long capture_id, const at::Generator& mydev_generator);

// Registers the graph implementation for the PrivateUse1 device under the
// name PyTorch looks it up by, which is the backend's registered name: call
// after the rename.
void register_graph_impl();

} // namespace my_device
