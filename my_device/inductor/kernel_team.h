// Prepended to a kernel Inductor generates for mydev when the device's kernels
// run their parallel loops on its compute units (kernels.py, team_threads()).
//
// Why: Inductor writes a kernel's parallel loops as an OpenMP region of
// num_threads(N). Run on a stream's worker by libgomp, that is a second
// OpenMP team besides the host's, and two teams on the same cores took turns
// (the CPU's own eager step ran 2.3 times slower beside one); written for one
// thread, the kernel left the device's second unit idle. These definitions,
// hidden in the kernel's own library, take the calls the compiler makes for
// the region's pragmas (parallel, for's and single's waits, the thread
// queries) and run the region as a team of N on the device's compute units
// (mydevRunTeam, mydev_emulator.h): the same split of the loops, so the same
// bits, whether one unit or several run it. A kernel that needs an OpenMP
// entry point not defined here binds it to libgomp instead, which
// test_inductor.py checks no mydev kernel does.
#pragma once
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace mydev_team {

struct Api {
  int (*run)(void (*)(void*), void*, int);
  int (*thread)();
  int (*size)();
  void (*barrier)();
  int (*single)();
  int units = 1;  // the device's compute units: the team size of a region that names none
};

// The runtime is loaded before any kernel (my_device._C links it); the kernel finds it by the name _C asked for.
inline Api load() {
  void* runtime = dlopen("libmydev_runtime.so", RTLD_NOW | RTLD_NOLOAD);
  Api api{};
  if (runtime != nullptr) {
    api.run = reinterpret_cast<int (*)(void (*)(void*), void*, int)>(dlsym(runtime, "mydevRunTeam"));
    api.thread = reinterpret_cast<int (*)()>(dlsym(runtime, "mydevTeamThread"));
    api.size = reinterpret_cast<int (*)()>(dlsym(runtime, "mydevTeamSize"));
    api.barrier = reinterpret_cast<void (*)()>(dlsym(runtime, "mydevTeamBarrier"));
    api.single = reinterpret_cast<int (*)()>(dlsym(runtime, "mydevTeamSingle"));
    auto units = reinterpret_cast<int (*)(int*, int*)>(dlsym(runtime, "mydevGetComputeUnits"));
    int asked = 0;
    if (units == nullptr || units(&api.units, &asked) != 0) api.units = 0;
  }
  if (api.run == nullptr || api.thread == nullptr || api.size == nullptr || api.barrier == nullptr ||
      api.single == nullptr || api.units < 1) {
    std::fprintf(stderr, "mydev kernel: the mydev runtime's team calls were not found (%s)\n", dlerror());
    std::abort();
  }
  return api;
}

inline const Api& api() {
  static const Api loaded = load();
  return loaded;
}

}  // namespace mydev_team

#define MYDEV_TEAM_ENTRY extern "C" __attribute__((visibility("hidden")))

MYDEV_TEAM_ENTRY void GOMP_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned) {
  // (0: the region names no count, as a GEMM template's does when written for every core.)
  mydev_team::api().run(fn, data, threads == 0 ? mydev_team::api().units : static_cast<int>(threads));
}
MYDEV_TEAM_ENTRY void GOMP_barrier() {
  mydev_team::api().barrier();
}
MYDEV_TEAM_ENTRY bool GOMP_single_start() {
  return mydev_team::api().single() != 0;
}
MYDEV_TEAM_ENTRY int omp_get_thread_num() noexcept {
  return mydev_team::api().thread();
}
MYDEV_TEAM_ENTRY int omp_get_num_threads() noexcept {
  return mydev_team::api().size();
}
MYDEV_TEAM_ENTRY int omp_get_max_threads() noexcept {
  return mydev_team::api().units;
}
