"""python -m my_device.demo: train the same small model on mydev and on CPU.

Both runs start from the same weights and see the same data, so their loss
curves must be equal. The demo then lists which aten ops a training step ran natively on
mydev and which went through the copying CPU fallback, and times a step on each
device."""
import argparse
import copy
import time
from collections import Counter

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import my_device


class SmallNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 16, 64), nn.GELU(),
                                  nn.Linear(64, classes))

    def forward(self, x):
        return self.head(self.features(x))


class _OpRecorder(TorchDispatchMode):
    """Records the aten ops a block dispatches (after autograd and decompositions)."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "aten":
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _batches(steps: int, batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, 16, 16, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(steps)]


def _step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def train(device: str, base: nn.Module, data, seed: int):
    torch.manual_seed(seed)  # seeds the CPU and every mydev generator
    model = copy.deepcopy(base).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in data:
        losses.append(_step(model, opt, x.to(device), y.to(device)).item())
    return losses, model, opt


def time_steps(device: str, model, opt, data, repeat: int) -> float:
    sync = torch.mydev.synchronize if device.startswith("mydev") else (lambda: None)
    x, y = data[0][0].to(device), data[0][1].to(device)
    _step(model, opt, x, y)
    sync()
    start = time.perf_counter()
    for _ in range(repeat):
        _step(model, opt, x, y)
    sync()
    return (time.perf_counter() - start) / repeat


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m my_device.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timing-steps", type=int, default=20)
    parser.add_argument("--distributed", action="store_true",
                        help="train with DDP on 2 processes over mccl instead (my_device/demo_distributed.py)")
    args = parser.parse_args(argv)
    if args.distributed:
        from . import demo_distributed

        return demo_distributed.main(args.steps, args.batch, args.seed)

    torch.manual_seed(args.seed)
    base = SmallNet()
    data = _batches(args.steps, args.batch, args.seed + 1)

    cpu_losses, _, _ = train("cpu", base, data, args.seed)
    dev_losses, dev_model, dev_opt = train("mydev", base, data, args.seed)

    print(f"Training {type(base).__name__} with AdamW for {args.steps} steps, batch {args.batch}, seed {args.seed}")
    print(f"{'step':>4}  {'cpu loss':>12}  {'mydev loss':>12}")
    for i, (c, d) in enumerate(zip(cpu_losses, dev_losses)):
        print(f"{i:>4}  {c:12.6f}  {d:12.6f}")
    worst = max(abs(c - d) for c, d in zip(cpu_losses, dev_losses))
    same = all(abs(c - d) <= 1e-5 * max(1.0, abs(c)) for c, d in zip(cpu_losses, dev_losses))
    print(f"loss curves {'EQUAL' if same else 'DIFFER'} (largest difference {worst:.2e})")

    my_device.reset_fallback_counts()
    recorder = _OpRecorder()
    x, y = data[0][0].to("mydev"), data[0][1].to("mydev")
    with recorder:
        _step(dev_model, dev_opt, x, y)
    fallback = my_device.fallback_counts()
    native = sorted(op for op in recorder.ops if f"aten::{op.removeprefix('aten.')}" not in fallback)
    print(f"\nOne training step on mydev dispatched {sum(recorder.ops.values())} aten op calls "
          f"({len(recorder.ops)} distinct):")
    print(f"  native ({len(native)}): " + ", ".join(native))
    if fallback:
        print(f"  copying CPU fallback ({len(fallback)}): " +
              ", ".join(f"{op} x{n}" for op, n in sorted(fallback.items())))
    else:
        print("  copying CPU fallback: none")

    cpu_model = copy.deepcopy(base)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    t_cpu = time_steps("cpu", cpu_model, cpu_opt, data, args.timing_steps)
    t_dev = time_steps("mydev", dev_model, dev_opt, data, args.timing_steps)
    print(f"\nTime per training step ({torch.get_num_threads()} threads, mean of {args.timing_steps}):")
    print(f"  cpu   {t_cpu * 1e3:8.2f} ms")
    print(f"  mydev {t_dev * 1e3:8.2f} ms   ({t_dev / t_cpu:.2f}x CPU)")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
