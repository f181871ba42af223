"""The Python wrapper Inductor generates around mydev kernels.

It is Inductor's own wrapper with three differences:
- each C++ kernel is compiled with a stream entry point and queued on the
  current mydev stream when called (kernels.py), instead of a Python binding
  that would run it on the host thread;
- buffers are allocated on their mydev device (index included), by the caching
  allocator;
- extern kernels (mm, addmm, convolution, attention) are dispatched as Inductor
  already does; on mydev tensors they reach mydev's own kernels.
"""

import torch
from torch._inductor.codegen.wrapper import PythonWrapperCodegen
from torch._inductor.virtualized import V

_PYBINDING = "async_compile.cpp_pybinding("


class MydevPythonWrapperCodegen(PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            from torch._inductor.codegen.wrapper import SubgraphPythonWrapperCodegen

            return SubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return MydevPythonWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.splice(
            """
                import my_device
                from my_device.inductor.kernels import cpp_kernel as mydev_cpp_kernel
                empty_strided_mydev = my_device._C._inductor.empty_strided
            """,
            strip=True,
        )

    def define_kernel(self, kernel_name, kernel_body, metadata=None, gpu=True, cpp_definition=None):
        # CppScheduling writes every kernel as `async_compile.cpp_pybinding(arg_types, source)`;
        # on mydev the same source is compiled with a stream entry point instead.
        if not gpu and kernel_body.startswith(_PYBINDING):
            kernel_body = f"mydev_cpp_kernel(async_compile, {kernel_name!r}, " + kernel_body[len(_PYBINDING):]
        super().define_kernel(kernel_name, kernel_body, metadata, gpu, cpp_definition)

    def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
        if device.type != "mydev" or torch._inductor.config.test_configs.track_memory_lifecycle:
            return super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
        allocation_shape = shape if allocation_shape is None else allocation_shape
        sizes = self.codegen_python_shape_tuple(allocation_shape)
        strides = self.codegen_python_shape_tuple(stride)
        # The device index is explicit: the generic path drops it, and Inductor
        # emits no device guard for a device it does not know as a GPU.
        index = device.index if device.index is not None else "torch.mydev.current_device()"
        out = f"{name} = empty_strided_mydev({sizes}, {strides}, {dtype}, {index})"
        if allocation_shape != shape:
            out += f".as_strided({self.codegen_python_shape_tuple(shape)}, {strides})"
        return out

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if device.type == "mydev" and not triton:
            # The kernel object queues itself on the current stream (kernels.MydevKernel).
            self.writeline(self.wrap_kernel_call(kernel_name, call_args))
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)
