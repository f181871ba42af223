"""The runtime against CPU, in one process: allocator cost, pinned-memory bandwidth, launch latency.

Run: python bench/bench_runtime.py
- cached allocation + free through the device allocator, timed in C++ (target <= 0.5 us);
- the launch path's own cost with an empty kernel, timed in C++: queued (launch_async, the queue
  drained at the end), and run at the call on an idle stream (the idle check and launch_if_idle,
  what every short op pays);
- H2D and D2H copies from/to pinned memory, as bandwidth relative to a CPU clone of the same
  bytes (target >= 0.8x);
- 1-element add latency against CPU, with the default launch mode and with
  MYDEV_LAUNCH_BLOCKING=1 (measured in a child process, since the runtime reads it once);
- 1-element add latency (launch to stream synchronised) on a high-priority stream while a
  normal stream has a long queue of work, against the same on a normal-priority stream.
  Each stream has its own worker, so the normal-priority op never waits for the queue
  itself; what priority saves is the queue's worker competing for the cores;
- a host running ahead: 200 queued clamps of a 4 MiB tensor with no synchronisation between
  them, against the same with a sync every 8 ops and against CPU; with the peak memory
  reserved above what was reserved before, which stream-ordered reuse keeps at a few blocks (KernelArgs.h)."""
import os
import statistics
import subprocess
import sys
import time

import torch

import my_device
from common import median_seconds, parse_args


def allocator():
    ns = statistics.median(my_device._C._bench_cached_allocation(200_000, 4096) for _ in range(5))
    print(f"cached allocation + free (4 KiB)      {ns / 1000:8.3f} us")


def launches():
    queued = statistics.median(my_device._C._bench_empty_launches(100_000) for _ in range(5))
    at_call = statistics.median(my_device._C._bench_idle_launches(200_000) for _ in range(5))
    print(f"empty kernel, queued                  {queued / 1000:8.3f} us")
    print(f"empty kernel, at the call             {at_call / 1000:8.3f} us")


def bandwidth():
    n = 64 << 20  # bytes
    host = torch.empty(n, dtype=torch.uint8).random_().pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device="mydev")
    back = torch.empty(n, dtype=torch.uint8).pin_memory()
    sync = torch.mydev.synchronize
    t_clone = median_seconds(lambda: host.clone(), 3)
    t_h2d = median_seconds(lambda: dev.copy_(host, non_blocking=True), 3, sync=sync)
    t_d2h = median_seconds(lambda: back.copy_(dev, non_blocking=True), 3, sync=sync)
    gbs = lambda t: n / t / 1e9
    print(f"CPU clone of 64 MiB                   {gbs(t_clone):8.2f} GB/s")
    print(f"H2D from pinned                       {gbs(t_h2d):8.2f} GB/s   ratio {t_clone / t_h2d:5.2f}x of CPU clone")
    print(f"D2H to pinned                         {gbs(t_d2h):8.2f} GB/s   ratio {t_clone / t_d2h:5.2f}x of CPU clone")


LATENCY = """
import torch, my_device
from common import median_seconds, parse_args
torch.set_num_threads(1)
a, b = torch.randn(1), torch.randn(1)
da, db = a.to("mydev"), b.to("mydev")
print(median_seconds(lambda: a + b, 20000), median_seconds(lambda: da + db, 20000, sync=torch.mydev.synchronize))
"""


def latency():
    for mode, env in (("default launches", {}), ("MYDEV_LAUNCH_BLOCKING=1", {"MYDEV_LAUNCH_BLOCKING": "1"})):
        out = subprocess.run([sys.executable, "-c", LATENCY], env={**os.environ, **env},
                             cwd=os.path.dirname(os.path.abspath(__file__)),
                             capture_output=True, text=True, check=True).stdout.split()
        cpu, dev = float(out[0]), float(out[1])
        print(f"1-element add, {mode:<24} cpu {cpu * 1e6:6.2f} us  mydev {dev * 1e6:6.2f} us  "
              f"ratio {dev / cpu:5.2f}x")


def priority(samples=41, queue=64):
    busy = torch.mydev.Stream()
    work = torch.randn(1 << 20, device="mydev")
    a, b = torch.randn(1, device="mydev"), torch.randn(1, device="mydev")
    streams = {"normal": torch.mydev.Stream(priority=0), "high": torch.mydev.Stream(priority=-1)}
    times = {name: [] for name in streams}
    torch.mydev.synchronize()
    for i in range(samples):
        # Alternated, so both see the same machine.
        for name in (("normal", "high") if i % 2 else ("high", "normal")):
            with torch.mydev.stream(busy):
                for _ in range(queue):
                    work.add_(1)
            start = time.perf_counter()
            with torch.mydev.stream(streams[name]):
                a + b
            streams[name].synchronize()
            times[name].append(time.perf_counter() - start)
            busy.synchronize()
    normal, high = statistics.median(times["normal"]), statistics.median(times["high"])
    print(f"1-element add beside a {queue}-op queue   normal {normal * 1e6:8.2f} us  "
          f"high priority {high * 1e6:8.2f} us  ratio high/normal {high / normal:5.2f}x")


def run_ahead(ops=200, n=1 << 20, samples=5):
    x = torch.randn(n)
    d = x.to("mydev")

    def loop(src, sync_every):
        for i in range(ops):
            src.clamp(-0.5, 0.5)
            if sync_every and i % sync_every == 0:
                torch.mydev.synchronize()
        torch.mydev.synchronize()

    def timed(src, sync_every):
        loop(src, sync_every)  # warm-up (the first calls plan the op and run its Meta kernel)
        torch.mydev.synchronize()
        torch.mydev.empty_cache()
        torch.mydev.reset_peak_memory_stats()
        base = torch.mydev.memory_reserved()
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            loop(src, sync_every)
            times.append((time.perf_counter() - start) / ops)
        return statistics.median(times), (torch.mydev.max_memory_reserved() - base) / 2**20

    cpu, _ = timed(x, 0)
    ahead, ahead_mib = timed(d, 0)
    synced, synced_mib = timed(d, 8)
    print(f"{ops} clamps of 4 MiB, no sync          cpu {cpu * 1e6:8.1f} us  mydev {ahead * 1e6:8.1f} us  "
          f"ratio {ahead / cpu:5.2f}x  reserved +{ahead_mib:.0f} MiB")
    print(f"{ops} clamps of 4 MiB, sync every 8     cpu {cpu * 1e6:8.1f} us  mydev {synced * 1e6:8.1f} us  "
          f"ratio {synced / cpu:5.2f}x  reserved +{synced_mib:.0f} MiB")


if __name__ == "__main__":
    parse_args(__doc__, repeat=5)  # (medians of fixed repetitions: --repeat is not used)
    allocator()
    launches()
    bandwidth()
    latency()
    priority()
    run_ahead()
