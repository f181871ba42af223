"""torch.compile(backend="mydev") against eager mydev and eager CPU, in one process.

Run: python bench/bench_mydev_compiler.py [--threads N] [--repeat R]

Cases (each a full training step: forward, backward, optimizer step):
  tiny   Linear(16,16)-Tanh-Linear(16,4), batch 4, AdamW (issue 14's launch-bound step)
  mlp    Linear(256,512)-GELU-Linear(512,512)-GELU-Linear(512,10), batch 64, SGD
  cnn    two 3x3 convolutions with ReLU and max pooling, batch 8 at 32x32, SGD
  transformer  nn.TransformerEncoderLayer(128, 4 heads, 256), batch 8 x 32 tokens, SGD

For each: the time per step of eager CPU, eager mydev, mydev with the model compiled by the mydev
backend, and mydev with the optimizer step compiled too; ratios are against eager CPU (lower is
better) and against eager mydev. Then the first-call compile time of backend="mydev" against CPU
Inductor's on the tiny model (Inductor's C++ compiles; mydev's compiler needs no C++ compiler).
Targets (issue 14): tiny compiled step <= 0.5x eager mydev and <= 1.0x eager CPU; compile time
<= 1.5x CPU Inductor's.
"""
import copy
import time

import torch
from torch import nn

import my_device  # noqa: F401
from common import median_seconds, parse_args


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


CASES = {"tiny": (_tiny, 300), "mlp": (_mlp, 20), "cnn": (_cnn, 10), "transformer": (_transformer, 10)}


def _step_fn(model, opt, x, target, compile_model, compile_opt):
    fwd = torch.compile(model, backend="mydev") if compile_model else model
    opt_step = torch.compile(opt.step, backend="mydev") if compile_opt else opt.step

    def step():
        opt.zero_grad(set_to_none=True)
        out = fwd(x)
        loss = nn.functional.cross_entropy(out, target) if target is not None else (out * out).mean()
        loss.backward()
        opt_step()

    return step


def _case(name, build, inner, repeat):
    torch.manual_seed(0)
    model, shape, classes, opt_cls = build()
    x = torch.randn(shape)
    target = torch.randint(0, classes, (shape[0],)) if classes else None
    times = {}
    for label, device, cm, co in (("cpu eager", "cpu", False, False), ("mydev eager", "mydev", False, False),
                                  ("mydev compiled", "mydev", True, False),
                                  ("mydev compiled+opt", "mydev", True, True)):
        torch._dynamo.reset()
        m = copy.deepcopy(model).to(device)
        opt = opt_cls(m.parameters(), lr=1e-3)
        step = _step_fn(m, opt, x.to(device), None if target is None else target.to(device), cm, co)
        sync = torch.mydev.synchronize if device == "mydev" else (lambda: None)
        for _ in range(3):  # compiles, and the optimizer's state
            step()
        times[label] = median_seconds(step, inner, repeat, sync)
    cpu, eager = times["cpu eager"], times["mydev eager"]
    print(f"{name:<12} " + "  ".join(f"{k} {v * 1e3:8.3f} ms" for k, v in times.items()), flush=True)
    print(f"{'':<12} vs CPU eager: mydev eager {eager / cpu:5.2f}x, compiled {times['mydev compiled'] / cpu:5.2f}x, "
          f"compiled+opt {times['mydev compiled+opt'] / cpu:5.2f}x;  vs mydev eager: compiled "
          f"{times['mydev compiled'] / eager:5.2f}x, compiled+opt {times['mydev compiled+opt'] / eager:5.2f}x",
          flush=True)


def _compile_time(backend, device):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, shape, _, _ = _tiny()
    model = model.to(device)
    x = torch.randn(shape, device=device)
    start = time.perf_counter()
    out = torch.compile(model, backend=backend)(x)
    out.sum().backward()
    if device == "mydev":
        torch.mydev.synchronize()
    return time.perf_counter() - start


def main():
    args = parse_args(__doc__, repeat=7)
    for name, (build, inner) in CASES.items():
        _case(name, build, inner, args.repeat)
    # Inductor's caches would make its second compile free: a fresh cache directory each time.
    import tempfile
    import os

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
    torch._inductor.config.fx_graph_cache = False
    mydev_s = _compile_time("mydev", "mydev")
    inductor_s = _compile_time("inductor", "cpu")
    print(f"first call, forward+backward compile: mydev backend {mydev_s:6.2f} s, CPU inductor {inductor_s:6.2f} s, "
          f"ratio {mydev_s / inductor_s:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
