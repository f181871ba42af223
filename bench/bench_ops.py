"""mydev against CPU, in one process: per-op latency and large-op throughput.

Run: python bench/bench_ops.py [--threads N] [--repeat R]
Prints one line per case with the median time on each device and the ratio
mydev/CPU (lower is better; 1.00 is CPU speed). Targets: <=1.3x for
the 1-element op and the decoding step's small ones, <=1.05x for the large ones."""
import torch

import my_device  # noqa: F401
from common import median_seconds, parse_args


def _case(name, make, op, inner, repeat):
    results = {}
    for device in ("cpu", "mydev"):
        args = [t.to(device) for t in make()]
        sync = torch.mydev.synchronize if device == "mydev" else (lambda: None)
        results[device] = median_seconds(lambda: op(*args), inner, repeat, sync)
    ratio = results["mydev"] / results["cpu"]
    print(f"{name:<28} cpu {results['cpu'] * 1e6:10.2f} us   mydev {results['mydev'] * 1e6:10.2f} us   "
          f"ratio {ratio:5.2f}x", flush=True)
    return ratio


CASES = [
    ("add, 1 element", lambda: (torch.randn(1), torch.randn(1)), torch.add, 20000),
    ("add, 16M elements", lambda: (torch.randn(1 << 24), torch.randn(1 << 24)), torch.add, 5),
    ("matmul 1024x1024 float32", lambda: (torch.randn(1024, 1024), torch.randn(1024, 1024)), torch.mm, 5),
    # A decoding step's: its key/value cache grows by a cat, its next token is an argmax.
    ("cat (1,8,128)+(1,1,128)", lambda: (torch.randn(1, 8, 128), torch.randn(1, 1, 128)),
     lambda a, b: torch.cat([a, b], 1), 5000),
    ("argmax over 1000 logits", lambda: (torch.randn(1, 1000),), lambda a: a.argmax(-1), 5000),
]


def main():
    args = parse_args(__doc__, repeat=15)
    for name, make, op, inner in CASES:
        _case(name, make, op, inner, args.repeat)


if __name__ == "__main__":
    main()
