"""TorchScript on mydev: a module lowered with my_device.jit.to_mydev against the same scripted module
run op by op on mydev, and against CPU TorchScript, in one process.

Run: python bench/bench_jit.py [--threads N] [--repeat R]
Case: the tiny MLP forward (Linear(16,16)-Tanh-Linear(16,4), batch 4) under no_grad; and the same in
transparent mode (my_device.jit.fusion()). Target: lowered <= 0.5x scripted op by op.
"""
import warnings

import torch
from torch import nn

import my_device  # noqa: F401
import my_device.jit as mj
from common import interleaved_medians, parse_args


def fresh_model(state):
    """The tiny MLP as an instance of a class of its own. TorchScript keeps one graph executor per
    compiled method of a module type, shared by every instance of that type: scripting the same
    nn.Sequential twice shares the profiled, optimized forward, so a second variant would run the
    first one's plan (a CPU-profiled graph run on mydev falls back to its unoptimized path, which made
    an earlier version of this benchmark report op by op mydev 2-4x slower than it is)."""
    cls = type(f"Tiny{fresh_model.count}", (nn.Sequential,), {})
    fresh_model.count += 1
    model = cls(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)).eval()
    model.load_state_dict(state)
    return model


fresh_model.count = 0


def main():
    args = parse_args(__doc__, repeat=9)
    warnings.simplefilter("ignore", DeprecationWarning)
    torch.manual_seed(0)
    state = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)).state_dict()
    x = torch.randn(4, 16)
    xd = x.to("mydev")
    sync = torch.mydev.synchronize
    with torch.no_grad():
        cpu_scripted = torch.jit.script(fresh_model(state))
        scripted = torch.jit.script(fresh_model(state).to("mydev"))
        lowered = mj.to_mydev(torch.jit.script(fresh_model(state).to("mydev")), (xd,))
        fused = torch.jit.script(fresh_model(state).to("mydev"))
        with mj.fusion():
            for _ in range(3):
                fused(xd)
        groups = mj.stats()["groups_run"]
        expected = cpu_scripted(x)
        for f in (scripted, lowered, fused):
            torch.testing.assert_close(f(xd).cpu(), expected)
        assert mj.stats()["groups_run"] > groups, "transparent mode ran no mydev::CompilationGroup"
        times = interleaved_medians({
            "cpu scripted": (lambda: cpu_scripted(x), lambda: None),
            "mydev scripted": (lambda: scripted(xd), sync),
            "mydev lowered": (lambda: lowered(xd), sync),
            "mydev transparent": (lambda: fused(xd), sync),
        }, 5000, args.repeat)
    base = times["mydev scripted"]
    for k, v in times.items():
        print(f"{k:<18} {v * 1e6:8.2f} us   vs mydev scripted {v / base:5.2f}x   vs cpu scripted "
              f"{v / times['cpu scripted']:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
