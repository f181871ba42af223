// Runtime tests: activity tracing.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

// Activity tracing (mydev_activity.h): every launch, copy and inline function
// that ran while a callback was set is reported once, with its label, stream,
// correlation id and device times; nothing is reported once it is cleared.
struct ActivitySink {
  std::mutex mu;
  std::vector<mydevActivityRecord> records;
  std::vector<std::string> labels;
};
void collectActivity(const mydevActivityRecord* r, void* user) {
  auto* sink = static_cast<ActivitySink*>(user);
  std::lock_guard<std::mutex> lock(sink->mu);
  sink->records.push_back(*r);
  sink->labels.emplace_back(r->label);
}
void testActivityTracing() {
  ActivitySink sink;
  mydevStream_t s = newStream(0);
  int* d = nullptr;
  CHECK_OK(mydevMalloc(reinterpret_cast<void**>(&d), 256));
  int host[64] = {};
  CHECK_ERR(mydevActivityPopExternalCorrelationId(nullptr), mydevErrorInvalidValue);  // empty stack
  CHECK_OK(mydevActivitySetCallback(collectActivity, &sink));
  CHECK_OK(mydevActivityPushExternalCorrelationId(41));
  CHECK_OK(mydevLaunchHostFuncLabeled(s, noopKernel, nullptr, "my_op"));
  CHECK_OK(mydevActivityPushExternalCorrelationId(42));
  CHECK_OK(mydevMemcpyAsync(d, host, sizeof(host), mydevMemcpyHostToDevice, s));
  uint64_t popped = 0;
  CHECK_OK(mydevActivityPopExternalCorrelationId(&popped));
  CHECK(popped == 42);
  CHECK_OK(mydevMemsetAsync(d + 32, 0, 128, s));
  CHECK_OK(mydevMemcpyAsync(d + 32, d, 64, mydevMemcpyDeviceToDevice, s));
  CHECK_OK(mydevLaunchHostFuncInline(nullptr, noopKernel, nullptr));   // default stream, at the call
  CHECK_OK(mydevMemcpy(host, d, sizeof(host), mydevMemcpyDeviceToHost));
  CHECK_OK(mydevActivityPopExternalCorrelationId(&popped));
  CHECK(popped == 41);
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK_OK(mydevActivitySetCallback(nullptr, nullptr));
  CHECK_OK(mydevLaunchHostFuncLabeled(s, noopKernel, nullptr, "untraced"));
  CHECK_OK(mydevStreamSynchronize(s));
  std::lock_guard<std::mutex> lock(sink.mu);
  CHECK(sink.records.size() == 6);
  // Work on different streams is reported as it finishes: find each by what it was.
  auto find = [&](mydevActivityKind kind, const char* label, int inline_launch) -> const mydevActivityRecord& {
    for (size_t n = 0; n < sink.records.size(); ++n) {
      if (sink.records[n].kind == kind && sink.labels[n] == label && sink.records[n].inline_launch == inline_launch) {
        return sink.records[n];
      }
    }
    std::fprintf(stderr, "no activity record %s\n", label);
    std::abort();
  };
  // Under MYDEV_LAUNCH_BLOCKING a launch or copy runs in the caller, in stream order: inline.
  const mydevActivityRecord& k = find(mydevActivityKindKernel, "my_op", launchBlocking() ? 1 : 0);
  CHECK(k.stream == s && k.device == 0 && k.correlation_id == 41);
  CHECK(k.start_ns > 0 && k.end_ns >= k.start_ns);
  const mydevActivityRecord& c = find(mydevActivityKindMemcpy, "HtoD", launchBlocking() ? 1 : 0);
  CHECK(c.bytes == sizeof(host) && c.correlation_id == 42 && c.stream == s);
  CHECK(c.start_ns >= k.end_ns);  // stream order
  const mydevActivityRecord& m = find(mydevActivityKindMemset, "", launchBlocking() ? 1 : 0);
  CHECK(m.bytes == 128 && m.correlation_id == 41 && m.stream == s && m.start_ns >= c.end_ns);
  const mydevActivityRecord& dd = find(mydevActivityKindMemcpy, "DtoD", launchBlocking() ? 1 : 0);
  CHECK(dd.bytes == 64 && dd.correlation_id == 41 && dd.stream == s && dd.start_ns >= m.end_ns);
  const mydevActivityRecord& i = find(mydevActivityKindKernel, "", 1);
  CHECK(i.stream == nullptr && i.correlation_id == 41);
  const mydevActivityRecord& h = find(mydevActivityKindMemcpy, "DtoH", 1);
  CHECK(h.bytes == sizeof(host) && h.correlation_id == 41);
  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevStreamDestroy(s));
}

}  // namespace rt
