"""mydev as Dynamo and Inductor see a device (torch._dynamo.device_interface).

Inductor asks this interface for streams, events, synchronisation and the
device's properties while it compiles and benchmarks; each answer comes from
torch.mydev, so it reflects the runtime (core count, memory) as
torch.cuda's interface reflects the driver.
"""

import torch
from torch._dynamo.device_interface import DeviceInterface

import my_device.mydev as mydev


class MydevInterface(DeviceInterface):
    device = mydev.device
    Event = mydev.Event
    Stream = mydev.Stream

    class Worker:
        # Called from compile workers, which must not start the runtime for a
        # question about properties; torch.mydev's calls are cheap and the
        # runtime is already up in the process that compiles.
        @staticmethod
        def set_device(device: int) -> None:
            mydev.set_device(device)

        @staticmethod
        def current_device() -> int:
            return mydev.current_device()

        @staticmethod
        def get_device_properties(device=None):
            return mydev.get_device_properties(device)

    current_device = staticmethod(mydev.current_device)
    set_device = staticmethod(mydev.set_device)
    device_count = staticmethod(mydev.device_count)
    is_available = staticmethod(mydev.is_available)
    stream = staticmethod(mydev.stream)
    current_stream = staticmethod(mydev.current_stream)
    set_stream = staticmethod(mydev.set_stream)
    synchronize = staticmethod(mydev.synchronize)
    get_device_properties = staticmethod(mydev.get_device_properties)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        previous = mydev.current_device()
        if device >= 0 and device != previous:
            mydev.set_device(device)
        return previous

    exchange_device = maybe_exchange_device

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        mydev.set_stream(
            torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)
        )

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return _raw_stream(device_idx)

    @staticmethod
    def get_compute_capability(device=None):
        major, minor = mydev.get_device_capability(device)
        return major * 10 + minor

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def is_dtype_supported(dtype: torch.dtype, including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def memory_allocated(device=None) -> int:
        return mydev.memory_allocated(device)

    @staticmethod
    def is_triton_capable(device=None) -> bool:
        # Kernels for mydev come from Inductor's C++ code generation.
        return False

    @classmethod
    def raise_if_triton_unavailable(cls, device=None) -> None:
        raise RuntimeError("mydev compiles Inductor kernels with the C++ backend, not Triton")


def _raw_stream(device_idx: int) -> int:
    """The current stream's id, as generated wrappers name a raw stream."""
    return mydev.current_stream(device_idx).stream_id


def register() -> None:
    from torch._dynamo.device_interface import register_interface_for_device

    register_interface_for_device("mydev", MydevInterface)
    for index in range(mydev.device_count()):
        register_interface_for_device(f"mydev:{index}", MydevInterface)
