"""Launch overhead of small ops and small training steps: mydev against CPU, in one process.

Run: python bench/bench_launch.py [--threads N] [--repeat R] [--sections add,ops,top,steps] [--breakdown]
     python bench/bench_launch.py --sections add --runs 10 --interval 180   (the add loop, spread out)

Sections (each prints the median time per call on each device and the ratio mydev/CPU; lower is
better). The two devices take turns in rounds of a few milliseconds, each round synchronised at its
end, and the ratio is the median over rounds of the two times of the same round (common.paired_ratio):
the machine's speed changes within milliseconds, and a round's two samples share its period.
  add    the 1-element add loop: 90 rounds of 2,000 calls of a + b per device
  ops    a table of ops on (4, 16) float32 inputs (the optimizer's foreach ops on
         four 16x16 tensors, as an optimizer step calls them)
  top    the 20 aten ops most called by the demo's training step (SmallNet, AdamW) and a
         transformer layer's (nn.TransformerEncoderLayer(128, 4, 256), SGD), each replayed
         with the arguments of its first call in that step (recorded on CPU)
  steps  whole training steps: tiny (Linear(16,16)-Tanh-Linear(16,4), batch 4, AdamW), the
         demo's SmallNet, an MLP, a small CNN and the transformer layer
--breakdown adds, per op of `ops`, where the host time of mydev's generic host-kernel path goes
(my_device._C._host_kernel_breakdown): finding the device, the plan, the call key, the Meta cache,
the outputs, the kernel's own references, the launch. Ops with kernels of their own (structured
pointwise ops, mm) do not take that path and show no stages.
Targets: every op and the add loop <= 1.15x, the tiny step <= 1.15x, the larger steps <= 1.0x.
Run it with MYDEV_LAUNCH_BLOCKING=1 too, for the synchronous figures.
"""
import copy
import datetime
import os
import statistics
import time
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

import my_device  # noqa: F401
from common import interleaved_samples, paired_ratio, parse_args


DEVICES = ("cpu", "mydev")


def _sync(device):
    return torch.mydev.synchronize if device == "mydev" else (lambda: None)


def _measure(cases, inner, rounds):
    """{device: median seconds per call}, and the median over rounds of mydev's time over CPU's in the
    same round (common.paired_ratio)."""
    samples = interleaved_samples(cases, inner, rounds)
    return {d: statistics.median(v) for d, v in samples.items()}, paired_ratio(samples, "mydev", "cpu")


def _ratio_line(name, times, ratio, extra=""):
    print(f"{name:<40} cpu {times['cpu'] * 1e6:9.2f} us   mydev {times['mydev'] * 1e6:9.2f} us   "
          f"ratio {ratio:5.2f}x{extra}", flush=True)
    return ratio


# -- the add loop ---------------------------------------------------------------------------------

def _threads():
    """Per thread of this process (Linux): name -> (voluntary, involuntary context switches, last CPU)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            with open(f"/proc/self/task/{tid}/stat") as f:
                cpu = int(f.read().rsplit(")", 1)[1].split()[36])
        except (OSError, ValueError, IndexError):
            continue
        name = status["Name"].strip() + ("" if int(tid) != os.getpid() else " (host)")
        out[name] = (int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]), cpu)
    return out


def _cpu_times():
    """Per CPU (Linux /proc/stat): (busy, steal) jiffies."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *v = line.split()
                v = [int(x) for x in v]
                out[name] = (sum(v[:3]) + sum(v[4:7]), v[7] if len(v) > 7 else 0)
    return out


def add_loop(args):
    for run in range(args.runs):
        if run:
            time.sleep(args.interval)
        operands = {device: (torch.randn(1, device=device), torch.randn(1, device=device)) for device in DEVICES}
        before, cpu_before = _threads(), _cpu_times()
        times, ratio = _measure({d: (lambda a=a, b=b: a + b, _sync(d)) for d, (a, b) in operands.items()},
                                2000, args.repeat * 10)
        after, cpu_after = _threads(), _cpu_times()
        stamp = datetime.datetime.now().strftime("%H:%M:%S")
        _ratio_line(f"add, 1 element, run {run + 1} at {stamp}", times, ratio)
        if args.threads_report:
            # Where the host/worker hand-off stands: a worker that sleeps between launches shows
            # voluntary switches; host and worker sharing one CPU show up in the last-CPU column.
            for name in sorted(after):
                if name.startswith("mydev") or name.endswith("(host)"):
                    v0, n0, _ = before.get(name, (0, 0, -1))
                    v, n, cpu = after[name]
                    print(f"    {name:<24} voluntary switches {v - v0:7d}, involuntary {n - n0:6d}, last on CPU {cpu}")
            # Time the machine's CPUs spent busy (all processes) and stolen by the hypervisor.
            print("    " + ", ".join(f"{c} busy {cpu_after[c][0] - cpu_before[c][0]} steal "
                                     f"{cpu_after[c][1] - cpu_before[c][1]} jiffies" for c in sorted(cpu_after)))


# -- the table of small ops ---------------------------------------------------------------------

def _table_inputs(device):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(device)

    return {"a": r(4, 16), "b": r(4, 16), "w": r(16, 16), "bias": r(16),
            "target": torch.randint(0, 16, (4,), generator=g).to(device),
            "params": [r(16, 16) for _ in range(4)], "grads": [r(16, 16) for _ in range(4)]}


TABLE = {
    "add": lambda d: torch.add(d["a"], d["b"]),
    "tanh": lambda d: torch.tanh(d["a"]),
    "sum": lambda d: d["a"].sum(),
    "log_softmax": lambda d: torch.log_softmax(d["a"], 1),
    "_foreach_add_": lambda d: torch._foreach_add_(d["params"], d["grads"]),
    "_foreach_lerp_ (AdamW)": lambda d: torch._foreach_lerp_(d["params"], d["grads"], 0.1),
    "clamp": lambda d: torch.clamp(d["a"], -1, 1),
    "zeros_like": lambda d: torch.zeros_like(d["a"]),
    "nll_loss": lambda d: F.nll_loss(d["a"], d["target"]),
    "where": lambda d: torch.where(d["a"] > 0, d["a"], d["b"]),
    "addmm": lambda d: torch.addmm(d["bias"], d["a"], d["w"]),
    "mul_": lambda d: d["a"].mul_(1.0),
}


def _stages(totals, calls):
    parts = [f"{k} {v / calls / 1e3:.2f}" for k, v in totals if k not in ("queued", "inline") and v]
    counts = dict(totals)
    return (f"   [{', '.join(parts)} us; {counts['queued'] / calls:.0f} queued, "
            f"{counts['inline'] / calls:.0f} at the call per op]") if parts else ""


def table(args):
    ratios = []
    for name, fn in TABLE.items():
        inputs = {device: _table_inputs(device) for device in DEVICES}
        times, ratio = _measure({dev: (lambda d=d: fn(d), _sync(dev)) for dev, d in inputs.items()}, 500,
                                args.repeat * 4)
        extra = ""
        if args.breakdown:
            torch.mydev.synchronize()
            my_device._C._host_kernel_breakdown(True)
            for _ in range(2000):
                fn(inputs["mydev"])
            torch.mydev.synchronize()
            extra = _stages(my_device._C._host_kernel_breakdown(False), 2000)
        ratios.append(_ratio_line(name, times, ratio, extra))
    return ratios


# -- the most called ops of two training steps ---------------------------------------------------

class _Recorder(TorchDispatchMode):
    """Counts the aten ops a step dispatches and keeps the arguments of each one's first call."""

    def __init__(self):
        super().__init__()
        self.counts, self.first = Counter(), {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = str(func)
        self.counts[key] += 1
        if key not in self.first:
            clone = lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x  # noqa: E731
            self.first[key] = (func, tree_map(clone, args), tree_map(clone, kwargs))
        return func(*args, **kwargs)


def _train_step(model, opt, x, target):
    opt.zero_grad(set_to_none=True)
    out = model(x)
    loss = F.cross_entropy(out, target) if target is not None else (out * out).mean()
    loss.backward()
    opt.step()


def _demo():
    from my_device.demo import SmallNet
    g = torch.Generator().manual_seed(0)
    return SmallNet(), torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g), \
        lambda p: torch.optim.AdamW(p, lr=1e-2)


def _transformer():
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True), torch.randn(8, 32, 128), None, \
        lambda p: torch.optim.SGD(p, lr=1e-2)


def _tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)), torch.randn(4, 16), \
        torch.randint(0, 4, (4,)), lambda p: torch.optim.AdamW(p, lr=1e-2)


def _mlp():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
    return m, torch.randn(64, 256), torch.randint(0, 10, (64,)), lambda p: torch.optim.SGD(p, lr=1e-2)


def _cnn():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                      nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    return m, torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)), lambda p: torch.optim.SGD(p, lr=1e-2)


def _record(build):
    model, x, target, make_opt = build()
    opt = make_opt(model.parameters())
    _train_step(model, opt, x, target)  # (optimizer state exists from here on)
    recorder = _Recorder()
    with recorder:
        _train_step(model, opt, x, target)
    return recorder


def top(args):
    counts, first = Counter(), {}
    for build in (_demo, _transformer):
        rec = _record(build)
        counts.update(rec.counts)
        for k, v in rec.first.items():
            first.setdefault(k, v)
    ratios = []
    for name, calls in counts.most_common(20):
        func, cargs, ckwargs = first[name]
        cases = {}
        for device in DEVICES:
            move = lambda x, device=device: x.to(device) if isinstance(x, torch.Tensor) else x  # noqa: E731
            a, k = tree_map(move, cargs), tree_map(move, ckwargs)
            if "device" in k:
                k["device"] = torch.device(device)
            cases[device] = (lambda a=a, k=k: func(*a, **k), _sync(device))
        times, ratio = _measure(cases, 250, args.repeat * 2)
        ratios.append(_ratio_line(f"{name} ({calls} calls)", times, ratio))
    return ratios


# -- whole steps -----------------------------------------------------------------------------------

STEPS = {"tiny": (_tiny, 300), "demo": (_demo, 30), "mlp": (_mlp, 20), "cnn": (_cnn, 10),
         "transformer": (_transformer, 10)}


def steps(args):
    ratios = []
    for name, (build, inner) in STEPS.items():
        model, x, target, make_opt = build()
        cases = {}
        for device in DEVICES:
            m = copy.deepcopy(model).to(device)
            opt = make_opt(m.parameters())
            xd, td = x.to(device), target.to(device) if target is not None else None
            cases[device] = (lambda m=m, opt=opt, xd=xd, td=td: _train_step(m, opt, xd, td), _sync(device))
        times, ratio = _measure(cases, inner, args.repeat)
        ratios.append(_ratio_line(f"{name} training step", times, ratio))
    return ratios


SECTIONS = {"add": add_loop, "ops": table, "top": top, "steps": steps}


def main():
    def extra(p):
        p.add_argument("--sections", default="add,ops,top,steps")
        p.add_argument("--breakdown", action="store_true", help="per-stage host time of the generic path")
        p.add_argument("--runs", type=int, default=1, help="add section: how many runs")
        p.add_argument("--interval", type=float, default=0.0, help="add section: seconds between runs")
        p.add_argument("--threads-report", action="store_true",
                       help="add section: the host's and workers' context switches and CPUs per run")

    args = parse_args(__doc__, repeat=9, extra=extra)
    for section in args.sections.split(","):
        print(f"-- {section}", flush=True)
        SECTIONS[section](args)


if __name__ == "__main__":
    main()
