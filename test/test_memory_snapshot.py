"""Memory history and snapshots: the caching allocator's segments, blocks and stacks, in the format
torch.cuda.memory._snapshot() has, read by PyTorch's own torch.cuda._memory_viz."""
import gc
import os
import pickle
import re

import pytest
import torch
from torch.cuda import _memory_viz

import my_device

MiB = 1 << 20
THIS_FILE = os.path.basename(__file__)


@pytest.fixture
def history():
    # Earlier tests' tensors caught in reference cycles would otherwise be freed by whichever
    # collection a test's own Python allocations set off (a snapshot builds thousands of
    # objects), between two readings of the allocator that a test compares.
    gc.collect()
    torch.mydev.synchronize()
    torch.mydev.empty_cache()
    torch.mydev.memory._record_memory_history(clear_history=True)
    try:
        yield
    finally:
        torch.mydev.memory._record_memory_history(enabled=None)


def _blocks(snapshot, device=0):
    return [b for s in snapshot["segments"] if s["device"] == device for b in s["blocks"]]


def _allocated_here(block):
    return any(f["filename"].endswith(THIS_FILE) for f in block["frames"])


def test_snapshot_matches_the_allocator(history):
    a = torch.empty(3 * MiB, dtype=torch.uint8, device="mydev")   # a large segment of its own
    b = torch.empty(100, device="mydev")                           # small pool: 512 bytes of a 2 MiB segment
    s = torch.mydev.memory._snapshot()
    segs = [seg for seg in s["segments"] if seg["device"] == 0]
    # The segments are what the allocator holds: their sizes add up to memory_reserved().
    assert sum(seg["total_size"] for seg in segs) == torch.mydev.memory_reserved()
    assert sum(seg["allocated_size"] for seg in segs) == torch.mydev.memory_allocated()
    for seg in segs:
        assert sum(blk["size"] for blk in seg["blocks"]) == seg["total_size"]
        # Blocks tile the segment in address order.
        addr = seg["address"]
        for blk in seg["blocks"]:
            assert blk["address"] == addr
            addr += blk["size"]
        assert seg["segment_type"] in ("small", "large")
    by_addr = {blk["address"]: blk for blk in _blocks(s)}
    ba, bb = by_addr[a.data_ptr()], by_addr[b.data_ptr()]
    # 3 MiB takes a whole 4 MiB segment: the 1 MiB left is too small to split off in the large pool.
    assert (ba["size"], ba["requested_size"], ba["state"]) == (4 * MiB, 3 * MiB, "active_allocated")
    assert (bb["size"], bb["requested_size"], bb["state"]) == (512, 400, "active_allocated")
    # The stack that allocated them, down to this test's lines.
    for blk in (ba, bb):
        frame = next(f for f in blk["frames"] if f["filename"].endswith(THIS_FILE))
        assert frame["name"] == "test_snapshot_matches_the_allocator" and frame["line"] > 0
    del a
    s2 = torch.mydev.memory._snapshot()
    freed = [blk for blk in _blocks(s2) if blk["address"] == ba["address"]]
    assert freed and freed[0]["state"] == "inactive" and freed[0]["frames"] == []


def test_trace_records_allocator_actions_in_order(history):
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="mydev")
    addr = x.data_ptr()
    del x
    torch.mydev.empty_cache()
    trace = torch.mydev.memory._snapshot()["device_traces"][0]
    mine = [(e["action"], e["size"]) for e in trace if e["addr"] == addr]
    # Sizes are block sizes, as in CUDA's trace: 3 MiB takes a whole 4 MiB segment.
    assert mine == [("segment_alloc", 4 * MiB), ("alloc", 4 * MiB), ("free_requested", 4 * MiB),
                    ("free_completed", 4 * MiB), ("segment_free", 4 * MiB)]
    alloc = next(e for e in trace if e["addr"] == addr and e["action"] == "alloc")
    assert any(f["filename"].endswith(THIS_FILE) for f in alloc["frames"])
    assert all(e["time_us"] > 0 for e in trace)
    # max_entries keeps the newest entries only.
    torch.mydev.memory._record_memory_history(max_entries=3, clear_history=True)
    for _ in range(5):
        torch.empty(10, device="mydev")
    trace = torch.mydev.memory._snapshot()["device_traces"][0]
    assert len(trace) == 3


def test_state_only_and_off():
    torch.mydev.memory._record_memory_history("state", clear_history=True)
    try:
        x = torch.empty(10, device="mydev")
        s = torch.mydev.memory._snapshot()
        assert s["device_traces"][0] == []                           # no history in "state" mode
        assert _allocated_here(next(b for b in _blocks(s) if b["address"] == x.data_ptr()))
    finally:
        torch.mydev.memory._record_memory_history(enabled=None)
    y = torch.empty(10, device="mydev")
    blk = next(b for b in _blocks(torch.mydev.memory._snapshot()) if b["address"] == y.data_ptr())
    assert blk["frames"] == [] and blk["state"] == "active_allocated"   # not recording: no stacks
    with pytest.raises(RuntimeError, match="expected enabled"):
        torch.mydev.memory._record_memory_history("everything")
    with pytest.raises(RuntimeError, match="expected stacks"):
        torch.mydev.memory._record_memory_history(stacks="cpp")
    torch.testing.assert_close((y.fill_(1) + 1).cpu(), torch.full((10,), 2.0))


@pytest.mark.skipif(os.environ.get("MYDEV_LAUNCH_BLOCKING") == "1",
                    reason="the held kernel that keeps the stream busy would run in the caller and never return")
def test_awaiting_free_block_on_another_stream(history):
    s = torch.mydev.Stream()
    x = torch.ones(1000, device="mydev")
    with torch.mydev.stream(s):
        my_device._C._test_launch_hold(0)     # a kernel on s that runs until released
    try:
        x.record_stream(s)                    # x is in use on s too: freeing it waits for s
        addr = x.data_ptr()
        del x
        blk = next(b for b in _blocks(torch.mydev.memory._snapshot()) if b["address"] == addr)
        assert blk["state"] == "active_awaiting_free"
    finally:
        my_device._C._test_release_hold()
    s.synchronize()
    blk = next(b for b in _blocks(torch.mydev.memory._snapshot()) if b["address"] == addr)
    assert blk["state"] == "inactive"
    y = torch.ones(1000, device="mydev") * 2
    assert y.sum().item() == 2000


def test_training_step_snapshot_is_read_by_memory_viz(history, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to("mydev")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(32, 64, device="mydev")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    path = tmp_path / "snapshot.pickle"
    torch.mydev.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        s = pickle.load(f)
    # Every parameter, gradient and momentum buffer is a live block of the snapshot.
    live = {b["address"]: b for b in _blocks(s) if b["state"] == "active_allocated"}
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()] + \
              [opt.state[p]["momentum_buffer"] for p in model.parameters()]
    for t in tensors:
        assert t.data_ptr() in live, t.shape
        assert live[t.data_ptr()]["requested_size"] == t.numel() * t.element_size()
    assert any(_allocated_here(live[p.data_ptr()]) for p in model.parameters())
    # PyTorch's own tools read it.
    summary = _memory_viz.segsum(s)
    assert f"segments: {len(s['segments'])}" in summary
    flame = _memory_viz.segments(s, format_flamegraph=lambda lines: lines)
    assert THIS_FILE in flame and "active_allocated" in flame
    assert "active_allocated" in _memory_viz.memory(s, format_flamegraph=lambda lines: lines)
    # (Its trace names a segment_alloc only if the step needed a new segment, which depends on
    # what earlier tests left cached: the allocations themselves are what must be there.)
    entries = s["device_traces"][0]
    trace = _memory_viz.trace(s)
    assert sum(e["action"] == "alloc" for e in entries) >= len(tensors)
    assert f"{len(entries)} entries" in trace
    assert len(re.findall(r"^\w+ = \w+\[\d+:", trace, flags=re.M)) >= len(tensors)  # "b = seg_0[512:1.0KiB]"
    for html in (_memory_viz.trace_plot(s), _memory_viz.segment_plot(s)):
        assert html.lstrip().startswith("<!DOCTYPE html>") and "snapshot.pickle" in html


def test_snapshot_across_devices(history):
    a = torch.empty(10, device="mydev:0")
    b = torch.empty(10, device="mydev:1")
    s = torch.mydev.memory._snapshot()
    assert a.data_ptr() in {blk["address"] for blk in _blocks(s, 0)}
    assert b.data_ptr() in {blk["address"] for blk in _blocks(s, 1)}
    assert len(s["device_traces"]) == torch.mydev.device_count()
    assert any(e["action"] == "alloc" and e["addr"] == b.data_ptr() for e in s["device_traces"][1])
