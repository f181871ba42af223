"""Inductor on mydev: the default torch.compile for mydev tensors.

Inductor's C++ (CPU) code generation writes mydev's kernels, since device
memory is host-addressable in this runtime; what is mydev's own is how they
run: compiled with a stream entry point and queued on the current mydev
stream (kernels.py), in a wrapper that allocates on mydev (wrapper.py).

PyTorch finds these pieces by itself: Inductor asks the privateuse1 device
module (torch.mydev) for `Scheduling` and `PythonWrapperCodegen` the first
time it compiles for mydev (backend.py answers), and Dynamo's device
interface (device_interface.py) is registered when torch._dynamo is imported
(my_device/_import_hooks.py). This package imports nothing itself: its
modules are loaded in the middle of torch._dynamo's and torch._inductor's
own imports, and `import my_device` stays cheap for eager users.
"""
