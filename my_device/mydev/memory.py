"""Device memory: the caching allocator's statistics and controls, mirroring torch.cuda.memory.

Sizes are block sizes: requests are rounded up to multiples of 512 bytes, and
the allocator reserves memory from the runtime in segments (2 MiB for requests
up to 1 MiB, which several small blocks share; whole multiples of 2 MiB above)."""
import collections
import contextlib
import sys
from typing import Any, Dict, Optional

from .. import _C

__all__ = [
    "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_accumulated_memory_stats", "memory_summary", "empty_cache",
    "mem_get_info", "set_per_process_memory_fraction", "get_per_process_memory_fraction", "memory_snapshot",
    "caching_allocator_alloc", "caching_allocator_delete", "memory_stats_as_nested_dict", "device_memory_used",
    "reset_max_memory_allocated", "memory_cached", "max_memory_cached", "reset_max_memory_cached",
    "MemPool", "use_mem_pool",
]


def _index(device) -> int:
    from . import _get_device_index, _lazy_init

    _lazy_init()
    return _get_device_index(device, optional=True)


def memory_stats(device=None) -> Dict[str, Any]:
    """The allocator's statistics for a device, keyed as torch.cuda.memory_stats():
    "<stat>.<all|small_pool|large_pool>.<current|peak|allocated|freed>" plus counters."""
    return collections.OrderedDict(sorted(_C._memory_stats(_index(device)).items()))


def memory_stats_as_nested_dict(device=None) -> Dict[str, Any]:
    """memory_stats() as nested dicts: {"allocated_bytes": {"all": {"current": ...}}}."""
    nested: Dict[str, Any] = {}
    for key, value in _C._memory_stats(_index(device)).items():
        *path, leaf = key.split(".")
        level = nested
        for part in path:
            level = level.setdefault(part, {})
        level[leaf] = value
    return nested


def memory_allocated(device=None) -> int:
    """Bytes occupied by live tensors on the device."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    """The peak of memory_allocated() since the start or the last reset_peak_memory_stats()."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    """Bytes the caching allocator holds from the runtime: allocated plus cached."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    _C._reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    """Deprecated in torch.cuda for reset_peak_memory_stats, which it calls, as here."""
    reset_peak_memory_stats(device)


def memory_cached(device=None) -> int:
    """Deprecated in torch.cuda: memory_reserved."""
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    """Deprecated in torch.cuda: max_memory_reserved."""
    return max_memory_reserved(device)


def reset_max_memory_cached(device=None) -> None:
    """Deprecated in torch.cuda for reset_peak_memory_stats, which it calls, as here."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    _C._reset_accumulated_memory_stats(_index(device))


def empty_cache() -> None:
    """Returns all cached, unused device memory to the runtime."""
    _C._empty_cache()


def caching_allocator_alloc(size: int, device=None, stream=None) -> int:
    """Allocates `size` bytes from the caching allocator for `stream` (default:
    the device's current stream) and returns the address. Free it with
    caching_allocator_delete; until then it counts as allocated."""
    from . import streams

    index = _index(device)
    if stream is not None and not isinstance(stream, streams.Stream):
        raise TypeError("Invalid type for stream argument, must be `torch.mydev.Stream` or None")
    if stream is None:
        return _C._raw_alloc(size, index)
    with streams.stream(stream):
        return _C._raw_alloc(size, index)


def caching_allocator_delete(mem_ptr: int) -> None:
    """Gives a block from caching_allocator_alloc back to the caching allocator."""
    _C._raw_delete(mem_ptr)


def mem_get_info(device=None):
    """(free, total) bytes of the device, as the runtime reports them."""
    return _C._mem_get_info(_index(device))


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Caps what this process's allocator may reserve on the device at fraction * capacity.
    Allocating beyond it raises torch.OutOfMemoryError, as on CUDA."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    index = _index(device)
    _C._set_memory_fraction(fraction, index)
    _fractions[index] = fraction


# What set_per_process_memory_fraction set, per device (the allocator keeps only the cap it implies).
_fractions: Dict[int, float] = {}


def get_per_process_memory_fraction(device=None) -> float:
    """The fraction set_per_process_memory_fraction set for the device; 1.0 if none was set."""
    return _fractions.get(_index(device), 1.0)


def device_memory_used(device=None) -> int:
    """Bytes in use on the device, by every process, as the runtime reports them (total - free)."""
    free, total = mem_get_info(device)
    return total - free


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator's statistics for a device."""
    index = _index(device)
    stats = memory_stats(index)
    rows = [("Allocated memory", "allocated_bytes", True), ("Active memory", "active_bytes", True),
            ("Requested memory", "requested_bytes", True), ("Reserved memory", "reserved_bytes", True),
            ("Allocations", "allocation", False), ("Active allocs", "active", False),
            ("Reserved segments", "segment", False)]
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    line = "|" + "=" * 77 + "|"
    out = [line, f"|{'mydev memory summary, device ID ' + str(index):^77}|", line,
           f"| {'Metric':<25} | {'Cur Usage':>10} | {'Peak Usage':>10} | {'Tot Alloc':>10} | {'Tot Freed':>10} |",
           line]
    for title, key, is_bytes in rows:
        for pool in pools:
            label = title if pool == "all" else f"  from {pool.replace('_', ' ')}"
            vals = [stats[f"{key}.{pool}.{m}"] for m in ("current", "peak", "allocated", "freed")]
            cells = [(_fmt(v) if is_bytes else str(v)) for v in vals]
            out.append(f"| {label:<25} | " + " | ".join(f"{c:>10}" for c in cells) + " |")
        out.append("|" + "-" * 77 + "|")
    out.append(f"| {'Allocation retries: ' + str(stats['num_alloc_retries']):<37}"
               f"{'OOMs: ' + str(stats['num_ooms']):<40}|")
    out.append(line)
    return "\n".join(out) + "\n"


# Memory history and snapshots, as torch.cuda.memory's private (but widely
# used) API: the output is what torch.cuda._memory_viz and pytorch.org/memory_viz read.

def _record_memory_history(enabled: Optional[str] = "all", context: Optional[str] = "all", stacks: str = "all",
                           max_entries: int = sys.maxsize, device=None, clear_history: bool = False) -> None:
    """Starts (or stops, with enabled=None) recording the caching allocator's history.

    enabled: "state" keeps the allocating stack of each live block; "all" also
        appends every allocator action (alloc, free_requested, free_completed,
        segment_alloc, segment_free, oom, snapshot) to a per-device trace of at
        most max_entries (the oldest are dropped); None stops and forgets.
    context: whose stacks are kept: None, "state"/"alloc" (allocations), "all"
        (allocations and frees).
    stacks: "python", or "all" (Python and C++ frames; C++ symbolization is slow).
    device: ignored, as on CUDA: recording covers every device.
    """
    _C._record_memory_history(enabled, context, stacks, max_entries, clear_history)


def _snapshot(device=None) -> Dict[str, Any]:
    """The allocator's state in torch.cuda.memory._snapshot()'s format:
    {"segments": [...], "device_traces": [[...] per device]}. Each segment (memory
    the allocator holds from the runtime) lists its blocks with their state
    ("active_allocated", "active_awaiting_free", "inactive"), requested size and,
    while history is recorded, the frames that allocated them."""
    from . import _lazy_init

    _lazy_init()
    return _C._memory_snapshot()


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles _snapshot() to `filename`, the file pytorch.org/memory_viz opens."""
    import pickle

    s = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(s, f)


def memory_snapshot(device=None):
    """The segments of _snapshot(), as torch.cuda.memory_snapshot()."""
    return _snapshot(device)["segments"]


class MemPool:
    """A private memory pool (torch.cuda.MemPool): allocations made under ``use_mem_pool(pool)`` come from
    it, and its memory serves nothing else. Graphs can capture into it (``pool=mem_pool.id``). Its memory
    goes back to the device once the pool is dropped and its tensors are freed."""

    def __init__(self, device=None):
        self._device = _index(device)
        self._id = _C._mempool_create(self._device)

    @property
    def id(self):
        return self._id

    @property
    def allocator(self):
        return None  # the device's own allocator (custom allocators are not supported)

    def use_count(self) -> int:
        return _C._mempool_use_count(self._device, self._id)

    def __del__(self):
        if getattr(self, "_id", None) is not None and _C is not None:
            _C._mempool_release(self._device, self._id)
            self._id = None


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device=None):
    """Routes the calling thread's allocations on ``device`` to ``pool`` for the block
    (torch.cuda.use_mem_pool)."""
    index = _index(device)
    _C._begin_allocate_current_thread_to_pool(index, pool.id)
    try:
        yield
    finally:
        _C._end_allocate_current_thread_to_pool(index, pool.id)
