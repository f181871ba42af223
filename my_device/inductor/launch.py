"""The dispatcher op through which C++ code generated for mydev (Inductor's
C++ wrapper, AOTInductor) queues a kernel on the current mydev stream.

A generated C++ wrapper cannot reach my_device._C: the extension is loaded
privately (RTLD_LOCAL) and a packaged model may be loaded by a process that
never named it. The dispatcher is the one registry both can see, so the
wrapper calls `mydev_inductor::launch` through the stable C API
(torch_call_dispatcher) with the address of a kernel's entry point in its own
library, and this op hands the call to the launcher the Python wrapper uses
(my_device._C._inductor.launch, csrc/inductor/KernelLaunch.cpp): the kernel
is queued on the current stream, its tensors are leased until it ran, and a
failure is reported at the next synchronisation under the kernel's name.
"""

import functools

import torch

from .. import _C

# entry: address of `void entry(const int64_t*)` in the generated library;
# values: one int64 per kernel argument (a double as its bits), tensors in the
# positions listed by tensor_slots.
SCHEMA = "launch(int entry, str name, Tensor[] tensors, int[] tensor_slots, int[] values) -> ()"


def _launch(entry: int, name: str, tensors, tensor_slots, values) -> None:
    args = list(values)
    for slot, tensor in zip(tensor_slots, tensors):
        args[slot] = tensor
    _C._inductor.launch(entry, name, *args)


@functools.cache
def register() -> None:
    lib = torch.library.Library("mydev_inductor", "DEF")
    lib.define(SCHEMA)
    # One kernel for every backend: a tensor on another device reaches the
    # launcher, which rejects it naming the kernel and the argument.
    lib.impl("launch", _launch, "CompositeExplicitAutograd")
    register.library = lib  # a Library unregisters its ops when collected
