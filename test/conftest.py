import contextlib
import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import my_device  # noqa: F401  (registers the device for every test module)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, env: dict = None, timeout: float = 120, args=()) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for settings read once per process, crashes, fork)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=full_env, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )


@pytest.fixture
def python_subprocess():
    return run_python


# Long enough that the host's own calls between a launch and a `stream.query()` finish well within it, even with
# CI's test processes (pytest -n) competing for the cores: at 150 ms, 1 of 3 CI runs saw a held-back kernel
# already done. A wait inside the block waits it out, so each waited task costs this much.
DELAY_US = 500_000


@contextlib.contextmanager
def delayed(stream, us=DELAY_US):
    """Holds back `stream`'s worker `us` before each task (a test hook), so that
    whether work was queued shows in `stream.query()`, not in timings."""
    # Python's garbage collector is off in the block: a full collection in a test process that imported the
    # OpInfo database and Inductor took 350 ms on an idle machine, and more beside CI's other process, which is
    # enough to let a held-back kernel finish between its launch and the `query()` that expects it pending.
    collecting = gc.isenabled()
    gc.disable()
    my_device._C._test_set_stream_delay(stream.stream_id, stream.device_index, us)
    try:
        yield stream
    finally:
        my_device._C._test_set_stream_delay(stream.stream_id, stream.device_index, 0)
        if collecting:
            gc.enable()
        stream.synchronize()


@pytest.fixture
def kernel_threads():
    """The test runs at the intra-op thread count of mydev's kernels (my_device._C._kernel_intra_op_threads:
    torch's setting, or one fewer than the cores when it asks for them all). A parallel reduction's rounding
    depends on the count (layer norm's and batch norm's backward split rows by it at any size), so the CPU's
    bits are mydev's at the same count: tests that compare bits use it."""
    saved = torch.get_num_threads()
    torch.set_num_threads(my_device._C._kernel_intra_op_threads())
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(saved)


def breakdown_counts(fn):
    """(fn()'s result, the counts my_device._C._host_kernel_breakdown kept while it ran)."""
    torch.mydev.synchronize()
    my_device._C._host_kernel_breakdown(True)
    try:
        out = fn()
        torch.mydev.synchronize()
    finally:
        counts = dict(my_device._C._host_kernel_breakdown(False))
    return out, counts


def host_kernel_calls(fn):
    """(fn()'s result, how many calls it sent to the generic host kernel): for tests that an op
    takes a kernel of its own."""
    out, counts = breakdown_counts(fn)
    return out, counts["queued"] + counts["inline"]


def host_aliases(fn):
    """(fn()'s result, how many host aliases the kernels outside TensorIterator it ran at the call
    made): 0 when they ran over the caller's device tensors (RunsOnDeviceTensors)."""
    out, counts = breakdown_counts(fn)
    return out, counts["host_aliases"]


# The files that take longest on 2 cores, longest first (a sweep's CI subset, AOTInductor packages compiled
# from a cold cache, the Trainer runs). CI gives each process whole files in collection order
# (pytest -n --dist loadfile); started last, one of these would leave a process running alone at the end.
LONGEST_FILES = ("test_conformance.py", "test_aoti.py", "test_transfer_to_mydev.py", "test_fuzz.py",
                 "test_checks_at_call.py", "test_async.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))  # (stable: order within a file kept)
