"""torch.mydev.amp: mixed precision on mydev, with torch.cuda.amp's names and defaults.

`torch.mydev.amp.autocast(...)` is `torch.autocast("mydev", ...)` and `torch.mydev.amp.GradScaler(...)`
is `torch.amp.GradScaler("mydev", ...)`: shorthands for code written against `torch.cuda.amp` (which
`my_device.transfer_to_mydev` points at this module). Unlike torch.cuda.amp's, they are not deprecated:
the device-generic spellings are the same objects with the device named.

The per-op cast policies are registered in C++ (csrc/amp/Autocast.cpp: CUDA's op lists;
csrc/amp/AutocastCustomOps.cpp: the my_device:: ops), and GradScaler's two device ops are queued
mydev kernels (csrc/amp/AmpGradScalerKernels.cpp).
"""
from typing import Any

import torch

__all__ = ["GradScaler", "amp_definitely_not_available", "autocast", "custom_bwd", "custom_fwd"]

_DEVICE = "mydev"


def amp_definitely_not_available() -> bool:
    """True when no mydev device is present (mirrors torch.cuda.amp.common)."""
    from . import is_available

    return not is_available()


class autocast(torch.amp.autocast_mode.autocast):
    """`torch.autocast("mydev", ...)`, with torch.cuda.amp.autocast's signature: the lower-precision
    dtype defaults to float16, as `torch.get_autocast_dtype("mydev")` does."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        if torch._jit_internal.is_scripting():
            self._enabled = enabled
            self.device = _DEVICE
            self.fast_dtype = dtype
            return
        super().__init__(_DEVICE, enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)

    def __enter__(self):
        if torch._jit_internal.is_scripting():
            return self
        return super().__enter__()

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any):  # type: ignore[override]
        if torch._jit_internal.is_scripting():
            return None
        return super().__exit__(exc_type, exc_val, exc_tb)

    def __call__(self, func):
        if torch._jit_internal.is_scripting():
            return func
        return super().__call__(func)


class GradScaler(torch.amp.GradScaler):
    """`torch.amp.GradScaler("mydev", ...)`. Unscaling, the inf/NaN check and the scale update are
    queued on the device; the host waits only where GradScaler reads a value (`step()` reads
    whether an inf was found, as on CUDA)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        super().__init__(_DEVICE, init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """`torch.amp.custom_fwd(..., device_type="mydev")`."""
    return torch.amp.custom_fwd(fwd, device_type=_DEVICE, cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    """`torch.amp.custom_bwd(..., device_type="mydev")`."""
    return torch.amp.custom_bwd(bwd, device_type=_DEVICE)
