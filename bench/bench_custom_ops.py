"""The my_device:: custom ops against the same computation in plain aten ops, both on mydev, in one process.

Run: python bench/bench_custom_ops.py [--threads N] [--repeat R]
Prints one line per case, all on mydev, with the median time of each variant and the ratio custom/aten
(lower is better).
Cases: an AdamW step over an MLP's parameters (my_device.ops.AdamW against torch.optim.AdamW with
foreach=False), and forward+backward of rms_norm and fused_linear_gelu against their aten formulas."""

import torch
import torch.nn.functional as F
from torch import nn

import my_device  # noqa: F401
from my_device import ops
from common import median_seconds, parse_args


def _adamw_case(make_opt):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)]).to("mydev")
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt = make_opt(model.parameters())
    return opt.step


def _fwd_bwd_case(fn, shapes):
    torch.manual_seed(0)
    args = [torch.randn(*s, device="mydev", requires_grad=True) for s in shapes]

    def run():
        fn(*args).sum().backward()
    return run


def _rms_aten(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


CASES = [
    ("AdamW step, 8x Linear(256,256)",
     _adamw_case(lambda p: ops.AdamW(p, lr=1e-3)),
     _adamw_case(lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=False)), 20),
    ("rms_norm fwd+bwd 64x1024",
     _fwd_bwd_case(lambda x, w: ops.rms_norm(x, w), [(64, 1024), (1024,)]),
     _fwd_bwd_case(_rms_aten, [(64, 1024), (1024,)]), 50),
    ("fused_linear_gelu fwd+bwd 64x512->512",
     _fwd_bwd_case(ops.fused_linear_gelu, [(64, 512), (512, 512), (512,)]),
     _fwd_bwd_case(lambda x, w, b: F.gelu(F.linear(x, w, b)), [(64, 512), (512, 512), (512,)]), 20),
]


def main():
    args = parse_args(__doc__, repeat=9)
    for name, custom, aten, inner in CASES:
        t_custom = median_seconds(custom, inner, args.repeat, torch.mydev.synchronize)
        t_aten = median_seconds(aten, inner, args.repeat, torch.mydev.synchronize)
        print(f"{name:<38} custom {t_custom * 1e6:9.1f} us   aten {t_aten * 1e6:9.1f} us   "
              f"ratio {t_custom / t_aten:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
