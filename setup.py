"""Builds my_device._C: the emulated runtime (third_party/mydev_runtime) and the
PyTorch integration (csrc/) in one extension, with torch's cpp_extension + ninja."""
import glob
import os
import runpy

# Building the backend must not autoload an installed (possibly stale) copy of
# it through torch's torch.backends entry point.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
RUNTIME = os.path.join("third_party", "mydev_runtime")
# The Lazy kernels torchgen generates from csrc/lazy/mydev_lazy_ops.yaml (csrc/lazy/gen_lazy_kernels.py).
LAZY_SOURCES = [os.path.join("build", "generated", "mydev_lazy", f) for f in ("LazyNativeFunctions.cpp", "RegisterLazy.cpp")]


def sources():
    found = sorted(glob.glob(os.path.join(RUNTIME, "src", "*.cpp")))
    found += sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    return found + LAZY_SOURCES


class BuildExtensionGeneratingLazyKernels(BuildExtension.with_options(use_ninja=True)):
    def run(self):
        runpy.run_path(os.path.join(ROOT, "csrc", "lazy", "gen_lazy_kernels.py"))["generate"]()
        super().run()


setup(
    packages=find_packages(include=["my_device", "my_device.*"]),
    ext_modules=[
        CppExtension(
            name="my_device._C",
            sources=sources(),
            include_dirs=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, RUNTIME, "include")],
            extra_compile_args=["-O2", "-g0", "-std=c++17", "-fvisibility=hidden"],
            extra_link_args=["-pthread"],
        )
    ],
    cmdclass={"build_ext": BuildExtensionGeneratingLazyKernels},
)
