"""Custom operators of the mydev backend: the `my_device::` op namespace.

Each op works on mydev and CPU tensors (the CPU kernel is the reference the mydev one is tested
against), has a Meta kernel so FakeTensor and `torch.compile` trace it without a graph break, and
the differentiable ones support `backward()` and double backward on both devices.

The C++ ops live in `csrc/ops/`. `swiglu` is defined here, in Python, with `torch.library.custom_op`.

`counters()` tells which mydev-specific kernels ran: the autograd kernels registered for
AutogradPrivateUse1 (`"<op>.forward"` / `"<op>.backward"`, counted for mydev tensors only), the
mydev override of `aten::gelu`'s autograd (`"gelu.forward"` / `"gelu.backward"`), and `swiglu`'s
mydev kernel (`"swiglu.mydev"`).
"""
from collections import Counter
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _C  # noqa: F401  (defines the C++ ops)

__all__ = [
    "AdamW", "counters", "fused_adamw_", "fused_linear_gelu", "reset_counters", "rms_norm", "swiglu",
]

_python_counts: Counter = Counter()


def counters() -> dict:
    """How many times each mydev-specific kernel ran since the last `reset_counters()`."""
    merged = Counter(torch.ops.my_device._counters())
    merged.update(_python_counts)
    return dict(merged)


def reset_counters() -> None:
    """Sets every counter of `counters()` back to zero."""
    torch.ops.my_device._reset_counters()
    _python_counts.clear()


def fused_linear_gelu(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """`gelu(input @ weight.T + bias)` (exact, erf-based gelu) as one op.

    `input` is `[..., in_features]`, `weight` `[out_features, in_features]`, `bias` `[out_features]`
    or None. The pre-activation is not stored for backward; it is recomputed there.
    """
    return torch.ops.my_device.fused_linear_gelu(input, weight, bias)


def rms_norm(input: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """Root-mean-square normalisation over the last dimension, scaled by `weight`:
    `input / sqrt(mean(input**2, -1) + eps) * weight`. Its backward is the fused op
    `my_device::rms_norm_backward`."""
    return torch.ops.my_device.rms_norm(input, weight, eps)


def fused_adamw_(param: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, grad: Tensor, *, lr: float,
                 beta1: float, beta2: float, eps: float, weight_decay: float, step: int) -> None:
    """One AdamW step (decoupled weight decay, bias-corrected moments) for one parameter, updating
    `param`, `exp_avg` and `exp_avg_sq` in place in a single pass. `step` counts from 1. All four
    tensors must be contiguous, with the same shape, dtype and device. On mydev the step is queued
    and returns at once."""
    torch.ops.my_device.fused_adamw_(param, exp_avg, exp_avg_sq, grad, lr=lr, beta1=beta1, beta2=beta2,
                                     eps=eps, weight_decay=weight_decay, step=step)


class AdamW(torch.optim.Optimizer):
    """`torch.optim.AdamW` (without amsgrad or maximize) whose update is `fused_adamw_`."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["step"] += 1
                fused_adamw_(p, state["exp_avg"], state["exp_avg_sq"], p.grad, lr=group["lr"], beta1=beta1,
                             beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
                             step=state["step"])
        return loss


def _check_swiglu(gate: Tensor, up: Tensor) -> None:
    torch._check(gate.shape == up.shape,
                 lambda: f"my_device::swiglu: gate and up must have the same shape, got {tuple(gate.shape)} "
                         f"and {tuple(up.shape)}")
    torch._check(gate.device == up.device,
                 lambda: f"my_device::swiglu: expected both tensors on the same device, got {gate.device} "
                         f"and {up.device}")
    torch._check(gate.dtype == up.dtype,
                 lambda: f"my_device::swiglu: gate and up must have the same dtype, got {gate.dtype} and {up.dtype}")


@torch.library.custom_op("my_device::swiglu", mutates_args=())
def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """`silu(gate) * up`, the gated activation of SwiGLU feed-forward layers. This body is the
    reference kernel every device without its own uses (CPU here)."""
    _check_swiglu(gate, up)
    return F.silu(gate) * up


@swiglu.register_kernel("mydev")
def _swiglu_mydev(gate: Tensor, up: Tensor) -> Tensor:
    # Multiplies into silu's output instead of allocating a second device buffer.
    _check_swiglu(gate, up)
    _python_counts["swiglu.mydev"] += 1
    out = F.silu(gate)
    out.mul_(up)
    return out


@swiglu.register_fake
def _swiglu_fake(gate: Tensor, up: Tensor) -> Tensor:
    _check_swiglu(gate, up)
    return torch.empty_like(gate)


def _swiglu_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, grad):
    # Written with differentiable torch ops, so double backward works too.
    gate, up = ctx.saved_tensors
    sig = torch.sigmoid(gate)
    silu = gate * sig
    grad_gate = grad * up * (sig + silu * (1 - sig))
    grad_up = grad * silu
    return grad_gate, grad_up


swiglu.register_autograd(_swiglu_backward, setup_context=_swiglu_setup_context)
