"""torch.compile on mydev, both ways in (Inductor, and backend="mydev"), against eager mydev and
eager CPU, in one process.

Run: python bench/bench_compile.py [--threads N] [--repeat R] [--cases tiny,mlp,...]

Cases (each a full training step: forward, backward, optimizer step):
  tiny   Linear(16,16)-Tanh-Linear(16,4), batch 4, AdamW (a launch-bound step)
  mlp    Linear(256,512)-GELU-Linear(512,512)-GELU-Linear(512,10), batch 64, SGD
  cnn    two 3x3 convolutions with ReLU and max pooling, batch 8 at 32x32, SGD
  transformer  nn.TransformerEncoderLayer(128, 4 heads, 256), batch 8 x 32 tokens, SGD
  gpt    a nanoGPT-style language model (2 blocks of causal self-attention through
         scaled_dot_product_attention and a GELU MLP, embedding 128, 4 heads, block 64, vocabulary 256),
         batch 8 x 64 tokens, cross_entropy over every position, AdamW

For each: the time per step of eager CPU, CPU with the model compiled by Inductor, eager mydev,
mydev compiled by Inductor, mydev compiled by the mydev backend, and the latter with the optimizer
step compiled too. Printed: Inductor's speed-up (eager / compiled) on mydev beside CPU's, and the
mydev backend's time against eager mydev and eager CPU. Then the first-call compile time
(forward+backward, fresh caches) of Inductor on mydev and of backend="mydev" against CPU Inductor's.
Targets: Inductor's speed-up on mydev within 10% of CPU's (mlp, cnn, transformer);
tiny step with backend="mydev" <= 0.5x eager mydev and <= 1.0x eager CPU; each compile time
<= 1.5x CPU Inductor's.

--kernels (or --masks) adds single compiled functions, CPU Inductor against Inductor on mydev in one process:
`x <= 0` over 128K floats (a bool mask stored; mydev's kernels store it with the kernel prelude's AVX2 sequence,
CPU's with at::vec's generic path) and its use by `torch.where`; `cat([a.relu(), b.sigmoid()], 1) * 2` on
(256, 1000) inputs and `pad(x.relu(), (0, 3)) + 1` on (512, 509), whose lowering torch picks by device type.

--program-profile prints, instead, each --cases step's programs under backend="mydev" with each program step's
mean time (program.set_profiling): which steps of the compiled step cost what.

--ceiling prints, instead, for each --cases step on mydev (eager, and backend="mydev"), under the profiler with the
device's activity: the step's time, the device's busy time, and the device time of the library calls that both ways
run alike, the same ATen kernel on the same shapes (matrix products, attention, convolutions, pooling, gelu, layer
norm: a program calls them as eager does, and must, to give eager's bits). Their share of eager's step is the least
backend="mydev" / eager mydev can reach by removing everything else: the elementwise passes, the launches, the host.
The programs' other steps (fused groups, copies, other calls) are what fusing better could still remove (an upper
bound: steps run side by side overlap, and their times are summed). The figures are profiled steps, not the
ratios of the timed runs above.

--floor adds the floor of torch.compile's own per-step cost on the tiny step, whatever the backend:
the step compiled (forward+backward, then the optimizer step too) with an aot_autograd backend whose
compiled graphs cost nothing (each returns the outputs of its first run), against eager CPU and
eager mydev in the same process. What remains is Dynamo's guards and frame handling, aot_autograd's
runtime wrappers and mutation epilogue, the autograd engine and the uncompiled rest of the step.
Then torch.compile's layers on mydev one at a time, against eager mydev: Dynamo alone (backend="eager"; then
the optimizer step too), Dynamo and aot_autograd with the graphs run op by op (backend="aot_eager"), and
backend="mydev". (The free graphs' "+opt" skips the optimizer's arithmetic as well, so it is no floor for a
compiled optimizer step; Dynamo alone is.)
"""
import copy
import statistics
import time

import torch
from torch import nn

import my_device  # noqa: F401
from common import interleaved_medians, interleaved_samples, paired_ratio, parse_args


def _tiny():
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)), (4, 16), 4, torch.optim.AdamW


def _mlp():
    m = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
    return m, (64, 256), 10, torch.optim.SGD


def _cnn():
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                      nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    return m, (8, 3, 32, 32), 10, torch.optim.SGD


def _transformer():
    m = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
    return m, (8, 32, 128), None, torch.optim.SGD


class _Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        batch, length, width = x.shape
        heads = [t.view(batch, length, self.heads, -1).transpose(1, 2)
                 for t in self.qkv(self.norm1(x)).split(width, dim=2)]
        attended = nn.functional.scaled_dot_product_attention(*heads, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class _GPT(nn.Module):
    def __init__(self, vocabulary=256, block=64, width=128, heads=4, layers=2):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocabulary, width), nn.Embedding(block, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary, bias=False)

    def forward(self, tokens):
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)).flatten(0, 1)  # (batch * length, vocabulary)


def _gpt():
    def inputs():
        tokens = torch.randint(0, 256, (8, 65))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)

    return _GPT(), inputs, None, torch.optim.AdamW


CONFIGS = (("cpu eager", "cpu", None, False), ("cpu inductor", "cpu", "inductor", False),
           ("mydev eager", "mydev", None, False), ("mydev inductor", "mydev", "inductor", False),
           ("mydev backend", "mydev", "mydev", False), ("mydev backend+opt", "mydev", "mydev", True))

CASES = {"tiny": (_tiny, 300), "mlp": (_mlp, 20), "cnn": (_cnn, 10), "transformer": (_transformer, 10),
         "gpt": (_gpt, 5)}


def build_case(build):
    """A case's model, CPU input and target (None: the loss is the output's mean square) and optimizer class,
    seeded."""
    torch.manual_seed(0)
    model, shape, classes, opt_cls = build()
    if callable(shape):  # the case makes its own input and target
        x, target = shape()
    else:
        x = torch.randn(shape)
        target = torch.randint(0, classes, (shape[0],)) if classes else None
    return model, x, target, opt_cls


def _step_fn(model, opt, x, target, backend, compile_opt):
    fwd = torch.compile(model, backend=backend) if backend else model
    opt_step = torch.compile(opt.step, backend=backend) if compile_opt else opt.step

    def step():
        opt.zero_grad(set_to_none=True)
        out = fwd(x)
        loss = nn.functional.cross_entropy(out, target) if target is not None else (out * out).mean()
        loss.backward()
        opt_step()

    return step


def _case(name, build, inner, repeat):
    """Every configuration's step built first, then timed taking turns (interleaved_samples): the
    ratios are medians of per-round ratios, each of two samples taken back to back."""
    model, x, target, opt_cls = build_case(build)
    torch._dynamo.reset()
    steps = {}
    for label, device, backend, co in CONFIGS:
        m = copy.deepcopy(model).to(device)
        opt = opt_cls(m.parameters(), lr=1e-3)
        step = _step_fn(m, opt, x.to(device), None if target is None else target.to(device), backend, co)
        sync = torch.mydev.synchronize if device == "mydev" else (lambda: None)
        for _ in range(12):  # compiles, the optimizer's state, and the programs' deciding runs (11)
            step()
        sync()
        steps[label] = (step, sync)
    samples = interleaved_samples(steps, inner, repeat)
    times = {k: statistics.median(v) for k, v in samples.items()}
    print(f"{name:<12} " + "  ".join(f"{k} {v * 1e3:.3f} ms" for k, v in times.items()), flush=True)
    cpu_speedup = paired_ratio(samples, "cpu eager", "cpu inductor")
    mydev_speedup = paired_ratio(samples, "mydev eager", "mydev inductor")
    print(f"{'':<12} inductor speed-up: cpu {cpu_speedup:5.2f}x, mydev {mydev_speedup:5.2f}x "
          f"(mydev/cpu {mydev_speedup / cpu_speedup:5.2f});  backend=mydev vs mydev eager "
          f"{paired_ratio(samples, 'mydev backend', 'mydev eager'):5.2f}x "
          f"(+opt {paired_ratio(samples, 'mydev backend+opt', 'mydev eager'):5.2f}x), "
          f"vs cpu eager {paired_ratio(samples, 'mydev backend', 'cpu eager'):5.2f}x "
          f"(+opt {paired_ratio(samples, 'mydev backend+opt', 'cpu eager'):5.2f}x)", flush=True)
    torch._dynamo.reset()


def _kernels():
    """Single compiled functions whose kernels Inductor writes differently by device type, CPU Inductor against
    Inductor on mydev: a bool mask stored and loaded, a cat of computed inputs, a one-sided constant pad."""
    gen = torch.Generator().manual_seed(0)
    x, a, b, p = (torch.randn(shape, generator=gen) for shape in ((128 * 1024,), (256, 1000), (256, 1000), (512, 509)))
    steps = {}
    for device in ("cpu", "mydev"):
        xd, ad, bd, pd = (t.to(device) for t in (x, a, b, p))
        mask = torch.compile(lambda t: t <= 0)(xd)
        cases = {"store": (lambda t: t <= 0, (xd,)), "load": (lambda t, m: torch.where(m, 0.0, t), (xd, mask)),
                 "cat": (lambda u, v: torch.cat([u.relu(), v.sigmoid()], 1) * 2, (ad, bd)),
                 "pad": (lambda t: nn.functional.pad(t.relu(), (0, 3)) + 1, (pd,))}
        sync = torch.mydev.synchronize if device == "mydev" else (lambda: None)
        for kind, (fn, args) in cases.items():
            compiled = torch.compile(fn)
            for _ in range(3):
                compiled(*args)
            steps[f"{device} {kind}"] = (lambda f=compiled, a=args: f(*a), sync)
    samples = interleaved_samples(steps, 20, 7)
    times = {k: statistics.median(v) for k, v in samples.items()}
    print("kernels      " + "  ".join(f"{k} {v * 1e6:.0f} us" for k, v in times.items()), flush=True)
    print(f"{'':<12} mydev/cpu: " + ", ".join(
        f"{kind} {paired_ratio(samples, f'mydev {kind}', f'cpu {kind}'):5.2f}x" for kind in ("store", "load", "cat", "pad")),
        flush=True)


def _free_compiler(gm, example_inputs):
    """A compiled graph that costs (almost) nothing: its first call runs the graph, later calls
    return those same outputs. Only for measuring what surrounds a compiled graph (--floor)."""
    first = []

    def run(*args):
        if not first:
            first.append(gm(*args))
        return first[0]

    return run


def _floor():
    from torch._dynamo.backends.common import aot_autograd

    free = aot_autograd(fw_compiler=_free_compiler, bw_compiler=_free_compiler)
    build, inner = CASES["tiny"]
    torch.manual_seed(0)
    model, shape, classes, opt_cls = build()
    x, target = torch.randn(shape), torch.randint(0, classes, (shape[0],))
    steps = {}
    # On mydev, torch.compile's layers one at a time: Dynamo alone (backend="eager" runs its graph op by op),
    # then aot_autograd too (backend="aot_eager" runs its forward and backward graphs op by op), then mydev's
    # programs in place of those ops.
    for label, device, backend, co in (("cpu eager", "cpu", None, False), ("mydev eager", "mydev", None, False),
                                       ("free graphs", "cpu", free, False), ("free graphs+opt", "cpu", free, True),
                                       ("mydev dynamo", "mydev", "eager", False),
                                       ("mydev dynamo+opt", "mydev", "eager", True),
                                       ("mydev aot_eager", "mydev", "aot_eager", False),
                                       ("mydev backend", "mydev", "mydev", False)):
        torch._dynamo.reset()
        m = copy.deepcopy(model).to(device)
        opt = opt_cls(m.parameters(), lr=1e-3)
        step = _step_fn(m, opt, x.to(device), target.to(device), backend, co)
        for _ in range(3):
            step()
        steps[label] = (step, torch.mydev.synchronize if device == "mydev" else (lambda: None))
    times = interleaved_medians(steps, inner, 7)
    cpu, eager = times["cpu eager"], times["mydev eager"]
    print("floor, tiny: " + "  ".join(f"{k} {v * 1e3:.3f} ms" for k, v in times.items()), flush=True)
    print(f"{'':<12} free graphs vs cpu eager {times['free graphs'] / cpu:5.2f}x (+opt "
          f"{times['free graphs+opt'] / cpu:5.2f}x), vs mydev eager {times['free graphs'] / eager:5.2f}x (+opt "
          f"{times['free graphs+opt'] / eager:5.2f}x)", flush=True)
    print(f"{'':<12} on mydev, vs mydev eager: Dynamo alone {times['mydev dynamo'] / eager:5.2f}x (+opt "
          f"{times['mydev dynamo+opt'] / eager:5.2f}x), with aot_autograd "
          f"{times['mydev aot_eager'] / eager:5.2f}x, backend=mydev {times['mydev backend'] / eager:5.2f}x", flush=True)


_COMPILE_TIME = """
import sys, time, torch, my_device
from torch import nn
backend, device = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)).to(device)
x = torch.randn(4, 16, device=device)
start = time.perf_counter()
out = torch.compile(model, backend=backend)(x)
out.sum().backward()
if device == "mydev":
    torch.mydev.synchronize()
print(time.perf_counter() - start)
"""


def _compile_time(backend, device):
    """First-call forward+backward compile time of the tiny model, in a fresh process with empty
    Inductor caches (in one process, Inductor's in-memory kernel cache would serve a second compile)."""
    import os
    import subprocess
    import sys
    import tempfile

    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(), TORCHINDUCTOR_FX_GRAPH_CACHE="0")
    out = subprocess.run([sys.executable, "-c", _COMPILE_TIME, backend, device], env=env, check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def _program_profiles(cases, steps=30):
    """Each case's step compiled with backend="mydev": the programs' own step profile (program.set_profiling),
    the mean time per step of each program, after 5 warm-up steps."""
    from my_device.compiler import dynamo

    for name in cases:
        torch._dynamo.reset()
        model, x, target, opt_cls = build_case(CASES[name][0])
        model = model.to("mydev")
        x = x.to("mydev")
        target = target.to("mydev") if target is not None else None
        step = _step_fn(model, opt_cls(model.parameters(), lr=1e-3), x, target, "mydev", False)
        dynamo._compiled.clear()
        for _ in range(5):
            step()
        graphs = [g for g in dynamo._compiled if g.lowered is not None]
        for g in graphs:
            g.lowered.program.set_profiling(True)
        for _ in range(steps):
            step()
        torch.mydev.synchronize()
        for g in graphs:
            print(f"== {name}: {g.name}")
            print("\n".join(line for line in g.dump().splitlines() if line.startswith(("step ", "# "))), flush=True)


# ATen kernels both ways run alike; in a program's dump they are "call aten::<name>.out aten::<name>" steps, and
# small products the program's own "gemm" steps
# (my_device::gelu_backward: autograd's gelu backward on mydev, in eager too).
_LIBRARY_CALLS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_flash_attention_for_cpu_backward", "convolution", "convolution_backward",
                  "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "gelu", "gelu_backward",
                  "native_layer_norm", "native_layer_norm_backward")


def _library_call(name):
    base = name.split("::")[-1].split(".")[0]
    return base in _LIBRARY_CALLS


def _ceiling(cases, steps=20, rounds=5):
    """Per case: the eager mydev and backend="mydev" steps, each `rounds` times `steps` steps under the profiler
    (taking turns); medians over rounds of the step's time, the device's busy time (the union of its kernels'
    intervals) and the library calls' device time. A program is one kernel to the profiler: its library calls'
    time comes from its own step profile (program.set_profiling)."""
    import re
    from torch.profiler import ProfilerActivity, profile

    from my_device.compiler import dynamo

    def busy(intervals):
        total, end = 0.0, None
        for s, e in sorted(intervals):
            if end is None or s > end:
                total, end = total + e - s, e
            elif e > end:
                total, end = total + e - end, e
        return total

    for name in cases:
        torch._dynamo.reset()
        dynamo._compiled.clear()
        model, x, target, opt_cls = build_case(CASES[name][0])
        runs = {}
        for label, backend in (("eager", None), ("backend", "mydev")):
            m = copy.deepcopy(model).to("mydev")
            step = _step_fn(m, opt_cls(m.parameters(), lr=1e-3), x.to("mydev"),
                            None if target is None else target.to("mydev"), backend, False)
            for _ in range(12):
                step()
            runs[label] = step
        programs = [g.lowered.program for g in dynamo._compiled if g.lowered is not None]
        for p in programs:
            p.set_profiling(True)
        samples = {label: {"step": [], "busy": [], "library": []} for label in runs}
        for r in range(rounds):
            for label in (runs if r % 2 == 0 else list(runs)[::-1]):
                torch.mydev.synchronize()
                with profile(activities=[ProfilerActivity.PrivateUse1]) as prof:
                    start = time.perf_counter()
                    for _ in range(steps):
                        runs[label]()
                    torch.mydev.synchronize()
                    took = time.perf_counter() - start
                kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
                library = sum(e.time_range.elapsed_us() for e in kernels if _library_call(e.name))
                samples[label]["step"].append(took / steps * 1e3)
                samples[label]["busy"].append(busy((e.time_range.start, e.time_range.end) for e in kernels) / steps / 1e3)
                samples[label]["library"].append(library / steps / 1e3)
        # The programs' library steps: mean times over every profiled run, per run of the step.
        # The programs' other steps (fused groups, copies, the other calls) are all a better compiler could remove.
        in_programs, other = 0.0, 0.0
        for p in programs:
            for line in p.dump().splitlines():
                hit = re.match(r"step \d+: \[([0-9.]+) us\] (call (\w+::[\w.]+)|gemm)?", line)
                if hit and ((hit.group(3) and _library_call(hit.group(3))) or hit.group(2) == "gemm"):
                    in_programs += float(hit.group(1)) / 1e3
                elif hit:
                    other += float(hit.group(1)) / 1e3
        samples["backend"]["library"] = [in_programs] * rounds
        med = {label: {k: statistics.median(v) for k, v in d.items()} for label, d in samples.items()}
        e, b = med["eager"], med["backend"]
        print(f"{name:<12} eager mydev: step {e['step']:.3f} ms, device busy {e['busy']:.3f} ms, library calls "
              f"{e['library']:.3f} ms ({e['library'] / e['step']:.2f} of the step);  backend=mydev: step "
              f"{b['step']:.3f} ms ({b['step'] / e['step']:.2f}x), device busy {b['busy']:.3f} ms, library calls in "
              f"programs {b['library']:.3f} ms", flush=True)
        print(f"{'':<12} least backend=mydev / eager mydev with the library calls as they ran: eager's "
              f"{e['library'] / e['step']:.2f}x, the programs' {b['library'] / e['step']:.2f}x; the programs' other "
              f"steps {other:.3f} ms ({other / e['step']:.2f} of eager's step)", flush=True)


def main():
    def extra(p):
        p.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
        p.add_argument("--floor", action="store_true", help="also the floor of torch.compile's per-step cost")
        p.add_argument("--kernels", "--masks", dest="kernels", action="store_true",
                       help="also single compiled kernels: bool-mask store and load, cat, pad")
        p.add_argument("--first-compile-only", action="store_true",
                       help="only the first-call compile times (fresh processes, empty caches)")
        p.add_argument("--ceiling", action="store_true",
                       help="only each --cases step's device time in library calls both ways run alike")
        p.add_argument("--program-profile", action="store_true",
                       help="only the backend=\"mydev\" programs' step profiles of --cases (program.set_profiling)")

    args = parse_args(__doc__, repeat=7, extra=extra)
    if args.ceiling:
        _ceiling([c for c in args.cases.split(",") if c])
        return
    if args.program_profile:
        _program_profiles([c for c in args.cases.split(",") if c])
        return
    cases = [] if args.first_compile_only else [c for c in args.cases.split(",") if c]  # --cases "": none
    for name in cases:
        build, inner = CASES[name]
        _case(name, build, inner, args.repeat)
    if args.kernels and not args.first_compile_only:
        _kernels()
    if args.floor and not args.first_compile_only:
        # After the cases: run before them, it left the mydev backend's step 1.5x slower (0.83 ms
        # against 0.54 ms for the tiny step, in one run each).
        _floor()
    times = {}
    for label, backend, device in (("cpu inductor", "inductor", "cpu"), ("mydev inductor", "inductor", "mydev"),
                                   ("mydev backend", "mydev", "mydev")):
        times[label] = _compile_time(backend, device)
    cpu_s = times["cpu inductor"]
    print("first call, forward+backward compile of tiny: " + ", ".join(
        f"{k} {v:6.2f} s ({v / cpu_s:4.2f}x)" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
