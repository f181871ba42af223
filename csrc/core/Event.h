#pragma once
// A runtime event the integration owns for one scope or object: created with
// it, destroyed with it (a wait enqueued on it keeps what it waits for, so it
// may go before the wait has run). The events PyTorch owns (torch.Event,
// c10::Event) are Guard.cpp's.
#include <mydev_runtime.h>

#include <optional>
#include <utility>

#include "Exception.h"

namespace my_device {

class Event {
 public:
  // Raises on failure; try_create returns nothing instead, for callers that
  // must not raise (the allocator's frees).
  explicit Event(unsigned flags = mydevEventDisableTiming) {
    MYDEV_CHECK(mydevEventCreateWithFlags(&event_, flags));
  }
  static std::optional<Event> try_create(unsigned flags = mydevEventDisableTiming) {
    mydevEvent_t e = nullptr;
    if (mydevEventCreateWithFlags(&e, flags) != mydevSuccess) return std::nullopt;
    return Event(e);
  }
  ~Event() {
    if (event_ != nullptr) mydevEventDestroy(event_);
  }
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&& other) noexcept {
    std::swap(event_, other.event_);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  mydevEvent_t get() const {
    return event_;
  }
  mydevError_t record(mydevStream_t stream) const {
    return mydevEventRecord(event_, stream);
  }
  mydevError_t query() const {
    return mydevEventQuery(event_);
  }
  mydevError_t synchronize() const {
    return mydevEventSynchronize(event_);
  }

 private:
  explicit Event(mydevEvent_t event) : event_(event) {}
  mydevEvent_t event_ = nullptr;
};

} // namespace my_device
