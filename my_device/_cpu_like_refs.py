"""PyTorch's reference of native_layer_norm, which is also its fake (and meta) kernel, answers for mydev as for
the CPU, whose kernel mydev runs.

For a reduced-precision input (bfloat16, float16) the CPU kernel returns the mean and rstd in the input's
dtype, CUDA's in float32. torch._refs.native_layer_norm gives the input's dtype only on "cpu" and "mtia" and
float32 elsewhere, so for a mydev tensor FakeTensor (torch.compile) promised float32 statistics where the
kernel makes bfloat16 ones (and test_ops.py's reference tests failed on mydev). The wrapper converts the
reference's statistics to the input's dtype for mydev inputs, as the reference does for the CPU.
test_refs_layer_norm.py notices when torch's reference treats mydev as it treats the CPU by itself.

The meta kernels in torch._meta_registrations (FakeTensor's, too) choose between the CPU kernel's and CUDA's
output shapes with device_hint(), which names a fake tensor's device. Every device but "cpu" (and a few that
are named) gets CUDA's: _embedding_bag's offset2bag, bag_size and max_indices, the strides of a c2c FFT,
nonzero_static's. mydev runs the CPU's kernels, so compiled code asserted CUDA's sizes on the CPU kernel's
outputs ("expected size 2==3" in embedding_bag's backward). device_hint answers "cpu" for mydev.
test_fake_kernels.py notices when torch no longer needs this.
"""
import torch


def _install(refs) -> None:
    from . import _patches

    original = refs.native_layer_norm

    def native_layer_norm(input, normalized_shape, weight, bias, eps):
        out, mean, rstd = original(input, normalized_shape, weight, bias, eps)
        if input.device.type == "mydev":
            mean, rstd = mean.to(input.dtype), rstd.to(input.dtype)
        return out, mean, rstd

    native_layer_norm.__doc__ = original.__doc__
    # native_layer_norm_fake (torch._refs) calls it by its module-global name.
    _patches.replace(refs, "native_layer_norm", native_layer_norm, target="torch._refs.native_layer_norm",
                     why="it gives reduced-precision statistics the input's dtype on cpu and mtia only; mydev runs "
                         "the CPU kernel, so FakeTensor promised float32 mean/rstd where the kernel makes bfloat16",
                     test="test_refs_layer_norm.py::test_torch_reference_still_treats_only_cpu_as_cpu")


def _install_device_hint(meta_registrations) -> None:
    from . import _patches

    original = meta_registrations.device_hint

    def device_hint(tensor) -> str:
        answer = original(tensor)
        return "cpu" if answer == "mydev" else answer

    # The meta kernels call it by its module-global name.
    _patches.replace(meta_registrations, "device_hint", device_hint, target="torch._meta_registrations.device_hint",
                     why="meta kernels give CUDA's output shapes to every device but the CPU; mydev runs the CPU's "
                         "kernels, and compiled code asserted CUDA's sizes on their outputs",
                     test="test_fake_kernels.py::test_device_hint_workaround_still_needed")


def install() -> None:
    from ._import_hooks import when_imported

    when_imported("torch._refs", _install)
    when_imported("torch._meta_registrations", _install_device_hint)
