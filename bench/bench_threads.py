"""Intra-op threads and the stream worker: eager training steps at 1 and at N threads, and what mydev's threads
do to CPU work in the same process.

Run: python bench/bench_threads.py [--thread-counts 1,2] [--cases mlp,cnn,transformer] [--repeat R]

Each case of bench_compile.py (a full eager training step) at each thread count runs in a fresh process
(torch.set_num_threads before any work), which times:
  cpu before   CPU's step before any mydev kernel has run in the process;
  mydev        mydev's step;
  cpu after    CPU's step again, taking turns with mydev's (interleaved_samples), as the benchmarks that
               report ratios against CPU measure it.
Printed: the three times (medians) and mydev / cpu before, mydev / cpu after, cpu after / cpu before.
On a machine with as many cores as threads, kernels running with every intra-op thread would share the cores
with the host thread, which keeps dispatching (OpenMP threads of two pools, the host's and the worker's, would
outnumber the cores): mydev's kernels take one thread fewer there (MYDEV_KERNEL_THREADS=torch: every thread,
for the comparison).
"""
import argparse
import copy
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _measure(threads, cases, repeat):
    import torch

    torch.set_num_threads(threads)
    import my_device  # noqa: F401

    sys.path.insert(0, HERE)
    import bench_compile as bc
    from common import interleaved_samples, median_seconds

    sync = torch.mydev.synchronize
    out = {}
    for name in cases:
        model, x, target, opt_cls = bc.build_case(bc.CASES[name][0])
        steps = {}
        for device in ("cpu", "mydev"):
            m = copy.deepcopy(model).to(device)
            opt = opt_cls(m.parameters(), lr=1e-3)
            steps[device] = bc._step_fn(m, opt, x.to(device), None if target is None else target.to(device), None,
                                        False)
        inner = 10
        # Before: no mydev kernel has run yet (the mydev model's parameters were only copied there).
        before = median_seconds(steps["cpu"], inner, repeat)
        samples = interleaved_samples({"mydev": (steps["mydev"], sync), "cpu": (steps["cpu"], lambda: None)}, inner,
                                      repeat)
        out[name] = {"cpu before": before * 1e3, "mydev": statistics.median(samples["mydev"]) * 1e3,
                     "cpu after": statistics.median(samples["cpu"]) * 1e3}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--thread-counts", default="1,2")
    p.add_argument("--cases", default="mlp,cnn,transformer")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    cases = args.cases.split(",")
    if args.worker is not None:
        print(json.dumps(_measure(args.worker, cases, args.repeat)))
        return
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, --repeat {args.repeat}")
    for threads in (int(t) for t in args.thread_counts.split(",")):
        for case in cases:
            r = subprocess.run([sys.executable, __file__, "--worker", str(threads), "--cases", case, "--repeat",
                                str(args.repeat)], capture_output=True, text=True, check=True)
            name, t = next(iter(json.loads(r.stdout.strip().splitlines()[-1]).items()))
            print(f"{threads} thread(s) {name:12s} cpu before {t['cpu before']:7.3f} ms  mydev {t['mydev']:7.3f} ms"
                  f"  cpu after {t['cpu after']:7.3f} ms   mydev/cpu before {t['mydev'] / t['cpu before']:.2f}x"
                  f"  mydev/cpu after {t['mydev'] / t['cpu after']:.2f}x"
                  f"  cpu after/before {t['cpu after'] / t['cpu before']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
