// Teams: a launched function's work as threads that wait for each other, as
// the blocks of a cooperative GPU kernel synchronise across its grid. Team
// thread 0 runs on the calling thread; the others on whichever compute units
// take them (compute_units.cpp) or, when none has by the time thread 0 first
// waits, on the calling thread as coroutines, each run up to its next wait in
// turn. A team thread sees its own index whichever thread runs it, so the
// team's result never depends on how many units it got.
//
// Why coroutines rather than a team of whatever size turned up: code written
// for N team threads (an OpenMP region of num_threads(N), which Inductor's
// kernels are) splits its loops and keeps partial results per team thread,
// and its rounding follows that split; a team of fewer would round otherwise.
// A unit cannot be waited for either: it may be running another task's work.
#include "stream_state.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace mydev_detail {
namespace {

constexpr int kMaxTeam = 64;
// As a thread's default stack: team code does not know where it runs.
constexpr size_t kCoroutineStack = size_t{8} << 20;

struct Team;

// A team thread the calling thread runs besides its own: its stack and where it waits.
struct Coroutine {
  void* stack = nullptr;
  ucontext_t context{};
  ucontext_t* resumer = nullptr;  // where it goes back to when it waits or ends
};

struct Member {
  Team* team = nullptr;
  int index = 0;
  int singles = 0;  // single blocks this team thread has reached
  bool done = false;
  Coroutine* coroutine = nullptr;  // set when the calling thread runs it besides its own
};

struct Team {
  void (*fn)(void*);
  void* data;
  int size;
  std::atomic<int> next{1};  // the next team thread no thread has taken
  std::atomic<int> arrived{0};
  std::atomic<uint32_t> phase{0};  // barriers completed
  std::atomic<int> singles{0};     // single blocks taken
  std::atomic<int> done{0};
  Member members[kMaxTeam];
  std::vector<Member*> coroutines;  // the calling thread's, in start order
};

thread_local Member* t_member = nullptr;
thread_local Member* t_starting = nullptr;
std::atomic<unsigned long long> g_elsewhere{0};
std::atomic<unsigned long long> g_switched{0};

// A thread's coroutines, kept for its next teams (a stream's worker runs many).
struct Coroutines {
  std::vector<Coroutine*> free;
  ~Coroutines() {
    for (Coroutine* c : free) {
      munmap(c->stack, kCoroutineStack);
      delete c;
    }
  }
  Coroutine* take() {
    if (!free.empty()) {
      Coroutine* c = free.back();
      free.pop_back();
      return c;
    }
    void* s = mmap(nullptr, kCoroutineStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                   -1, 0);
    if (s == MAP_FAILED) {
      std::fprintf(stderr, "mydev runtime: no memory for a team thread's stack\n");
      std::abort();
    }
    mprotect(s, 4096, PROT_NONE);  // a guard page: an overflow faults instead of writing past the stack
    auto* c = new Coroutine;
    c->stack = s;
    return c;
  }
};
thread_local Coroutines t_coroutines;

void finish(Member& m) {
  m.done = true;
  m.team->done.fetch_add(1, std::memory_order_acq_rel);
}

void coroutineMain() {
  Member* m = t_starting;
  m->team->fn(m->team->data);
  finish(*m);
  swapcontext(&m->coroutine->context, m->coroutine->resumer);  // never resumed
}

// Runs coroutine m on this thread until it waits or ends.
void resume(Member& m) {
  ucontext_t here;
  m.coroutine->resumer = &here;
  Member* const saved = t_member;
  t_member = &m;
  swapcontext(&here, &m.coroutine->context);
  t_member = saved;
}

void start(Member& m, Coroutine* c) {
  m.coroutine = c;
  getcontext(&c->context);
  c->context.uc_stack.ss_sp = c->stack;
  c->context.uc_stack.ss_size = kCoroutineStack;
  c->context.uc_link = nullptr;
  makecontext(&c->context, coroutineMain, 0);
  t_starting = &m;
  resume(m);
}

// On the calling thread, from team thread 0's waits: runs its coroutines up to
// their next wait (or their end), and takes as coroutines the team threads no
// unit has taken, run from their start to their first wait.
void runCoroutines(Team& t) {
  for (Member* m : t.coroutines) {
    if (!m->done) resume(*m);
  }
  for (int k = t.next.fetch_add(1, std::memory_order_acq_rel); k < t.size;
       k = t.next.fetch_add(1, std::memory_order_acq_rel)) {
    Member& m = t.members[k];
    t.coroutines.push_back(&m);
    g_switched.fetch_add(1, std::memory_order_relaxed);
    start(m, t_coroutines.take());
  }
}

// Counts this team thread in; the last to arrive opens the barrier.
void arrive(Team& t) {
  if (t.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == t.size) {
    t.arrived.store(0, std::memory_order_relaxed);
    t.phase.fetch_add(1, std::memory_order_release);
  }
}

template <class Pred>
void spinForever(Pred done) {
  while (!spinUntil(done, kHelperSpinNs)) {
  }
}

void barrier(Member& m) {
  Team& t = *m.team;
  if (m.coroutine != nullptr) {
    // Team thread 0 arrives after all its coroutines, so the barrier is open
    // by the time this one is resumed.
    arrive(t);
    swapcontext(&m.coroutine->context, m.coroutine->resumer);
    return;
  }
  if (m.index == 0) runCoroutines(t);
  const uint32_t phase = t.phase.load(std::memory_order_acquire);
  arrive(t);
  spinForever([&] { return t.phase.load(std::memory_order_acquire) != phase; });
}

// What each compute unit runs: team thread 0 on the calling thread, any team
// threads left on the others.
struct Call {
  Team* team;
  std::thread::id caller;
};

void runOnUnit(void* data) {
  auto* call = static_cast<Call*>(data);
  Team& t = *call->team;
  Member* const saved = t_member;
  if (std::this_thread::get_id() == call->caller) {
    Member& first = t.members[0];
    t_member = &first;
    t.fn(t.data);
    runCoroutines(t);  // to their end
    for (Member* m : t.coroutines) t_coroutines.free.push_back(m->coroutine);
    finish(first);
    t_member = saved;
    spinForever([&] { return t.done.load(std::memory_order_acquire) == t.size; });
    return;
  }
  for (int k = t.next.fetch_add(1, std::memory_order_acq_rel); k < t.size;
       k = t.next.fetch_add(1, std::memory_order_acq_rel)) {
    Member& m = t.members[k];
    t_member = &m;
    g_elsewhere.fetch_add(1, std::memory_order_relaxed);
    t.fn(t.data);
    finish(m);
  }
  t_member = saved;
}

}  // namespace
}  // namespace mydev_detail

using namespace mydev_detail;

extern "C" mydevError_t mydevRunTeam(void (*fn)(void* user_data), void* user_data, int size) {
  if (fn == nullptr || size < 1 || size > kMaxTeam) return mydevErrorInvalidValue;
  Team t;
  t.fn = fn;
  t.data = user_data;
  t.size = size;
  for (int k = 0; k < size; ++k) {
    t.members[k].team = &t;
    t.members[k].index = k;
  }
  Call call{&t, std::this_thread::get_id()};
  if (size == 1) {
    runOnUnit(&call);
  } else {
    runOnComputeUnits(runOnUnit, &call);
  }
  return mydevSuccess;
}

extern "C" int mydevTeamThread(void) {
  return t_member != nullptr ? t_member->index : 0;
}

extern "C" int mydevTeamSize(void) {
  return t_member != nullptr ? t_member->team->size : 1;
}

extern "C" void mydevTeamBarrier(void) {
  if (t_member != nullptr && t_member->team->size > 1) barrier(*t_member);
}

extern "C" int mydevTeamSingle(void) {
  if (t_member == nullptr) return 1;
  // The first team thread to reach its k-th single block moves the count from k - 1 to k.
  int expected = t_member->singles++;
  return t_member->team->singles.compare_exchange_strong(expected, expected + 1, std::memory_order_acq_rel) ? 1 : 0;
}

extern "C" mydevError_t mydevGetTeamCounts(unsigned long long* elsewhere, unsigned long long* switched) {
  if (elsewhere == nullptr || switched == nullptr) return mydevErrorInvalidValue;
  *elsewhere = g_elsewhere.load(std::memory_order_relaxed);
  *switched = g_switched.load(std::memory_order_relaxed);
  return mydevSuccess;
}
