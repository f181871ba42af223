"""torch.mydev: device management for the mydev accelerator, mirroring torch.cuda."""
import threading
from typing import Any, Optional, Union

import torch

from .. import _C

_initialized = False
_init_lock = threading.Lock()

_DeviceLike = Union[torch.device, str, int, None]


def is_available() -> bool:
    return _C._device_count() > 0


def device_count() -> int:
    return _C._device_count()


def _is_in_bad_fork() -> bool:
    return _C._is_in_bad_fork()


def is_initialized() -> bool:
    return _initialized and not _is_in_bad_fork()


def _lazy_init() -> None:
    global _initialized
    if is_initialized():
        return
    with _init_lock:
        if is_initialized():
            return
        if _is_in_bad_fork():
            raise RuntimeError(
                "Cannot re-initialize mydev in forked subprocess. To use mydev with "
                "multiprocessing, you must use the 'spawn' start method"
            )
        _C._init()
        _initialized = True


def init() -> None:
    _lazy_init()


def _get_device_index(device: _DeviceLike, optional: bool = False) -> int:
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "mydev":
            raise ValueError(f"Expected a mydev device, but got: {device}")
        index = device.index
    elif isinstance(device, int):
        index = device
    elif device is None:
        index = None
    else:
        raise TypeError(f"Invalid device: {device!r}")
    if index is None:
        if not optional:
            raise ValueError(f"Expected a mydev device with a specified index or an integer, but got: {device}")
        return current_device()
    return index


def current_device() -> int:
    _lazy_init()
    return _C._current_device()


def set_device(device: _DeviceLike) -> None:
    index = _get_device_index(device)
    if index >= 0:
        _lazy_init()
        _C._set_device(index)


class device:
    """Context manager that changes the current mydev device, restoring it on exit (even on error)."""

    def __init__(self, device: Any):
        self.idx = _get_device_index(device, optional=True) if device is not None else -1
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            _lazy_init()
            self.prev_idx = _C._exchange_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.idx >= 0 and self.prev_idx >= 0:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of a tensor the current one."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "mydev" else -1)


def synchronize(device: _DeviceLike = None) -> None:
    """Waits for all work queued on a mydev device."""
    _lazy_init()
    _C._synchronize(_get_device_index(device, optional=True))


def set_sync_debug_mode(debug_mode: Union[int, str]) -> None:
    """As torch.cuda.set_sync_debug_mode: "default" (0) says nothing, "warn" (1)
    warns and "error" (2) raises when an operation makes the host wait for the
    device: a synchronous copy to or from the host, `.item()`, printing, or an op
    run at the call (see docs/async-execution.md). Explicit synchronisations are not reported."""
    _lazy_init()
    if isinstance(debug_mode, str):
        modes = {"default": 0, "warn": 1, "error": 2}
        if debug_mode not in modes:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = modes[debug_mode]
    _C._set_sync_debug_mode(debug_mode)


def get_sync_debug_mode() -> int:
    """The mode set_sync_debug_mode set: 0, 1 or 2."""
    _lazy_init()
    return _C._get_sync_debug_mode()


def get_device_properties(device: _DeviceLike = None):
    _lazy_init()
    props = _C._get_device_properties(_get_device_index(device, optional=True))
    return _DeviceProperties(**props)


class _DeviceProperties:
    def __init__(self, name, total_memory, multi_processor_count, major, minor):
        self.name = name
        self.total_memory = total_memory
        self.multi_processor_count = multi_processor_count
        self.major = major
        self.minor = minor

    def __repr__(self):
        return (
            f"_MyDevDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


def get_device_name(device: _DeviceLike = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: _DeviceLike = None):
    props = get_device_properties(device)
    return props.major, props.minor


def get_amp_supported_dtype():
    # float32 and float64 too: CUDA's autocast takes any floating dtype, and autocast asks a
    # PrivateUse1 device this list instead (it warns and disables itself for a dtype not in it).
    return [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """True: mydev computes bfloat16 natively (as the CPU does)."""
    return True


def is_tf32_supported() -> bool:
    """False: mydev computes float32 matrix products in float32."""
    return False


def can_device_access_peer(device: _DeviceLike, peer_device: _DeviceLike) -> bool:
    """Whether `device` can read `peer_device`'s memory directly: every mydev device can (copies
    between them need no host staging)."""
    index, peer = _get_device_index(device, optional=True), _get_device_index(peer_device, optional=True)
    count = device_count()
    if not (0 <= index < count and 0 <= peer < count):
        raise AssertionError("Invalid peer device id" if 0 <= index < count else "Invalid device id")
    return True


# The error types torch.cuda exports, which are torch's own.
OutOfMemoryError = torch.OutOfMemoryError
AcceleratorError = torch.AcceleratorError


from .memory import *  # noqa: E402,F401,F403
from .random import *  # noqa: E402,F401,F403
from .streams import *  # noqa: E402,F401,F403
from .graphs import *  # noqa: E402,F401,F403
from .storage import *  # noqa: E402,F401,F403  (FloatStorage and its siblings)
from . import amp  # noqa: E402,F401  (torch.mydev.amp, as torch.cuda.amp)


# Inductor asks the privateuse1 device module for its code generators the first
# time it compiles for mydev (torch._inductor.codegen.common.
# init_backend_registration); they are imported only then.
_INDUCTOR_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")


def __getattr__(name: str):
    if name in _INDUCTOR_NAMES:
        from ..inductor import backend

        backend.register()
        return getattr(backend, "Mydev" + name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
