"""Builds the emulated device's runtime and the PyTorch integration as two libraries:

- my_device/libmydev_runtime.so from third_party/mydev_runtime (the vendor driver's stand-in: C++17
  and pthreads, compiled without PyTorch's headers, so the runtime cannot depend on PyTorch);
- my_device._C from csrc/, with torch's cpp_extension + ninja, linked against that library, so
  csrc reaches the runtime through its exported C API only (anything else is a link error).

A port to other hardware replaces the first library."""
import concurrent.futures
import glob
import hashlib
import os
import runpy
import shlex
import shutil
import subprocess
import sysconfig

# Building the backend must not autoload an installed (possibly stale) copy of
# it through torch's torch.backends entry point.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import find_packages, setup
import torch
import torch.utils.cpp_extension as cpp_extension
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
RUNTIME = os.path.join("third_party", "mydev_runtime")
RUNTIME_LIB = "mydev_runtime"
# The Lazy kernels torchgen generates from csrc/lazy/mydev_lazy_ops.yaml (csrc/lazy/gen_lazy_kernels.py).
LAZY_SOURCES = [os.path.join("build", "generated", "mydev_lazy", f) for f in ("LazyNativeFunctions.cpp", "RegisterLazy.cpp")]


def sources():
    found = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    return found + LAZY_SOURCES


def build_runtime(out_dir):
    """Compiles the runtime into out_dir/libmydev_runtime.so; an object is rebuilt only when its
    source or a runtime header is newer (ccache, when the machine has it, is used through $PATH)."""
    compiler = os.environ.get("CXX") or sysconfig.get_config_var("CXX").split()[0] or "c++"
    flags = ["-std=c++17", "-O2", "-g0", "-fPIC", "-pthread", "-fvisibility=hidden",
             "-I", os.path.join(ROOT, RUNTIME, "include")]
    obj_dir = os.path.join(ROOT, "build", "mydev_runtime")
    os.makedirs(obj_dir, exist_ok=True)
    headers = glob.glob(os.path.join(ROOT, RUNTIME, "include", "*.h")) + glob.glob(os.path.join(ROOT, RUNTIME, "src", "*.h"))
    newest_header = max(os.path.getmtime(h) for h in headers)
    jobs = []
    for src in sorted(glob.glob(os.path.join(ROOT, RUNTIME, "src", "*.cpp"))):
        obj = os.path.join(obj_dir, os.path.basename(src) + ".o")
        if not os.path.exists(obj) or os.path.getmtime(obj) < max(os.path.getmtime(src), newest_header):
            jobs.append([compiler, *flags, "-c", src, "-o", obj])
    workers = int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        for result in pool.map(lambda cmd: subprocess.run(cmd, capture_output=True, text=True), jobs):
            if result.returncode != 0:
                raise RuntimeError(f"compiling the mydev runtime failed:\n{result.stderr}")
    library = os.path.join(out_dir, f"lib{RUNTIME_LIB}.so")
    objects = sorted(glob.glob(os.path.join(obj_dir, "*.o")))
    if jobs or not os.path.exists(library):
        os.makedirs(out_dir, exist_ok=True)
        linked = library + ".tmp"
        subprocess.run([compiler, "-shared", "-pthread", "-o", linked, *objects], check=True)
        os.replace(linked, library)  # (a process that has the old library loaded keeps it)
    return library


PRECOMPILED = os.path.join("csrc", "Precompiled.h")


def precompiled_header(cflags, post_cflags):
    """Compiles csrc/Precompiled.h with the extension's own flags into build/pch/ and returns the
    flags that give it to every unit (a unit parses the header itself if it could not be built).
    Rebuilt only when the header, the flags or torch change: gcc does not check the headers a
    precompiled header was made from."""
    compiler = os.environ.get("CXX", "c++")
    flags = [f for f in [*cflags, *post_cflags] if f != "-c"]
    out_dir = os.path.join(ROOT, "build", "pch")
    os.makedirs(out_dir, exist_ok=True)
    header = os.path.join(out_dir, "mydev_pch.h")
    with open(os.path.join(ROOT, PRECOMPILED)) as f:
        text = f.read()
    stamp = hashlib.sha256("\0".join([text, compiler, torch.__version__, *flags]).encode()).hexdigest()
    stamp_file = header + ".stamp"
    current = open(stamp_file).read() if os.path.exists(stamp_file) else ""
    if current != stamp or not os.path.exists(header + ".gch"):
        with open(header, "w") as f:
            f.write(text)
        done = subprocess.run([compiler, *flags, "-x", "c++-header", header, "-o", header + ".gch"],
                              capture_output=True, text=True)
        if done.returncode != 0:  # (each unit then parses the header itself)
            print(f"precompiled header not built:\n{done.stderr[-2000:]}")
        else:
            with open(stamp_file, "w") as f:
                f.write(stamp)
    return ["-include", header]


# torch's cpp_extension has no precompiled-header option for setup.py builds (only load() makes
# one, of torch/extension.h). Its ninja writer is wrapped to add one; if torch renames it, the
# build goes on without (test_layers.py notices both).
_write_ninja = getattr(cpp_extension, "_write_ninja_file_and_compile_objects", None)


def _write_ninja_with_pch(*, cflags, post_cflags, **kwargs):
    # (torch passes the flags shell-quoted, as they go into the ninja file.)
    pch = precompiled_header(shlex.split(" ".join(cflags)), shlex.split(" ".join(post_cflags)))
    return _write_ninja(cflags=cflags, post_cflags=[*post_cflags, *map(shlex.quote, pch)], **kwargs)


if _write_ninja is not None:
    cpp_extension._write_ninja_file_and_compile_objects = _write_ninja_with_pch
# ccache caches units compiled with a precompiled header only when told that the header's
# macros and __TIME__ need not be checked.
os.environ.setdefault("CCACHE_SLOPPINESS", "pch_defines,time_macros,include_file_mtime,include_file_ctime")


class BuildExtensionWithRuntime(BuildExtension.with_options(use_ninja=True)):
    def run(self):
        runpy.run_path(os.path.join(ROOT, "csrc", "lazy", "gen_lazy_kernels.py"))["generate"]()
        library = build_runtime(os.path.join(ROOT, "my_device"))
        # A non-editable build installs from build_lib: the library goes beside _C there too.
        if not self.inplace:
            target = os.path.join(self.build_lib, "my_device")
            os.makedirs(target, exist_ok=True)
            shutil.copy2(library, target)
        super().run()


setup(
    packages=find_packages(include=["my_device", "my_device.*"]),
    package_data={"my_device": [f"lib{RUNTIME_LIB}.so", "inductor/kernel_prelude.h"]},
    ext_modules=[
        CppExtension(
            name="my_device._C",
            sources=sources(),
            include_dirs=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, RUNTIME, "include")],
            library_dirs=[os.path.join(ROOT, "my_device")],
            libraries=[RUNTIME_LIB],
            extra_compile_args=["-O2", "-g0", "-std=c++17", "-fvisibility=hidden"],
            # The runtime is found beside _C wherever the package is installed.
            extra_link_args=["-pthread", "-Wl,-rpath,$ORIGIN"],
        )
    ],
    cmdclass={"build_ext": BuildExtensionWithRuntime},
)
