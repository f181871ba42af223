"""Kernels that Inductor's C++ code generation writes for mydev, compiled and
queued on mydev streams.

Inductor compiles a CPU kernel into a Python binding that runs it at the call,
on the host thread. A mydev kernel must instead take its place on the current
stream and run on the stream's worker, so each kernel gets one extra entry
point, `mydev_entry(const int64_t* args)`, that unpacks a flat argument array
into the kernel's own parameters; my_device._C._inductor.launch queues a call
to it (csrc/inductor/KernelLaunch.cpp). Compilation and its on-disk cache are
Inductor's (CppCodeCache), so kernels are shared across processes.
"""

import ctypes
import functools
from pathlib import Path

from torch._inductor.async_compile import AsyncCompile
from torch._inductor.codecache import CppCodeCache, LambdaFuture, _get_cpp_prefix_header, clear_on_fresh_cache

from .. import _C

ENTRY = "mydev_entry"


def _header(name: str) -> str:
    return Path(__file__).with_name(name).read_text().replace("#pragma once\n", "")


# Faster at::vec paths every mydev kernel is compiled with (the header says why).
# Its text goes into each kernel's source, so the code cache keys on it.
_VEC_PRELUDE = _header("kernel_prelude.h")
# OpenMP's entry points, taken by the device's compute units (the header says why).
_TEAM_PRELUDE = _header("kernel_team.h")


def team_threads() -> int:
    """The team size of the kernels this thread compiles, when their parallel regions run as teams on the
    device's compute units (kernel_team.h); 0 when they run on libgomp with the kernels' intra-op threads."""
    return _C._kernel_team_threads()


def written_for() -> int:
    """The thread count mydev's kernels are written for (their regions' num_threads)."""
    return team_threads() or _C._kernel_intra_op_threads()


def prelude() -> str:
    """What goes before each kernel's source, as this thread compiles it."""
    return _VEC_PRELUDE + (_TEAM_PRELUDE if team_threads() else "")


def unpack_argument(index: int, cpp_type: str) -> str:
    """C++ expression for the kernel argument of type `cpp_type` at `args[index]`."""
    value = f"args[{index}]"
    if cpp_type.rstrip().endswith("*"):
        return f"reinterpret_cast<{cpp_type}>({value})"
    base = cpp_type.replace("const", "").strip()
    if base in ("float", "double", "at::Half", "at::BFloat16"):
        return f"static_cast<{base}>(mydev_bits_to_double({value}))"
    return f"static_cast<{base}>({value})"


def entry_point(arg_types: list[str]) -> str:
    """C++ source of the uniform entry point for a kernel with `arg_types`."""
    unpacked = ",\n        ".join(unpack_argument(i, t) for i, t in enumerate(arg_types))
    return f"""
#include <cstring>
static inline double mydev_bits_to_double(int64_t bits) {{
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    return d;
}}
extern "C" __attribute__((visibility("default"))) void {ENTRY}(const int64_t* args) {{
    kernel(
        {unpacked});
}}
"""


class MydevKernel(functools.partial):
    """A compiled kernel; calling it queues it on the current mydev stream.

    A partial of the launcher (launch(entry, name, *args)), so a call goes
    straight to C++."""

    def __new__(cls, name: str, library: ctypes.CDLL):
        entry = ctypes.cast(getattr(library, ENTRY), ctypes.c_void_p).value
        self = super().__new__(cls, _C._inductor.launch, entry, name)
        self.library = library  # keeps the shared object loaded
        return self

    @property
    def name(self) -> str:
        return self.args[1]


@clear_on_fresh_cache
class KernelCodeCache(CppCodeCache):
    """CppCodeCache compiling with the CPU kernels' precompiled prelude (Inductor's cpp_prefix.h,
    which every generated kernel includes first). The base class precompiles no header; the CPU's
    kernels get it from CppPythonBindingsCodeCache, whose Python binding mydev kernels do not use.
    Without it, each kernel compiles the prelude again: a first compile took 2-3 times the CPU's."""

    cache: dict = {}

    @staticmethod
    def cache_clear() -> None:
        KernelCodeCache.cache.clear()

    @classmethod
    def _get_uncompiled_header(cls, device: str):
        return _get_cpp_prefix_header(device)


def cpp_kernel(async_compile: AsyncCompile, name: str, arg_types: list[str], source: str):
    """What a generated mydev wrapper calls in place of async_compile.cpp_pybinding."""
    source = prelude() + source + entry_point(arg_types)
    from torch._inductor.async_compile import get_compile_threads

    if get_compile_threads() <= 1:
        return MydevKernel(name, KernelCodeCache.load(source))
    result = KernelCodeCache.load_async(source, submit_fn=async_compile.submit)
    return LambdaFuture(lambda: MydevKernel(name, result()))
