"""flex_attention on mydev, as on the CPU.

WORKAROUND (torch 2.13): torch.nn.attention.flex_attention refuses every device outside a list written into
`_validate_device` (cuda, cpu, xpu, hpu, mps), eager and compiled, and `_apply_kernel_options` asks the kernel
for a log-sum-exp, which only a training kernel has, on every device but the CPU and MPS. mydev runs the CPU's
kernels (eager: the math reference; compiled: the CPU's C++ template, my_device/inductor/backend.py), so both
are asked about mydev inputs as about CPU ones: inference only, as on the CPU, with the CPU's error for a
backward. test_flex_attention.py::test_flex_attention_workaround_still_needed fails once torch lists mydev or
asks the backend.
"""

import torch

from . import _patches
from ._import_hooks import when_imported


class _OnTheCpu:
    """What the two functions read of a tensor (its device and whether it requires grad), for a mydev one."""

    def __init__(self, tensor):
        self.device = torch.device("cpu")
        self.requires_grad = tensor.requires_grad


def _as_on_the_cpu(original):
    def answer(query, key, value, *args, **kwargs):
        if query.device.type == "mydev":
            query, key, value = _OnTheCpu(query), _OnTheCpu(key), _OnTheCpu(value)
        return original(query, key, value, *args, **kwargs)

    return answer


def _install(module) -> None:
    for name in ("_validate_device", "_apply_kernel_options"):
        original = getattr(module, name)
        _patches.replace(module, name, _as_on_the_cpu(original), target=f"{module.__name__}.{name}",
                         why="flex_attention refuses devices outside its list and asks others for a training "
                             "kernel's log-sum-exp; mydev runs the CPU's kernels, inference only as on the CPU",
                         test="test_flex_attention.py::test_flex_attention_workaround_still_needed")


def install() -> None:
    when_imported("torch.nn.attention.flex_attention", _install)
