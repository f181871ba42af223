"""TorchScript on mydev: a module lowered with my_device.jit.to_mydev against the same scripted module
run op by op on mydev, and against CPU TorchScript, in one process.

Run: python bench/bench_jit.py [--threads N] [--repeat R]
Case: the tiny MLP forward (Linear(16,16)-Tanh-Linear(16,4), batch 4) under no_grad; and the same in
transparent mode (my_device.jit.fusion()). Target (issue 15): lowered <= 0.5x scripted op by op.
"""
import warnings

import torch
from torch import nn

import my_device  # noqa: F401
import my_device.jit as mj
from common import median_seconds, parse_args


def main():
    args = parse_args(__doc__, repeat=9)
    warnings.simplefilter("ignore", DeprecationWarning)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)).eval()
    x = torch.randn(4, 16)
    times = {}
    with torch.no_grad():
        cpu_scripted = torch.jit.script(model)
        times["cpu scripted"] = median_seconds(lambda: cpu_scripted(x), 5000, args.repeat)
        dev_model = model.to("mydev")
        xd = x.to("mydev")
        scripted = torch.jit.script(dev_model)
        sync = torch.mydev.synchronize
        times["mydev scripted"] = median_seconds(lambda: scripted(xd), 5000, args.repeat, sync)
        lowered = mj.to_mydev(torch.jit.script(dev_model), (xd,))
        times["mydev lowered"] = median_seconds(lambda: lowered(xd), 5000, args.repeat, sync)
        fused = torch.jit.script(dev_model)
        with mj.fusion():
            for _ in range(3):
                fused(xd)
            times["mydev transparent"] = median_seconds(lambda: fused(xd), 5000, args.repeat, sync)
    base = times["mydev scripted"]
    for k, v in times.items():
        print(f"{k:<18} {v * 1e6:8.2f} us   vs mydev scripted {v / base:5.2f}x   vs cpu scripted "
              f"{v / times['cpu scripted']:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
