"""The layout fake tensors give a mydev convolution's output.

WORKAROUND (torch 2.13): under torch.compile, a convolution's fake kernel asks
torch._C._conv_determine_backend_memory_format which layout the backend gives,
and for an out-of-tree device (the Overrideable backend) the answer is always
contiguous. mydev's convolution gives what the CPU's and CUDA's give: a
channels-last output when the input or the weight is channels-last
(csrc/native/Convolution.cpp, output_strides). Inductor's layout optimisation
makes those inputs channels-last, and compiled code that trusted the fake
kernel read the real output with the wrong strides. This answers for mydev
tensors as the kernel does.
test_aoti.py::test_fake_conv_layout_workaround_still_needed fails once torch
asks the device.
"""

import torch
from torch._prims_common import suggest_memory_format

_original = torch._C._conv_determine_backend_memory_format


def _mydev_output_format(input, weight):
    for t in (input, weight):
        fmt = suggest_memory_format(t)
        if (fmt == torch.channels_last and input.dim() == 4) or (fmt == torch.channels_last_3d and input.dim() == 5):
            return fmt
    return torch.contiguous_format


def _determine_backend_memory_format(input, weight, backend):
    if backend == torch._C._ConvBackend.Overrideable and input.device.type == "mydev":
        return _mydev_output_format(input, weight)
    return _original(input, weight, backend)


def install() -> None:
    from . import _patches

    _patches.replace(
        torch._C, "_conv_determine_backend_memory_format", _determine_backend_memory_format,
        target="torch._C._conv_determine_backend_memory_format",
        why="for an out-of-tree device it always says contiguous, while mydev's convolution returns channels-last "
            "for channels-last inputs: compiled code read outputs with the wrong strides",
        test="test_aoti.py::test_fake_conv_layout_workaround_still_needed")
