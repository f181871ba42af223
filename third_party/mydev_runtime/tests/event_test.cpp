// Runtime tests: events.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

// ---- events ---------------------------------------------------------------

void testEvents() {
  mydevEvent_t e1 = nullptr, e2 = nullptr, e3 = nullptr, nt = nullptr, never = nullptr;
  CHECK_OK(mydevEventCreateWithFlags(&e1, mydevEventDefault));
  CHECK_OK(mydevEventCreateWithFlags(&e2, mydevEventDefault));
  CHECK_OK(mydevEventCreateWithFlags(&e3, mydevEventDefault));
  CHECK_OK(mydevEventCreateWithFlags(&nt, mydevEventDisableTiming));
  CHECK_OK(mydevEventCreateWithFlags(&never, mydevEventDefault));
  mydevEvent_t bad = nullptr;
  CHECK_ERR(mydevEventCreateWithFlags(&bad, 0x1), mydevErrorInvalidValue);
  CHECK_ERR(mydevEventCreateWithFlags(nullptr, 0), mydevErrorInvalidValue);

  // Never recorded: complete for Query/Synchronize, no time to measure.
  CHECK_OK(mydevEventQuery(never));
  CHECK_OK(mydevEventSynchronize(never));
  float ms = -1;
  CHECK_ERR(mydevEventElapsedTime(&ms, never, never), mydevErrorInvalidResourceHandle);

  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, 0));
  CHECK_OK(mydevEventRecord(e1, s));
  CHECK_ERR(mydevEventElapsedTime(&ms, e1, never), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventElapsedTime(&ms, never, e1), mydevErrorInvalidResourceHandle);
  // Stamps are taken when the worker reaches the marker: synchronise before
  // sleeping so each sleep lies between two stamps.
  CHECK_OK(mydevEventSynchronize(e1));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK_OK(mydevEventRecord(e2, s));
  CHECK_OK(mydevEventSynchronize(e2));
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  CHECK_OK(mydevEventRecord(e3, nullptr));
  CHECK_OK(mydevEventSynchronize(e3));
  CHECK_OK(mydevEventQuery(e1));
  CHECK_OK(mydevEventSynchronize(e2));
  CHECK_OK(mydevStreamWaitEvent(s, e3));
  CHECK_OK(mydevStreamWaitEvent(nullptr, e1));
  CHECK_OK(mydevStreamWaitEvent(s, never));

  float t12 = -1, t13 = -1, t11 = -1, t21 = 1;
  CHECK_OK(mydevEventElapsedTime(&t12, e1, e2));
  CHECK_OK(mydevEventElapsedTime(&t13, e1, e3));
  CHECK_OK(mydevEventElapsedTime(&t11, e1, e1));
  CHECK_OK(mydevEventElapsedTime(&t21, e2, e1));
  CHECK(t12 >= 5.0f);  // at least the sleep between the records
  CHECK(t12 < 5000.0f);
  CHECK(t13 >= t12 + 2.0f);
  CHECK(t11 == 0.0f);
  CHECK(t21 == -t12);

  // Re-recording moves the event forward.
  CHECK_OK(mydevEventRecord(e1, s));
  CHECK_OK(mydevEventSynchronize(e1));
  CHECK_OK(mydevEventElapsedTime(&ms, e3, e1));
  CHECK(ms >= 0.0f);

  CHECK_OK(mydevEventRecord(nt, s));
  CHECK_OK(mydevEventSynchronize(nt));
  CHECK_OK(mydevEventQuery(nt));
  CHECK_ERR(mydevEventElapsedTime(&ms, nt, e1), mydevErrorTimingDisabled);
  CHECK_ERR(mydevEventElapsedTime(&ms, e1, nt), mydevErrorTimingDisabled);
  mydevEvent_t nt2 = nullptr;  // timing is checked before recording
  CHECK_OK(mydevEventCreateWithFlags(&nt2, mydevEventDisableTiming));
  CHECK_ERR(mydevEventElapsedTime(&ms, nt2, e1), mydevErrorTimingDisabled);
  CHECK_ERR(mydevEventElapsedTime(nullptr, e1, e2), mydevErrorInvalidValue);

  // Invalid handles.
  CHECK_OK(mydevEventDestroy(e3));
  CHECK_ERR(mydevEventDestroy(e3), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventDestroy(nullptr), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventQuery(e3), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventSynchronize(e3), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventRecord(e3, s), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventElapsedTime(&ms, e1, e3), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevStreamWaitEvent(s, e3), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventQuery(nullptr), mydevErrorInvalidResourceHandle);
  CHECK_OK(mydevStreamDestroy(s));
  CHECK_ERR(mydevEventRecord(e1, s), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevStreamWaitEvent(s, e1), mydevErrorInvalidResourceHandle);

  for (mydevEvent_t e : {e1, e2, nt, nt2, never}) CHECK_OK(mydevEventDestroy(e));
}

}  // namespace rt
