"""Process exit with autograd's device threads.

When backward passes on mydev run on autograd's per-device worker threads, as on
CUDA (MYDEV_AUTOGRAD_DEVICE_THREADS=1, or a thread that turned multithreading
back on; by default mydev runs them on the calling thread: AutogradThread.cpp),
torch 2.13's `_engine_run_backward` stashes a Python contextvars
Context in thread-local state for each backward, and the device thread keeps
the finished backward's GraphTask (which captured that state) until it takes
its next task. If the interpreter is finalising when the thread finally
drops it, releasing the Context needs the GIL, the thread is killed while
taking it, and the process aborts ("terminate called without an active
exception"). A script whose last statement is a mydev backward hit this about
4 times in 10 on 2 cores (the same race exists on CUDA; see
https://github.com/pytorch/pytorch/issues/190489).

At exit, before finalisation, one Python-free backward per device makes each
device thread take a new task, which it can only do after dropping the old
one. test_device.py::test_exit_after_a_backward_on_mydev checks the exit, and
test_device.py::test_backward_still_stashes_a_python_context notices when
PyTorch stops stashing the Context (this module can then go).
"""
import atexit

import torch


def drain_autograd_device_threads():
    if not torch.mydev.is_initialized():
        return
    from torch.autograd import Variable

    for index in range(torch.mydev.device_count()):
        leaf = torch.zeros((), device=f"mydev:{index}", requires_grad=True)
        # The engine directly, not torch.autograd.backward: that would stash a
        # new Context in the GraphTask this is meant to leave clean. With
        # multithreading on, as the backward it replaces ran: on this thread's
        # default (off, see core/AutogradThread.cpp) it would run here and leave
        # the device thread's task in place. Grad mode on: a script may end
        # with torch.set_grad_enabled(False).
        with torch.autograd.set_multithreading_enabled(True), torch.enable_grad():
            out = leaf * 1
            Variable._execution_engine.run_backward(
                (out,), (torch.ones((), device=out.device),), False, False, (), True, True)


def install():
    from . import _patches

    atexit.register(drain_autograd_device_threads)
    _patches.record(
        "atexit: one backward per initialised device", why="torch's autograd device thread keeps the last "
        "GraphTask, with a Python context, until its next task; dropped during interpreter finalisation it "
        "aborted the process (matters when backward runs on the engine's device threads)",
        test="test_device.py::test_backward_still_stashes_a_python_context")
