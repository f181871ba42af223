"""Which ops of a block of code ran through the copying CPU fallback, and on what.

`my_device.fallback_counts()` answers "which ops, how often" for the whole
process. `track_fallbacks()` answers it for one block, and also records the
dtypes and shapes of each call's tensor inputs, which is what you need to
reproduce the call or to decide whether it matters:

    with my_device.track_fallbacks() as fb:
        model(x).sum().backward()
    print(fb.summary())
    fb.counts()   # {"aten::op.overload": calls}
    fb.records    # [FallbackCall(op, inputs=((dtype, shape), ...), calls)]

Trackers nest; each sees only the calls made while it was open.
"""
import contextlib
from typing import NamedTuple

import torch

from . import _C


class FallbackCall(NamedTuple):
    op: str  # "aten::name.overload"
    inputs: tuple  # ((torch.dtype, shape tuple), ...) of the tensor inputs, in argument order
    calls: int


def _snapshot():
    return {(op, inputs): calls for op, inputs, calls in _C._fallback_records()}


def _format_inputs(inputs):
    if not inputs:
        return "(no tensor inputs)"
    return ", ".join(f"{str(dtype).removeprefix('torch.')}[{', '.join(map(str, shape))}]" for dtype, shape in inputs)


class FallbackTracker:
    """The fallback calls made inside one `track_fallbacks()` block (filled when it exits)."""

    def __init__(self):
        self.records: list[FallbackCall] = []

    def counts(self) -> dict:
        """Calls per op, as `my_device.fallback_counts()` reports them."""
        out = {}
        for r in self.records:
            out[r.op] = out.get(r.op, 0) + r.calls
        return out

    def __bool__(self):
        return bool(self.records)

    def summary(self) -> str:
        """A table with one row per op and input signature, busiest op first."""
        if not self.records:
            return "No op ran through the copying CPU fallback."
        totals = self.counts()
        rows = sorted(self.records, key=lambda r: (-totals[r.op], r.op, -r.calls))
        header = ("op", "calls", "inputs (dtype[shape])")
        cells = [header] + [(r.op, str(r.calls), _format_inputs(r.inputs)) for r in rows]
        w0 = max(len(c[0]) for c in cells)
        w1 = max(len(c[1]) for c in cells)
        lines = [f"{c[0]:<{w0}}  {c[1]:>{w1}}  {c[2]}" for c in cells]
        lines.insert(1, "-" * max(len(line) for line in lines))
        n = sum(totals.values())
        lines.append(f"{n} call{'s' if n != 1 else ''} of {len(totals)} op{'s' if len(totals) != 1 else ''} "
                     "ran through the copying CPU fallback.")
        return "\n".join(lines)

    def __repr__(self):
        return f"FallbackTracker({self.counts()})"


@contextlib.contextmanager
def track_fallbacks():
    """Records the copying-fallback calls made inside the block; yields a FallbackTracker."""
    tracker = FallbackTracker()
    _C._start_fallback_tracking()
    try:
        before = _snapshot()
        yield tracker
    finally:
        # Queued device work may still be running, but fallback calls are
        # recorded when they are dispatched, on this thread: nothing to wait for.
        after = _snapshot()
        _C._stop_fallback_tracking()
        tracker.records = [
            FallbackCall(op, inputs, calls - before.get((op, inputs), 0))
            for (op, inputs), calls in sorted(after.items(), key=lambda kv: kv[0][0])
            if calls > before.get((op, inputs), 0)
        ]


__all__ = ["FallbackCall", "FallbackTracker", "track_fallbacks"]
