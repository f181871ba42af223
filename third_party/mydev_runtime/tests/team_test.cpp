// Teams (mydevRunTeam): threads that wait for each other, whichever compute
// unit runs each.
#include "runtime_tests.h"

namespace rt {
namespace {

// Each team thread writes its cell of a phase, waits, then checks every cell
// of the phase: a barrier that let a thread through early fails the check.
struct TeamRun {
  int size = 0;
  int phases = 3;
  unsigned first_delay_us = 0;  // team thread 0's, before its first wait
  std::vector<int> cells;
  std::atomic<int> ran[64] = {};
  std::atomic<int> singles{0};
  std::atomic<bool> ok{true};
};

void teamBody(void* data) {
  TeamRun& r = *static_cast<TeamRun*>(data);
  const int me = mydevTeamThread(), n = mydevTeamSize();
  if (n != r.size || me < 0 || me >= n) {
    r.ok = false;
    return;
  }
  r.ran[me].fetch_add(1);
  for (int phase = 0; phase < r.phases; ++phase) {
    r.cells[phase * n + me] = phase * 100 + me;
    if (me == 0 && phase == 0 && r.first_delay_us > 0) usleep(r.first_delay_us);
    mydevTeamBarrier();
    for (int k = 0; k < n; ++k) {
      if (r.cells[phase * n + k] != phase * 100 + k) r.ok = false;
    }
    if (mydevTeamSingle()) r.singles.fetch_add(1);
    mydevTeamBarrier();
  }
}

void checkRun(TeamRun& r) {
  CHECK(r.ok.load());
  for (int k = 0; k < r.size; ++k) CHECK(r.ran[k].load() == 1);
  CHECK(r.singles.load() == r.phases);
}

void runTeam(TeamRun& r, int size) {
  r.size = size;
  r.cells.assign(static_cast<size_t>(r.phases * size), -1);
  CHECK_OK(mydevRunTeam(teamBody, &r, size));
}

TeamRun* g_launched = nullptr;
int g_launched_size = 0;
int runTeamKernel(void*) {
  runTeam(*g_launched, g_launched_size);
  return 0;
}

// A team whose threads each run a team of their own.
std::atomic<bool> g_nested_ok{true};
void nestedBody(void*) {
  TeamRun inner;
  inner.size = 3;
  inner.cells.assign(static_cast<size_t>(inner.phases * 3), -1);
  const int outer = mydevTeamThread();
  if (mydevRunTeam(teamBody, &inner, 3) != mydevSuccess || !inner.ok.load() || inner.singles.load() != inner.phases) {
    g_nested_ok = false;
  }
  if (mydevTeamThread() != outer || mydevTeamSize() != 2) g_nested_ok = false;  // the outer team's again
  mydevTeamBarrier();
}
int runNestedKernel(void*) {
  return mydevRunTeam(nestedBody, nullptr, 2) == mydevSuccess ? 0 : 1;
}

void counts(unsigned long long& elsewhere, unsigned long long& switched) {
  CHECK_OK(mydevGetTeamCounts(&elsewhere, &switched));
}

}  // namespace

void testTeams() {
  CHECK_ERR(mydevRunTeam(nullptr, nullptr, 2), mydevErrorInvalidValue);
  CHECK_ERR(mydevRunTeam(teamBody, nullptr, 0), mydevErrorInvalidValue);
  CHECK_ERR(mydevRunTeam(teamBody, nullptr, 65), mydevErrorInvalidValue);
  CHECK_ERR(mydevGetTeamCounts(nullptr, nullptr), mydevErrorInvalidValue);
  // Outside a team: thread 0 of 1, every single block its own, no wait.
  CHECK(mydevTeamThread() == 0 && mydevTeamSize() == 1 && mydevTeamSingle() != 0);
  mydevTeamBarrier();

  int units = 0, asked = 0;
  CHECK_OK(mydevGetComputeUnits(&units, &asked));
  unsigned long long elsewhere0, switched0, elsewhere1, switched1;

  // Outside a launched function the calling thread runs the whole team.
  counts(elsewhere0, switched0);
  {
    TeamRun r;
    runTeam(r, 3);
    checkRun(r);
  }
  counts(elsewhere1, switched1);
  CHECK(elsewhere1 == elsewhere0 && switched1 == switched0 + 2);

  mydevStream_t s = newStream();
  // In a launched function, with time for a free unit to take team thread 1
  // before thread 0 waits: it does when the device has a second unit.
  for (int size : {2, 5}) {
    TeamRun r;
    r.first_delay_us = 20000;
    g_launched = &r;
    g_launched_size = size;
    counts(elsewhere0, switched0);
    CHECK_OK(mydevLaunchHostFuncLabeled(s, runTeamKernel, nullptr, "team"));
    CHECK_OK(mydevStreamSynchronize(s));
    checkRun(r);
    counts(elsewhere1, switched1);
    CHECK(elsewhere1 - elsewhere0 + switched1 - switched0 == static_cast<unsigned long long>(size - 1));
    if (units == 1) CHECK(elsewhere1 == elsewhere0);
    if (units >= 2 && !launchBlocking()) CHECK(elsewhere1 > elsewhere0);
  }
  // Many short teams: the same results however their threads are spread.
  for (int round = 0; round < 200; ++round) {
    TeamRun r;
    r.phases = 2;
    g_launched = &r;
    g_launched_size = 2 + round % 3;
    CHECK_OK(mydevLaunchHostFuncLabeled(s, runTeamKernel, nullptr, "team"));
    CHECK_OK(mydevStreamSynchronize(s));
    checkRun(r);
  }
  g_launched = nullptr;
  // A team inside a team thread: its own threads, then the outer team's index again.
  CHECK_OK(mydevLaunchHostFuncLabeled(s, runNestedKernel, nullptr, "nested teams"));
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(g_nested_ok.load());
  CHECK_OK(mydevStreamDestroy(s));
}

}  // namespace rt
