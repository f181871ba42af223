"""Registration of mydev with Inductor, and the one Inductor path that needs a
per-device workaround."""

import functools

import torch
from torch._inductor.codegen.common import register_device_op_overrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

from .device_op_overrides import MydevDeviceOpOverrides
from .wrapper import MydevPythonWrapperCodegen  # noqa: F401  (torch.mydev.PythonWrapperCodegen)


class MydevScheduling(CppScheduling):
    """Inductor's C++ scheduling; mydev's kernels differ only in how they are
    compiled and launched, which the wrapper decides."""


class MydevCppWrapperCodegen(CppWrapperCpu):
    """Inductor requires a C++-wrapper code generator for every device it
    finds through the privateuse1 module; mydev has none yet, so asking for
    one (torch._inductor.config.cpp_wrapper = True, AOTInductor) fails here
    with the reason instead of deep in code generation. CPU's C++ wrapper
    would call each kernel on the host thread, outside stream order, and name
    the device through an AOTI shim function that does not exist for it
    (aoti_torch_device_type_mydev)."""

    @staticmethod
    def create(*args, **kwargs):
        raise NotImplementedError(
            "mydev: Inductor's C++ wrapper (cpp_wrapper=True, AOTInductor) is not supported; "
            "the Python wrapper queues mydev kernels on the stream"
        )


# Inductor's FX wrapper (config.fx_wrapper) is device-generic; registering it
# as is lets that mode reach the same kernels.
from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen as MydevWrapperFxCodegen  # noqa: E402


def _is_cpp_codegen_node(node) -> bool:
    device = node.get_device()
    return device is not None and device.type in ("cpu", "mydev")


@functools.cache
def _patch_scheduler_cpu_checks() -> None:
    # WORKAROUND (torch 2.13): Scheduler._try_reindex_pointwise_for_reduction
    # and the two loop-reordering checks beside it skip nodes whose device is
    # "cpu", because CppScheduling's node groups are not the (numel, rnumel)
    # pairs of the SIMD backends they assume. They test the device type, not
    # the backend, so for mydev nodes (CppScheduling too) a forward+backward
    # graph fails with "TypeError: can't multiply sequence by non-int of type
    # 'tuple'". BaseSchedulerNode.is_cpu is used only by those three checks, so
    # answering "cpu" for mydev nodes there changes nothing for other devices.
    # test_inductor.py::test_scheduler_cpu_check_workaround_still_needed fails
    # once torch stops needing this.
    from torch._inductor.scheduler import BaseSchedulerNode

    original = BaseSchedulerNode.is_cpu
    if getattr(original, "_mydev_workaround", False):
        return

    def is_cpu(self) -> bool:
        return _is_cpp_codegen_node(self)

    is_cpu._mydev_workaround = True
    is_cpu._original = original
    BaseSchedulerNode.is_cpu = is_cpu


@functools.cache
def register() -> None:
    """Everything Inductor needs beyond what it asks torch.mydev for."""
    register_device_op_overrides("mydev", MydevDeviceOpOverrides())
    _patch_scheduler_cpu_checks()
    # The device interface is normally registered by the import hook; a
    # process that imported torch._dynamo before my_device gets it here.
    from .device_interface import register as register_interface

    register_interface()
