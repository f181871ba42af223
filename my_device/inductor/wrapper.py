"""The Python wrapper Inductor generates around mydev kernels.

It is Inductor's own wrapper with three differences:
- each C++ kernel is compiled with a stream entry point and queued on the
  current mydev stream when called (kernels.py), instead of a Python binding
  that would run it on the host thread;
- buffers are allocated on mydev, by the caching allocator;
- extern kernels (mm, addmm, convolution, attention) are dispatched as Inductor
  already does; on mydev tensors they reach mydev's own kernels.
"""

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
            """,
            strip=True,
        )

    def define_kernel(self, kernel_name, kernel_body, metadata=None, gpu=True, cpp_definition=None):
        # CppScheduling writes every kernel as `async_compile.cpp_pybinding(arg_types, source)`;
        # on mydev the same source is compiled with a stream entry point instead.
        if not gpu and kernel_body.startswith(_PYBINDING):
            kernel_body = f"mydev_cpp_kernel(async_compile, {kernel_name!r}, " + kernel_body[len(_PYBINDING):]
        super().define_kernel(kernel_name, kernel_body, metadata, gpu, cpp_definition)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if device.type == "mydev" and not triton:
            # The kernel object queues itself on the current stream (kernels.MydevKernel).
            self.writeline(self.wrap_kernel_call(kernel_name, call_args))
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)
