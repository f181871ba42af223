"""torch.distributed on mydev: the ``mccl`` collective backend.

Importing my_device registers ``mccl`` with ``torch.distributed.Backend.register_backend``
for the ``mydev`` device and as its default backend, so that::

    dist.init_process_group()                        # mccl for mydev tensors (the accelerator's default)
    dist.init_process_group("cpu:gloo,mydev:mccl")   # gloo for CPU tensors, mccl for mydev tensors
    dist.init_process_group("mccl")                  # mydev tensors only, as "nccl" is CUDA only

mccl (csrc/distributed/ProcessGroupMCCL.h) runs each operation on the device memory itself, in
the order of the caller's current mydev stream, over gloo's transport: the process group it
creates here is a ProcessGroupGloo of its own, which it hands CPU tensors aliasing that memory.
Work objects complete asynchronously and ``wait()`` makes the current stream wait, as with NCCL.
"""
import functools

import torch
import torch.distributed as dist

from . import _C, _patches

BACKEND = "mccl"
DEVICE = "mydev"


def _create_mccl(store, rank, world_size, timeout):
    # The transport: gloo's connections between the same ranks, rendezvousing
    # through the store c10d gave this backend (already prefixed with the
    # group's name and the device, so a "cpu:gloo" backend of the same group
    # does not collide with it).
    transport = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    return _C._distributed._create_mccl(transport, rank, world_size, timeout.total_seconds())


def is_available() -> bool:
    return dist.is_available() and hasattr(dist, "ProcessGroupGloo")


def _register():
    if not is_available() or BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create_mccl, devices=[DEVICE])
    _install_default_backend_fix()


def _fix_default_backend(pg):
    """Workaround for torch 2.13: init_process_group() with no backend (BackendConfig "undefined")
    sets the group's default backend type to GLOO unless NCCL is among its backends, even when the
    accelerator's backend is a registered plugin (mccl, type CUSTOM). The group then has no backend
    of its default type, and whatever asks for it fails: DDP's constructor (its logger calls
    getBackendName) raises "Could not find backend type 1 for Process Group". A group whose only
    backend is mccl gets it as its default, as init_process_group("mccl") sets it.
    test_distributed.py::test_torch_still_needs_the_default_backend_fix notices when torch fixes it."""
    if not isinstance(pg, dist.ProcessGroup):
        return
    try:
        if pg._get_backend(torch.device(DEVICE)).name() != BACKEND:
            return
    except RuntimeError:
        return  # no mydev backend
    try:
        pg._get_backend(torch.device("cpu"))
        return  # a CPU backend too ("cpu:gloo,mydev:mccl"): not the case above
    except RuntimeError:
        pass
    pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)


def _install_default_backend_fix():
    c10d = dist.distributed_c10d
    original = c10d._new_process_group_helper
    if getattr(original, "_torch_original", None) is not None:
        return

    @functools.wraps(original)
    def new_process_group_helper(*args, **kwargs):
        pg, prefix_store = original(*args, **kwargs)
        _fix_default_backend(pg)
        return pg, prefix_store

    _patches.replace(
        c10d, "_new_process_group_helper", new_process_group_helper,
        target="torch.distributed.distributed_c10d._new_process_group_helper",
        why="a group created without a backend gets the default type gloo unless it uses NCCL, and DDP's "
            "constructor then fails with a plugin backend: a group whose only backend is mccl gets it as default",
        test="test_distributed.py::test_torch_still_needs_the_default_backend_fix")


_register()

__all__ = ["BACKEND", "is_available"]
