"""Lazy tensors on mydev: traced graphs compiled by the mydev graph compiler.

    import my_device.lazy, torch._lazy
    my_device.lazy.init()
    x = torch.randn(3, device="lazy")        # data lives in mydev memory
    y = x + 1                                 # traced, not run
    torch._lazy.mark_step()                   # compiled once per graph (cached by hash), run as ONE launch

Tracing is PyTorch's own (the TorchScript lazy kernels, with functionalization); each traced graph is
lowered into a mydev program (csrc/lazy/Backend.cpp, through the TorchScript frontend) the first time
it runs. Ops without a lazy kernel run through the backend's eager fallback on mydev tensors, counted
in metrics()["fallback_ops"] and in my_device.fallback_counts() / track_fallbacks() as "lazy::<op>".
"""
from . import _C


def init():
    """Registers the mydev Lazy Tensor backend (once per process; torch._lazy's TorchScript backend must
    not be initialised in the same process)."""
    _C._lazy.init()


def metrics():
    """graphs_compiled, cache_hits (LTC's graph cache), executions, fallback_ops, transfer_bytes
    (host bytes copied into lazy tensors' device data)."""
    import torch._lazy.metrics as lm

    out = dict(_C._lazy.metrics())
    out["cache_hits"] = lm.counter_value("CachedCompile") or 0
    return out


def last_graph():
    """A readable dump of the last program built from a traced graph."""
    return _C._lazy.last_graph()


def device_data(tensor):
    """The mydev tensor holding a lazy tensor's value once materialised (after mark_step), else None."""
    return _C._lazy.device_data(tensor)


__all__ = ["device_data", "init", "last_graph", "metrics"]
