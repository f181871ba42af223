"""Lazy tensors on mydev (my_device.lazy) against eager mydev, in one process.

Run: python bench/bench_lazy.py [--threads N] [--repeat R]
Case: the tiny training step (Linear(16,16)-Tanh-Linear(16,4), batch 4, SGD) with mark_step() each
step, in steady state (its graph compiled). Reported separately: the time to trace a step (the Python
calls that record the graph, without mark_step) and the time of mark_step (hashing the graph, its
execution as one launch, and waiting for it). Target: the lazy step <= 1.0x eager mydev.
Then the same model with AdamW and cross_entropy on class targets (batch 4, 4 classes): the step's
time lazily and eagerly, and the lazy backend's metrics (fallbacks, graphs compiled) over those steps.
"""
import copy
import time

import torch
import torch._lazy
from torch import nn

import my_device  # noqa: F401
import my_device.lazy as ml
from common import median_seconds, parse_args


def main():
    args = parse_args(__doc__, repeat=9)
    ml.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(4, 16)
    lazy_model = copy.deepcopy(model).to("lazy")
    eager = model.to("mydev")
    xe, xl = x.to("mydev"), x.to("lazy")
    opt_e = torch.optim.SGD(eager.parameters(), lr=1e-3)
    opt_l = torch.optim.SGD(lazy_model.parameters(), lr=1e-3)

    def eager_step():
        opt_e.zero_grad()
        eager(xe).sum().backward()
        opt_e.step()

    def trace():
        opt_l.zero_grad()
        lazy_model(xl).sum().backward()
        opt_l.step()

    def lazy_step():
        trace()
        torch._lazy.mark_step()

    for _ in range(3):
        lazy_step()
    eager_s = median_seconds(eager_step, 300, args.repeat, torch.mydev.synchronize)
    lazy_s = median_seconds(lazy_step, 300, args.repeat, torch.mydev.synchronize)
    trace_times, step_times = [], []
    for _ in range(300):
        start = time.perf_counter()
        trace()
        mid = time.perf_counter()
        torch._lazy.mark_step()
        torch.mydev.synchronize()
        trace_times.append(mid - start)
        step_times.append(time.perf_counter() - mid)
    trace_times.sort()
    step_times.sort()
    print(f"eager mydev step {eager_s * 1e3:7.3f} ms   lazy step {lazy_s * 1e3:7.3f} ms   ratio {lazy_s / eager_s:5.2f}x")
    print(f"  of the lazy step: tracing {trace_times[150] * 1e3:7.3f} ms, mark_step (hash, run, wait) "
          f"{step_times[150] * 1e3:7.3f} ms (medians)")
    print(f"  {ml.metrics()}")
    adamw(args.repeat)


def adamw(repeat):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    x, y = torch.randn(4, 16), torch.tensor([0, 1, 2, 3])
    steps = {}
    for device in ("mydev", "lazy"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        xd, yd = x.to(device), y.to(device)

        def step(m=m, opt=opt, xd=xd, yd=yd, lazy=device == "lazy"):
            opt.zero_grad()
            nn.functional.cross_entropy(m(xd), yd).backward()
            opt.step()
            if lazy:
                torch._lazy.mark_step()

        for _ in range(3):
            step()
        steps[device] = step
    before = ml.metrics()
    eager_s = median_seconds(steps["mydev"], 100, repeat, torch.mydev.synchronize)
    lazy_s = median_seconds(steps["lazy"], 100, repeat, torch.mydev.synchronize)
    after = ml.metrics()
    runs = after["executions"] - before["executions"]
    print(f"AdamW + cross_entropy: eager mydev step {eager_s * 1e3:7.3f} ms   lazy step {lazy_s * 1e3:7.3f} ms   "
          f"ratio {lazy_s / eager_s:5.2f}x")
    print(f"  over {runs} lazy steps: {after['fallback_ops'] - before['fallback_ops']} fallbacks, "
          f"{after['graphs_compiled'] - before['graphs_compiled']} graphs compiled, "
          f"{after['cache_hits'] - before['cache_hits']} cache hits")


if __name__ == "__main__":
    main()
