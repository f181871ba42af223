"""nn.DataParallel on mydev devices: torch.nn.parallel.comm for mydev tensors.

Workaround for torch 2.13: DataParallel, replicate, scatter and gather are device-generic
(they ask torch.accelerator), but the collectives under them, torch.nn.parallel.comm's broadcast,
broadcast_coalesced, scatter, gather and reduce_add, call bindings (torch._C._scatter, ...) that
only CUDA builds have; reduce_add asks torch.cuda.nccl first, which warns on every call in a build
without NCCL. install() wraps those five functions: given mydev tensors they run here, with
CUDA's semantics (a tensor already on a target device is used as it is, not copied; copies to
other devices are non-blocking and, for scatter, made on the streams given); anything else goes
to torch's function. test_data_parallel.py::test_cpu_torch_still_lacks_the_comm_bindings notices when a
CPU build of torch gains the bindings.
"""
import contextlib
import functools

import torch
from torch.nn.parallel import comm
from torch.utils._pytree import tree_leaves

from . import _patches

DEVICE = "mydev"


def _on_mydev(tensors) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == DEVICE for t in tensors)


def _device(index) -> torch.device:
    return torch.device(DEVICE, index)


def _to(tensor, index):
    """`tensor` on mydev:`index`: itself if it is there already, else a non-blocking copy."""
    return tensor.to(_device(index), non_blocking=True)


def broadcast(tensor, devices=None, *, out=None):
    if out is not None:
        for o in out:
            o.copy_(tensor, non_blocking=True)
        return tuple(out)
    return tuple(_to(tensor, comm._get_device_index(d)) for d in devices)


def broadcast_coalesced(tensors, devices, buffer_size=10485760):
    devices = [comm._get_device_index(d) for d in devices]
    source = tensors[0].get_device() if tensors else devices[0]
    if any(t.get_device() != source for t in tensors) or devices[0] != source:
        raise RuntimeError(f"All tensors must be on devices[0]: {devices[0]}")
    # One flat buffer per dtype and device, as CUDA's coalesced copy: a launch per bucket, not per tensor.
    outputs = [list(tensors)]
    buckets = {}
    for i, t in enumerate(tensors):
        buckets.setdefault(t.dtype, []).append(i)
    for index in devices[1:]:
        copies = [None] * len(tensors)
        for dtype, positions in buckets.items():
            flat = torch._utils._flatten_dense_tensors([tensors[i].detach() for i in positions])
            for i, part in zip(positions, torch._utils._unflatten_dense_tensors(_to(flat, index),
                                                                               [tensors[i] for i in positions])):
                copies[i] = part
        outputs.append(copies)
    return outputs


def scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
    if out is not None:
        chunks = tensor.split([o.size(dim) for o in out], dim)
        for i, (o, chunk) in enumerate(zip(out, chunks)):
            with torch.mydev.stream(streams[i]) if streams and streams[i] is not None else contextlib.nullcontext():
                o.copy_(chunk, non_blocking=True)
        return tuple(out)
    devices = [comm._get_device_index(d) for d in devices]
    if chunk_sizes is not None:
        if len(chunk_sizes) != len(devices):
            raise RuntimeError(f"Expected devices and chunk_sizes to be of same length, but got len(devices) = "
                               f"{len(devices)} and len(chunk_sizes) = {len(chunk_sizes)}")
        if sum(chunk_sizes) != tensor.size(dim):
            raise RuntimeError(f"Expected chunk sizes to sum to {tensor.size(dim)}, but got a sum of "
                               f"{sum(chunk_sizes)}")
        chunks = tensor.split(list(chunk_sizes), dim)
    else:
        chunks = tensor.chunk(len(devices), dim)
    results = []
    for i, (chunk, index) in enumerate(zip(chunks, devices)):
        stream = streams[i] if streams else None
        with torch.mydev.stream(stream) if stream is not None else contextlib.nullcontext():
            results.append(_to(chunk, index))
    return tuple(results)


def gather(tensors, dim=0, destination=None, *, out=None):
    if out is not None:
        out.copy_(torch.cat([t.to(out.device, non_blocking=True) for t in tensors], dim), non_blocking=True)
        return out
    destination = comm._get_device_index(destination, allow_cpu=True, optional=True)
    target = torch.device("cpu") if destination == -1 else _device(destination)
    return torch.cat([t.to(target, non_blocking=target.type == DEVICE) for t in tensors], dim)


def reduce_add(inputs, destination=None):
    destination = comm._get_device_index(destination, optional=True)
    root = next((i for i, t in enumerate(inputs) if t.get_device() == destination), None)
    if root is None:
        raise RuntimeError("reduce_add expects destination to be on the same GPU with one of the tensors")
    for i, t in enumerate(inputs):
        if t.size() != inputs[0].size():
            got, want = "x".join(map(str, t.size())), "x".join(map(str, inputs[0].size()))
            raise ValueError(f"input {i} has invalid size: got {got}, but expected {want}")
    if len(inputs) == 1:
        return inputs[0]
    result = inputs[root].clone()
    for i, t in enumerate(inputs):
        if i != root:
            result.add_(_to(t, destination))
    return result


def _wrap(name, mine, tensors_of):
    original = getattr(comm, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if _on_mydev(tensors_of(*args, **kwargs)):
            return mine(*args, **kwargs)
        return original(*args, **kwargs)

    _patches.replace(comm, name, wrapper, target=f"torch.nn.parallel.comm.{name}",
                     why="it calls bindings only CUDA builds have, so nn.DataParallel failed on mydev",
                     test="test_data_parallel.py::test_cpu_torch_still_lacks_the_comm_bindings")


class _WithAutocast:
    """A replica called inside the caller's mydev autocast region, entered in the worker thread."""

    def __init__(self, module, enabled, dtype, cache):
        self.module, self.enabled, self.dtype, self.cache = module, enabled, dtype, cache

    def __call__(self, *args, **kwargs):
        with torch.autocast(DEVICE, dtype=self.dtype, enabled=self.enabled, cache_enabled=self.cache):
            return self.module(*args, **kwargs)


def _install_autocast_in_replicas():
    # Workaround for torch 2.13: parallel_apply reopens the caller's autocast region in each worker thread
    # from torch.is_autocast_enabled(), which with no device type asks about CUDA, and with the device's
    # default dtype (autocast's state is per thread): on mydev the replicas ran in float32 inside a
    # bfloat16 region. Replicas on mydev get the caller's mydev region, its dtype included.
    import importlib

    # (torch.nn.parallel.parallel_apply names the function; its module is reached by import_module)
    module = importlib.import_module("torch.nn.parallel.parallel_apply")
    data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")

    original = module.parallel_apply

    @functools.wraps(original)
    def parallel_apply(modules, inputs, kwargs_tup=None, devices=None):
        if torch.is_autocast_enabled(DEVICE) and _on_mydev(tree_leaves(inputs)):
            state = (True, torch.get_autocast_dtype(DEVICE), torch.is_autocast_cache_enabled())
            modules = [_WithAutocast(m, *state) for m in modules]
        return original(modules, inputs, kwargs_tup, devices)

    for owner in (module, data_parallel):
        _patches.replace(owner, "parallel_apply", parallel_apply, target=f"{owner.__name__}.parallel_apply",
                         why="its worker threads reopen CUDA's autocast region, not the device's, so replicas on "
                             "mydev ran outside autocast",
                         test="test_data_parallel.py::test_torch_replicas_still_run_outside_mydev_autocast")


def install():
    if getattr(comm.scatter, "_torch_original", None) is not None:
        return
    _install_autocast_in_replicas()
    first = lambda tensor, *args, **kwargs: [tensor]  # noqa: E731
    listed = lambda tensors, *args, **kwargs: list(tensors)  # noqa: E731
    _wrap("broadcast", broadcast, first)
    _wrap("broadcast_coalesced", broadcast_coalesced, listed)
    _wrap("scatter", scatter, first)
    _wrap("gather", gather, listed)
    _wrap("reduce_add", reduce_add, listed)
