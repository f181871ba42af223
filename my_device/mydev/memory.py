"""Device memory: allocator statistics and cache control, mirroring torch.cuda.memory."""
from typing import Optional

from .. import _C

__all__ = ["memory_allocated", "memory_reserved", "empty_cache", "mem_get_info"]


def _index(device) -> int:
    from . import _get_device_index, _lazy_init

    _lazy_init()
    return _get_device_index(device, optional=True)


def memory_allocated(device=None) -> int:
    """Bytes occupied by live tensors on the device (block-rounded sizes)."""
    return _C._memory_stats(_index(device))["allocated_bytes"]


def memory_reserved(device=None) -> int:
    """Bytes the caching allocator holds from the runtime: allocated plus cached."""
    return _C._memory_stats(_index(device))["reserved_bytes"]


def empty_cache() -> None:
    """Returns all cached, unused device memory to the runtime."""
    _C._empty_cache()


def mem_get_info(device=None):
    """(free, total) bytes of the device, as the runtime reports them."""
    return _C._mem_get_info(_index(device))
