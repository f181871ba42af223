"""mydev against CPU, in one process: per-op latency and large-op throughput.

Run: python bench/bench_ops.py [--threads N] [--repeat R]
Prints one line per case with the median time on each device and the ratio
mydev/CPU (lower is better; 1.00 is CPU speed). Targets: <=1.3x for
the 1-element op and the decoding step's small ones, <=1.05x for the large ones. The last nine are
the bench models' products, convolutions, pooling, attention and activation, and an optimizer's foreach
update, which a second compute unit shares (compare with MYDEV_COMPUTE_UNITS=1)."""
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
    # The bench models' kernels that share the device's second compute unit (MYDEV_COMPUTE_UNITS=1: not).
    ("linear (512,128) -> 384", lambda: (torch.randn(512, 128), torch.randn(384, 128), torch.randn(384)),
     torch.nn.functional.linear, 100),
    ("mm 64x512 @ 512x512", lambda: (torch.randn(64, 512), torch.randn(512, 512)), torch.mm, 100),
    ("conv2d (8,3,32,32) 3x3 -> 16", lambda: (torch.randn(8, 3, 32, 32), torch.randn(16, 3, 3, 3)),
     lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), 100),
    ("conv2d backward (8,16,16,16)", lambda: (torch.randn(8, 32, 16, 16), torch.randn(8, 16, 16, 16),
                                              torch.randn(32, 16, 3, 3)),
     lambda g, x, w: torch.ops.aten.convolution_backward(g, x, w, [32], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                         [True, True, True]), 50),
    ("max_pool2d (8,16,32,32)", lambda: (torch.randn(8, 16, 32, 32),),
     lambda x: torch.nn.functional.max_pool2d(x, 2), 50),
    ("attention (8,4,64,32) causal", lambda: tuple(torch.randn(8, 4, 64, 32) for _ in range(3)),
     lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), 100),
    # As autograd calls it: forward, then the backward with the forward's absent mask as an undefined tensor.
    ("attn fwd+bwd (8,4,64,32)", lambda: tuple(torch.randn(8, 4, 64, 32) for _ in range(4)),
     lambda q, k, v, g: torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
         *(t.requires_grad_() for t in (q, k, v)), is_causal=True), (q, k, v), g), 50),
    ("gelu (8,64,512)", lambda: (torch.randn(8, 64, 512),), torch.nn.functional.gelu, 100),
    # An optimizer's update over 8.4M parameters: one foreach kernel, its entries in two blocks.
    ("foreach add_, 8 x (1024,1024)", lambda: tuple(torch.randn(1024, 1024) for _ in range(16)),
     lambda *t: torch._foreach_add_(list(t[:8]), list(t[8:]), alpha=1e-3), 10),
]


def main():
    args = parse_args(__doc__, repeat=15)
    for name, make, op, inner in CASES:
        _case(name, make, op, inner, args.repeat)


if __name__ == "__main__":
    main()
