"""What Inductor's generated wrapper writes to set the mydev device, wait for it
and guard it (torch._inductor.codegen.common.DeviceOpOverrides)."""

from torch._inductor.codegen.common import DeviceOpOverrides


class MydevDeviceOpOverrides(DeviceOpOverrides):
    def import_get_raw_stream_as(self, name: str) -> str:
        return f"from my_device.inductor.device_interface import _raw_stream as {name}"

    def set_device(self, device_idx: int) -> str:
        return f"torch.mydev.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.mydev.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.mydev.device({device_idx})"

    def current_stream(self) -> str:
        return "torch.mydev.current_stream()"

    def cpp_kernel_type(self) -> str:
        # AOTInductor declares a slot per kernel in its model class; mydev's
        # kernels are functions compiled into the model, as CPU's are.
        return "void*"
