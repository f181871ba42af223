"""Registration of mydev with Inductor, and the one Inductor path that needs a
per-device workaround."""

import contextlib
import functools
from pathlib import Path

import torch

from .. import _C, _patches
from torch._inductor.codegen.common import register_backend_for_device, register_device_op_overrides
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files
from torch._inductor import config
from torch._inductor.codegen.cpp import CppScheduling

from . import kernels
from .cpp_wrapper import MydevCppWrapperCodegen  # noqa: F401  (torch.mydev.CppWrapperCodegen)
from .device_op_overrides import MydevDeviceOpOverrides
from .wrapper import MydevPythonWrapperCodegen  # noqa: F401  (torch.mydev.PythonWrapperCodegen)


class MydevScheduling(CppScheduling):
    """Inductor's C++ scheduling; mydev's kernels differ in how they are compiled and launched, which the
    wrapper decides, and in the thread count they are written for (a generated kernel names its OpenMP team's
    size, `num_threads`, rather than taking the thread's): the device's compute units when its kernels have one
    intra-op thread (their parallel regions then run as teams on the units: kernel_team.h), otherwise the intra-op
    threads of mydev's kernels (my_device._C._kernel_intra_op_threads, one fewer than the cores when torch's
    setting asks for them all)."""

    def codegen_node(self, node):
        with _kernel_threads():
            return super().codegen_node(node)

    # (Templates, flex attention's and the GEMMs', keep torch's count: theirs is fixed in part when they are
    # lowered, outside code generation, and a template's per-thread buffers must cover every thread its
    # parallel_for can run, which is at most the kernel's count.)


def _kernel_threads():
    """config.cpp.threads, which parallel_num_threads() reads first, as mydev's kernels run; unchanged when
    set, or when kernels read the thread's count at run time (config.cpp.dynamic_threads)."""
    if config.cpp.threads >= 1 or config.cpp.dynamic_threads:
        return contextlib.nullcontext()
    return config.patch({"cpp.threads": kernels.written_for()})


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

    def is_cpu(self) -> bool:
        return _is_cpp_codegen_node(self)

    _patches.replace(
        BaseSchedulerNode, "is_cpu", is_cpu, target="torch._inductor.scheduler.BaseSchedulerNode.is_cpu",
        why="three scheduler checks skip nodes whose device is 'cpu' (CppScheduling's node groups differ from "
            "the SIMD backends'); they test the device type, not the backend: true for mydev nodes",
        test="test_inductor.py::test_scheduler_cpu_check_workaround_still_needed")


@functools.cache
def _patch_realization_heuristics() -> None:
    # WORKAROUND (torch 2.13): ir.is_cpu picks the C++ backend's thresholds for
    # when lowering realizes an intermediate into a buffer (an inner function's
    # op count, the reads accumulated, reuse of heavy ops), by device type, so
    # mydev, whose kernels CppScheduling writes too, got the GPU backends'. With
    # them a max pooling's int8 window offsets became a buffer of their own,
    # and the loop writing them ran unvectorized: max_pool2d(relu(x + b)) on
    # (8, 16, 32, 32) compiled ran 2.5x the CPU's time (1.04 against 0.42 ms);
    # with the CPU's thresholds the kernels are the CPU's. ir.is_cpu is used by
    # those three heuristics only. test_inductor.py::
    # test_realization_heuristics_workaround_still_needed fails once torch asks
    # the backend instead.
    import torch._inductor.ir as ir

    _wrap(ir, "is_cpu", lambda x: True if ir.get_device_type(x) == "mydev" else None,
          why="lowering's realization thresholds are the C++ backend's only for device type 'cpu'; mydev's "
              "kernels are C++ too, and with the GPU thresholds a pooling's kernel was not vectorized",
          test="test_inductor.py::test_realization_heuristics_workaround_still_needed")


@functools.cache
def _patch_division_by_constant() -> None:
    # WORKAROUND (torch 2.13): Inductor's lowering of prims.div turns a
    # division by a constant into a multiplication by its reciprocal on every
    # device but "cpu", where it keeps the division for eager's results. mydev
    # runs the CPU's C++ kernels, whose results should be the CPU's: compiled
    # x / 3.0 differed from eager's in a third of the elements. The lowering
    # finds the constant through lowering.get_constant_value (its one caller
    # beside a CPU-only oneDNN lowering), which answers None for a mydev node.
    # test_inductor.py::test_division_by_constant_workaround_still_needed fails
    # once torch decides by the backend.
    import torch._inductor.lowering as lowering

    def hide_mydev_constants(original):
        def get_constant_value(x):
            device = x.get_device() if hasattr(x, "get_device") else None
            return None if device is not None and device.type == "mydev" else original(x)

        return get_constant_value

    _replace(lowering, "get_constant_value", hide_mydev_constants,
             why="a division by a constant becomes a multiplication by its reciprocal on every device but 'cpu'; "
                 "mydev runs the CPU's kernels and keeps the division, for eager's results",
             test="test_inductor.py::test_division_by_constant_workaround_still_needed")


@functools.cache
def _patch_scatter_fallback() -> None:
    # WORKAROUND (torch 2.13): utils.use_scatter_fallback sends a scatter_reduce_
    # sum with several threads to ATen's kernel when its source's device type is
    # "cpu" (config.cpp.fallback_scatter_reduce_sum: the C++ backend's atomic
    # adds), and mydev runs the same C++ backend. With the inline atomic adds,
    # nanquantile's backward failed in the C++ code generation (an assertion in
    # CppVecKernel.store), and max_pool2d_with_indices_backward's decomposition
    # (a scatter_add) lost a channel's gradients on a channels-last input with
    # ceil_mode: CPU Inductor computes the same wrong values when its fallback
    # is switched off. The device type is read for that choice only (is_gpu is
    # false for both). Imported by name, so each importer is patched; the C++
    # wrapper dispatches the fallback (cpp_wrapper.py). test_inductor.py::
    # test_scatter_fallback_workaround_still_needed fails once torch decides by
    # the backend.
    import torch._inductor.decomposition as decomposition
    import torch._inductor.lowering as lowering
    import torch._inductor.utils as utils

    def as_cpu(original):
        def use_scatter_fallback(op_overload, reduction_type, self_dtype, src_dtype, src_device_type, src_is_tensor):
            device_type = "cpu" if src_device_type == "mydev" else src_device_type
            return original(op_overload, reduction_type, self_dtype, src_dtype, device_type, src_is_tensor)

        return use_scatter_fallback

    for module in (utils, decomposition, lowering):
        _replace(module, "use_scatter_fallback", as_cpu,
                 why="a scatter_reduce_ sum falls back to ATen for the C++ backend only when the device type is "
                     "'cpu'; mydev's kernels are C++ too, and the inline atomic adds failed to generate or lost "
                     "gradients",
                 test="test_inductor.py::test_scatter_fallback_workaround_still_needed")


@functools.cache
def _patch_batch_norm_decomposition() -> None:
    # WORKAROUND (torch 2.13): the decomposition of native_batch_norm returns
    # CUDA's saved statistics (the running ones, in the computation dtype) for
    # every device but "cpu", whose kernel returns empty ones outside training
    # and casts them to the input's dtype otherwise. mydev runs the CPU's kernel,
    # so compiled and eager disagreed on the outputs' shapes. The helper every
    # batch-norm decomposition calls gets the CPU's outputs for mydev inputs.
    # test_inductor.py::test_batch_norm_decomposition_workaround_still_needed
    # fails once torch decides by the kernel's semantics.
    import torch._decomp.decompositions as decompositions

    def cpu_statistics(original):
        def native_batch_norm_helper(input, weight, bias, running_mean, running_var, training, *args, **kwargs):
            out = original(input, weight, bias, running_mean, running_var, training, *args, **kwargs)
            if input.device.type != "mydev":
                return out
            output, save_mean, save_rstd, new_mean, new_var = out
            if not training:
                save_mean, save_rstd = input.new_zeros((0,)), input.new_zeros((0,))
            return output, save_mean.to(dtype=input.dtype), save_rstd.to(dtype=input.dtype), new_mean, new_var

        return native_batch_norm_helper

    _replace(decompositions, "native_batch_norm_helper", cpu_statistics,
             why="its saved statistics follow CUDA's kernel on every device but 'cpu'; mydev runs the CPU's "
                 "kernel (empty outside training, in the input's dtype)",
             test="test_inductor.py::test_batch_norm_decomposition_workaround_still_needed")


@functools.cache
def _patch_arg_reductions() -> None:
    # WORKAROUND (torch 2.13): an argmax/argmin over several dims of a
    # permuted or otherwise non-contiguous input must give the index in the
    # logical (row-major) order, not the loop's; lowering's
    # _make_reduction_inner computes that index only for Triton and for device
    # type "cpu" with the C++ backend, so mydev's C++ kernels returned the
    # memory-order index: compiled x.t().argmax() gave 12 where eager gives
    # 22. For such a reduction of a mydev input, the input is first made
    # contiguous, where the loop's order is the logical one.
    # test_inductor.py::test_arg_reduction_workaround_still_needed fails once
    # torch decides by the backend.
    import torch._inductor.ir as ir
    import torch._inductor.lowering as lowering

    def contiguous_for_mydev(original):
        def _make_reduction_inner(x, *, axis, keepdims, dtype, override_return_dtype, reduction_type=None):
            if (reduction_type is not None and reduction_type.startswith(("argmax", "argmin"))
                    and ir.get_device_type(x) == "mydev" and len(lowering._validate_reduction_axis(x, axis)) > 1):
                x = ir.ExternKernel.require_contiguous(x)
            return original(x, axis=axis, keepdims=keepdims, dtype=dtype,
                            override_return_dtype=override_return_dtype, reduction_type=reduction_type)

        return _make_reduction_inner

    _replace(lowering, "_make_reduction_inner", contiguous_for_mydev,
             why="an argmax/argmin over several dims of a non-contiguous input gets its logical index only on "
                 "Triton and on device type 'cpu'; mydev's C++ kernels returned the memory-order index",
             test="test_inductor.py::test_arg_reduction_workaround_still_needed")


@functools.cache
def _patch_two_step_variance() -> None:
    # WORKAROUND (torch 2.13): lowering.use_two_step_variance computes a
    # variance in two passes (mean, then squared deviations) up to
    # config.cpp.use_two_step_variance_threshold (1024) elements on device type
    # "cpu", and with Welford's update above config.unroll_reductions_threshold
    # (8) on other devices but CUDA. mydev runs the C++ backend, and Welford
    # there lost precision against eager: var_mean of 300 values around 1000
    # was off by 1.3e-5 relative (1.5e-7 on CPU Inductor), and 1.8x slower. For
    # a mydev input, the non-CPU branch is given the CPU's threshold, which
    # makes its answer the CPU branch's.
    # test_inductor.py::test_two_step_variance_workaround_still_needed fails once
    # torch decides by the backend.
    import torch._inductor.ir as ir
    import torch._inductor.lowering as lowering
    from torch._inductor import config

    def cpu_threshold_for_mydev(original):
        def use_two_step_variance(x, axis, keepdim, input_dtype):
            if ir.get_device_type(x) != "mydev":
                return original(x, axis, keepdim, input_dtype)
            with config.patch(unroll_reductions_threshold=config.cpp.use_two_step_variance_threshold):
                return original(x, axis, keepdim, input_dtype)

        return use_two_step_variance

    _replace(lowering, "use_two_step_variance", cpu_threshold_for_mydev,
             why="variances up to 1024 elements take two passes on device type 'cpu' only; mydev's C++ kernels "
                 "used Welford's update, less precise against eager and slower",
             test="test_inductor.py::test_two_step_variance_workaround_still_needed")


class _CpuOrMydev(str):
    """A device-type constant equal to "cpu" and to "mydev": put in place of "cpu" in a function's code, it
    makes that function's `device.type == "cpu"` tests answer as for the CPU for mydev too."""

    def __eq__(self, other):
        return other in ("cpu", "mydev")

    def __ne__(self, other):
        return not self == other

    __hash__ = str.__hash__


def _as_for_the_cpu(function):
    """A copy of torch's `function` whose one "cpu" constant also equals "mydev": its device-type test then
    answers for mydev as for the CPU. Used where that test is inside a function too long to wrap; it fails
    loudly if torch's function changed shape."""
    import types

    code = function.__code__
    assert code.co_consts.count("cpu") == 1, f"{function.__qualname__} changed in torch: review the workaround"
    consts = tuple(_CpuOrMydev("cpu") if isinstance(c, str) and c == "cpu" else c for c in code.co_consts)
    copy = types.FunctionType(code.replace(co_consts=consts), function.__globals__, function.__name__,
                              function.__defaults__, function.__closure__)
    copy.__kwdefaults__, copy.__doc__, copy.__qualname__ = function.__kwdefaults__, function.__doc__, function.__qualname__
    return copy


def _lowering_cell(op):
    """The closure cell holding torch's function behind the lowering registered for `op` (register_lowering
    wraps it): replacing the cell's contents changes that lowering for every caller."""
    import torch._inductor.lowering as lowering

    registered = lowering.lowerings[op]
    return registered.__closure__[registered.__code__.co_freevars.index("decomp_fn")]


@functools.cache
def _patch_cat_lowering() -> None:
    # WORKAROUND (torch 2.13): the lowering of aten.cat writes a cat of
    # computed inputs as one pointwise kernel with a masked load per input
    # (pointwise_cat) on every device but "cpu", where it realizes each input
    # into its slice of the output (ConcatKernel): torch notes the masked
    # loads are slower with the C++ backend's vectorization, and mydev's
    # kernels are that backend's. Compiled cat([a.relu(), b.sigmoid()], 1) * 2
    # on (256, 1000) inputs ran 5x the CPU's time. The choice is a local of the
    # lowering, so the lowering registered for aten.cat gets a copy of torch's
    # function for the CPU (its one "cpu" is that choice, and the int8
    # fallback before it, which the CPU takes too).
    # test_inductor.py::test_cat_lowering_workaround_still_needed fails once
    # torch decides by the backend.
    cell = _lowering_cell(torch.ops.aten.cat.default)
    _patches.replace(cell, "cell_contents", _as_for_the_cpu(cell.cell_contents), target="torch._inductor.lowering.cat",
                     why="a cat of computed inputs is one kernel of masked loads on every device but 'cpu', which "
                         "realizes each input into its slice (slower masked loads in the C++ backend); mydev's "
                         "kernels are C++ too and ran it 5x the CPU's time",
                     test="test_inductor.py::test_cat_lowering_workaround_still_needed")


@functools.cache
def _patch_flex_attention_lowering() -> None:
    # WORKAROUND (torch 2.13): the lowering of the flex_attention operator
    # takes the CPU's C++ template for device type "cpu" and the GPU one for
    # every other device but MPS; mydev's kernels are the C++ backend's, and
    # with the GPU's the compile failed (it asked for CUDA). The registered
    # lowering gets a copy of torch's for the CPU (its one "cpu" is that
    # choice). my_device/_flex_attention.py lets mydev inputs through
    # flex_attention's own checks.
    # test_flex_attention.py::test_flex_attention_lowering_workaround_still_needed
    # fails once torch decides by the backend.
    from torch._higher_order_ops.flex_attention import flex_attention

    cell = _lowering_cell(flex_attention)
    _patches.replace(cell, "cell_contents", _as_for_the_cpu(cell.cell_contents),
                     target="torch._inductor.kernel.flex.flex_attention.flex_attention",
                     why="the flex_attention lowering takes the C++ template for device type 'cpu' and the GPU's "
                         "(which asked for CUDA) for mydev, whose kernels are C++",
                     test="test_flex_attention.py::test_flex_attention_lowering_workaround_still_needed")


@functools.cache
def _patch_opt_in_scheduling_modes() -> None:
    # WORKAROUND (torch 2.13): two opt-in scheduler modes skip the CPU's nodes
    # by device type, and fail for mydev's, which CppScheduling writes too:
    # config.combo_kernels groups them (the CPU's never are) and then asserts
    # in Scheduler.generate_combo_kernel_code; config.benchmark_fusion times
    # candidate fusions with Triton ("No module named 'triton'"), which it
    # skips for the C++ backend only on device type "cpu". Each function gets
    # a copy for the CPU. test_inductor.py::
    # test_opt_in_scheduling_workaround_still_needed fails once torch decides
    # by the backend.
    from torch._inductor.scheduler import ForeachKernelSchedulerNode, Scheduler

    grouping = ForeachKernelSchedulerNode.__dict__["group_algorithm_for_combo_kernels"]
    if isinstance(grouping, staticmethod) and grouping.__func__ is ForeachKernelSchedulerNode.__dict__[
            "_default_group_nodes_for_combo_kernels"].__func__:  # (not one a user set)
        copy = _as_for_the_cpu(grouping.__func__)
        copy._torch_original = grouping.__func__  # (what the class attribute reads as, beside the staticmethod's)
        _patches.replace(ForeachKernelSchedulerNode, "group_algorithm_for_combo_kernels", staticmethod(copy),
                         target="torch._inductor.scheduler.ForeachKernelSchedulerNode.group_algorithm_for_combo_kernels",
                         why="config.combo_kernels never groups the CPU's nodes, by device type; mydev's were grouped "
                             "and the C++ scheduling asserted",
                         test="test_inductor.py::test_opt_in_scheduling_workaround_still_needed")
    _patches.replace(Scheduler, "speedup_by_fusion", _as_for_the_cpu(Scheduler.speedup_by_fusion),
                     target="torch._inductor.scheduler.Scheduler.speedup_by_fusion",
                     why="config.benchmark_fusion skips timing the C++ backend's fusions only for device type 'cpu'; "
                         "for mydev it asked for Triton",
                     test="test_inductor.py::test_opt_in_scheduling_workaround_still_needed")


@functools.cache
def _patch_pad_as_cat() -> None:
    # WORKAROUND (torch 2.13): a constant pad on one side of one dim is
    # lowered as a cat with a filled tensor on every device but "cpu", whose
    # cat is not one kernel: mydev's cat is the CPU's (_patch_cat_lowering),
    # and the pad as a cat took 3x the CPU's time (F.pad(x.relu(), (0, 3)) + 1
    # on (512, 509)). For a mydev input the rewrite is declined, as for the
    # CPU. test_inductor.py::test_pad_as_cat_workaround_still_needed fails once
    # torch decides by the backend.
    import torch._inductor.ir as ir
    import torch._inductor.lowering as lowering

    def declined_for_mydev(original):
        def _pad_as_cat(x, padding, fill_value):
            return None if ir.get_device_type(x) == "mydev" else original(x, padding, fill_value)

        return _pad_as_cat

    _replace(lowering, "_pad_as_cat", declined_for_mydev,
             why="a one-sided constant pad becomes a cat on every device but 'cpu', whose cat is not one kernel; "
                 "mydev's cat is the CPU's, and the pad as a cat ran 3x the CPU's time",
             test="test_inductor.py::test_pad_as_cat_workaround_still_needed")


def _replace(module, name: str, make, why: str, test: str) -> None:
    """Replaces module.name by make(torch's function), through _patches (which keeps torch's)."""
    original = getattr(module, name)
    replacement = functools.wraps(original)(make(original))
    del replacement.__wrapped__  # (functools.wraps; _torch_original is the one reference kept)
    _patches.replace(module, name, replacement, target=f"{module.__name__}.{name}", why=why, test=test)


def _wrap(module, name: str, for_mydev, why: str, test: str) -> None:
    """Replaces module.name by a function that answers `for_mydev(*args)` (or the original's answer when
    that returns None), through _patches."""
    def answer_for_mydev(original):
        def wrapper(*args, **kwargs):
            answer = for_mydev(*args, **kwargs)
            return original(*args, **kwargs) if answer is None else answer

        return wrapper

    _replace(module, name, answer_for_mydev, why=why, test=test)


@functools.cache
def _patch_backend_name() -> None:
    # WORKAROUND (torch 2.13): torch._inductor.utils.get_current_backend names
    # the kernel language of a device by its type, and every type it does not
    # list (cpu, mps, xpu, tpu) gets config.cuda_backend, "triton". For mydev,
    # whose kernels CppScheduling writes, that is wrong: CSEProxy then
    # propagates dtypes the Triton way and the C++ vectorizer fails on an
    # index expression ("assert index.dtype is not None" in CppVecKernel.
    # arange), which AOTInductor meets as soon as it inlines a small constant
    # into a kernel. Answering "cpp" for mydev changes nothing for other
    # devices. The function is imported by name, so each importer is patched.
    # test_aoti.py::test_backend_name_workaround_still_needed fails once torch
    # stops needing this.
    import torch._inductor.codegen.common as common
    import torch._inductor.scheduler as scheduler
    import torch._inductor.utils as utils

    def for_mydev(device_type=None):
        from torch._inductor.virtualized import V

        if device_type is None:
            device = V.graph.get_current_device_or_throw() if V.graph is not None else None
            device_type = device.type if device is not None else None
        return "cpp" if device_type == "mydev" else None

    for module in (utils, common, scheduler):
        _wrap(module, "get_current_backend", for_mydev,
              why="every device type it does not list gets 'triton'; the C++ vectorizer then failed on index "
                  "expressions: 'cpp' for mydev",
              test="test_aoti.py::test_backend_name_workaround_still_needed")


@functools.cache
def _patch_precompiled_header_names() -> None:
    # WORKAROUND (torch 2.13): the C++ wrapper's precompiled header is named
    # after the device type (torch/csrc/inductor/{cpp_wrapper,aoti_include}/
    # <device>.h, and cpp_prefix.h for "cpu" only), as if every device shipped
    # headers inside torch; for mydev the compile fails with "aoti_include/
    # mydev.h: No such file". mydev's wrapper and kernels are host C++ that
    # include CPU's headers (cpp_wrapper.py), so CPU's are the ones to
    # precompile. test_aoti.py::test_precompiled_header_workaround_still_needed
    # fails once torch stops needing this.
    import torch._inductor.codecache as codecache

    def cpu_for_mydev(original):
        return lambda device, *args, **kwargs: (
            original("cpu", *args, **kwargs) if device.split(":")[0] == "mydev" else None
        )

    for name in ("_get_cpp_wrapper_header", "_get_cpp_prefix_header"):
        _wrap(codecache, name, cpu_for_mydev(getattr(codecache, name)),
              why="the precompiled header is named after the device type (aoti_include/mydev.h does not exist); "
                  "mydev's wrapper and kernels are host C++ that include CPU's headers",
              test="test_aoti.py::test_precompiled_header_workaround_still_needed")


class CodegenKey(CustomGraphModulePass):
    """Changes no graph. Inductor puts every device's custom pass's uuid in the key of its FX graph and
    AOT autograd caches; this one's is a hash of mydev's Inductor code (the workarounds above, the
    wrappers, the kernel prelude). Without it, a graph compiled before my_device changed was served
    after it from the on-disk cache, as if torch's code alone decided what Inductor generates."""

    def __call__(self, gm) -> None:
        pass

    def uuid(self) -> bytes:
        key = self._sources_hash()
        # mydev's kernels are C++ kernels specialized on the intra-op thread count, as the CPU's (a reduction
        # keeps one accumulator per thread it was compiled for). torch adds that count to the key of graphs
        # with CPU tensors only (FxGraphHashDetails._may_generate_cpu_cpp_code), so a mydev graph compiled with
        # 2 threads was served to a process running 6, which wrote past its accumulators and crashed.
        # test_inductor.py::test_thread_count_in_the_key_still_needed fails once torch keys mydev graphs too.
        if config.cpp.threads < 1 and not config.cpp.dynamic_threads:
            key += b"threads=%d" % kernels.written_for()
        # Whether the regions run as teams on the device's units or on libgomp: the kernel's source differs.
        return key + b"teams=%d" % kernels.team_threads()

    @staticmethod
    @functools.cache
    def _sources_hash() -> bytes:
        folder = Path(__file__).parent
        sources = sorted(str(p) for p in folder.iterdir() if p.suffix in (".py", ".h"))
        return get_hash_for_files((*sources, str(folder.parent / "_patches.py")))


def register_codegen() -> None:
    """mydev's code generators, with the cache key pass (torch's registration of the privateuse1 device
    from its module's attributes has no slot for one). Called when torch._inductor.compile_fx is
    imported, so before Inductor compiles or hashes a graph."""
    register()
    register_backend_for_device("mydev", MydevScheduling, MydevPythonWrapperCodegen, MydevCppWrapperCodegen,
                                MydevWrapperFxCodegen, device_custom_pass=CodegenKey())


@functools.cache
def register() -> None:
    """Everything Inductor needs beyond what it asks torch.mydev for."""
    register_device_op_overrides("mydev", MydevDeviceOpOverrides())
    _patch_scheduler_cpu_checks()
    _patch_realization_heuristics()
    _patch_division_by_constant()
    _patch_scatter_fallback()
    _patch_batch_norm_decomposition()
    _patch_arg_reductions()
    _patch_two_step_variance()
    _patch_cat_lowering()
    _patch_pad_as_cat()
    _patch_opt_in_scheduling_modes()
    _patch_flex_attention_lowering()
    _patch_backend_name()
    _patch_precompiled_header_names()
    # The device interface is normally registered by the import hook; a
    # process that imported torch._dynamo before my_device gets it here.
    from .device_interface import register as register_interface

    register_interface()
