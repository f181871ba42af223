"""Process-wide settings that kernels read when they run.

CPU kernels, which are mydev's kernels, read deterministic mode
(`torch.use_deterministic_algorithms`) when they run, not when they are launched; a
kernel queued before the mode changes would follow the new mode (a `put_` launched
with the mode off would raise its nondeterminism alert on the worker). So a change
of the mode first waits for the work queued on every device, leaving its errors for
the next synchronisation. (While the mode is on, host kernels run at the call:
csrc/native/hostkernel/QueuedHostKernel.cpp.) PyTorch's own setter is patched,
`torch._C._set_deterministic_algorithms`, which torch.use_deterministic_algorithms
and torch.set_deterministic_debug_mode look up at each call.
"""
import torch

from . import _C, _patches


def install() -> None:
    original = torch._C._set_deterministic_algorithms

    def _set_deterministic_algorithms(mode, *args, **kwargs):
        changes = (bool(mode) != torch._C._get_deterministic_algorithms()
                   or bool(kwargs.get("warn_only", args[0] if args else False))
                   != torch._C._get_deterministic_algorithms_warn_only())
        if changes and torch.mydev.is_initialized():
            _C._wait_for_queued_work()
        return original(mode, *args, **kwargs)

    _set_deterministic_algorithms.__doc__ = original.__doc__
    _patches.replace(
        torch._C, "_set_deterministic_algorithms", _set_deterministic_algorithms,
        target="torch._C._set_deterministic_algorithms",
        why="CPU kernels read the mode when they run, so a kernel queued before a change would follow the new "
            "mode: a change waits for queued work",
        test="none (a consequence of queued execution): test_checks_at_call.py::"
             "test_a_put_queued_before_deterministic_mode_is_turned_on_runs_as_launched checks the behaviour")
