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
import torch
import torch.distributed as dist

from . import _C

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


_register()

__all__ = ["BACKEND", "is_available"]
