"""my_device: the `mydev` accelerator for stock PyTorch.

Importing this package (or just `import torch`, through the torch.backends
entry point) registers the device: the PrivateUse1 backend is renamed to
`mydev`, `torch.mydev` becomes the device module, and the generated methods
(`Tensor.mydev()`, `Tensor.is_mydev`, `Module.mydev()`, storages) appear.
"""
import torch

from . import _C  # loads the runtime and registers every kernel
from ._C import fallback_counts, impl_type_name, reset_fallback_counts
from .fallbacks import track_fallbacks
from ._patches import patches

_BACKEND = "mydev"


def _register():
    # rename_privateuse1_backend may run once per process; a second import of
    # this package (autoload, then an explicit import) must not call it again.
    if torch._C._get_privateuse1_backend_name() != _BACKEND:
        torch.utils.rename_privateuse1_backend(_BACKEND)
    _C._register_graph_impl()  # (under the new name: csrc/core/Graph.cpp)
    from . import _patches

    _patches.record(
        "autograd: multithreading_enabled off on each thread that uses a mydev stream (csrc/core/AutogradThread.cpp)",
        why="the engine's per-device thread only added two thread hand-offs per backward, since mydev's kernels "
            "are queued anyway (MYDEV_AUTOGRAD_DEVICE_THREADS=1 keeps torch's default)",
        test="test_autograd_thread.py::test_engine_still_sends_privateuse1_nodes_to_its_device_thread")
    if not hasattr(torch, _BACKEND):
        from . import mydev

        torch._register_device_module(_BACKEND, mydev)
    if not hasattr(torch.Tensor, "is_" + _BACKEND):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True, for_packed_sequence=True
        )


_register()


def _register_dynamo_device_interface(_module) -> None:
    from .inductor.device_interface import register

    register()


from ._import_hooks import when_imported  # noqa: E402

when_imported("torch._dynamo.device_interface", _register_dynamo_device_interface)


def _register_inductor_launch_op(_module) -> None:
    # Code that Inductor's C++ wrapper generated for mydev (an AOTInductor
    # package, too) queues its kernels through this op; a process that only
    # loads a package never runs Inductor's code generation.
    from .inductor.launch import register

    register()


when_imported("torch._inductor", _register_inductor_launch_op)


def _register_inductor_codegen(_module) -> None:
    from .inductor.backend import register_codegen

    register_codegen()


when_imported("torch._inductor.compile_fx", _register_inductor_codegen)

def _inductor_graphs_hook(name):
    def install(module) -> None:
        from .inductor.graphs import HOOKS

        HOOKS[name](module)

    return install


# torch.compile(mode="reduce-overhead") and backend="cudagraphs" replay mydev graphs (inductor/graphs.py).
for _name in ("torch._inductor.cudagraph_utils", "torch._inductor.output_code", "torch._inductor.compile_fx",
              "torch._inductor.cudagraph_trees", "torch._dynamo.backends.cudagraphs"):
    when_imported(_name, _inductor_graphs_hook(_name))

from . import _fake_conv_layout  # noqa: E402

_fake_conv_layout.install()

from . import _data_parallel  # noqa: E402

_data_parallel.install()

from . import _exit  # noqa: E402

_exit.install()

from . import _module_conversion  # noqa: E402

_module_conversion.install()

from . import _dlpack  # noqa: E402

_dlpack.install()

from . import _nested_sdpa  # noqa: E402

_nested_sdpa.install()

from . import _cpu_like_refs  # noqa: E402

_cpu_like_refs.install()

from . import _flex_attention  # noqa: E402

_flex_attention.install()

from . import _settings  # noqa: E402

_settings.install()

# After _register(): swiglu's mydev kernel is registered under the device's name.
from . import ops  # noqa: E402

# Registers the "mccl" collective backend with torch.distributed.
from . import distributed  # noqa: E402


__all__ = ["fallback_counts", "impl_type_name", "ops", "reset_fallback_counts", "track_fallbacks"]
