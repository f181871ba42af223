"""The layers a vendor forks along (docs/porting.md), checked on the sources' #include lines.

runtime (third_party/mydev_runtime) <- csrc/core <- the other csrc folders <- csrc/python, */Bindings.cpp,
Module.cpp. A lower layer includes nothing of a higher one, only the bindings include pybind11, and csrc
reaches the runtime through its public headers only.
"""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
RUNTIME = ROOT / "third_party" / "mydev_runtime"
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


def _includes(path):
    return INCLUDE.findall(path.read_text())


def _sources(root):
    return sorted(p for p in root.rglob("*") if p.suffix in (".h", ".cpp") and "build" not in p.parts)


def _csrc_folder_of(include, source):
    """The csrc folder an #include names ("core", "native", ...), or None for a system or torch header."""
    target = (source.parent / include).resolve()
    if not target.exists():
        target = (CSRC / include).resolve()
    if not target.exists() or CSRC not in target.parents:
        return None
    return target.relative_to(CSRC).parts[0] if len(target.relative_to(CSRC).parts) > 1 else "."


def _is_binding(source):
    return source.parent.name == "python" or source.name in ("Bindings.cpp", "Module.cpp", "KernelLaunch.cpp")


def test_runtime_includes_no_pytorch():
    for source in _sources(RUNTIME):
        for include in _includes(source):
            assert not re.match(r"(torch|c10|ATen|pybind11)/", include), f"{source.relative_to(ROOT)}: {include}"


def test_csrc_uses_only_the_runtime_public_headers():
    public = {p.name for p in (RUNTIME / "include").glob("*.h")}
    for source in _sources(CSRC):
        for include in _includes(source):
            if "mydev_runtime" in include or include.startswith("mydev_"):
                assert Path(include).name in public, f"{source.relative_to(ROOT)}: {include}"
            assert "internal.h" not in include, f"{source.relative_to(ROOT)}: {include}"


def test_core_includes_no_higher_layer():
    for source in _sources(CSRC / "core"):
        for include in _includes(source):
            folder = _csrc_folder_of(include, source)
            assert folder in (None, "core"), f"{source.relative_to(ROOT)} includes {include} ({folder}/)"


def test_only_bindings_include_pybind11():
    for source in _sources(CSRC):
        if _is_binding(source):
            continue
        for include in _includes(source):
            assert not include.startswith(("pybind11/", "torch/csrc/utils/pybind.h", "torch/extension.h",
                                           "torch/python.h")), (
                f"{source.relative_to(ROOT)} includes {include}: Python bindings go in csrc/python/ or a "
                "Bindings.cpp")


def test_bindings_include_pybind_without_the_cpp_frontend():
    # torch/extension.h and torch/python.h also parse the whole C++ frontend (torch/all.h, nn, optim), which
    # doubled a binding file's compile time; torch/csrc/utils/pybind.h has the casters bindings use.
    for source in _sources(CSRC):
        for include in _includes(source):
            assert include not in ("torch/extension.h", "torch/python.h", "torch/all.h", "torch/torch.h"), (
                f"{source.relative_to(ROOT)} includes {include}: include torch/csrc/utils/pybind.h instead")


def test_nothing_includes_the_bindings():
    for source in _sources(CSRC):
        for include in _includes(source):
            folder = _csrc_folder_of(include, source)
            if folder == "python":
                raise AssertionError(f"{source.relative_to(ROOT)} includes {include}")


# The integration files that use the emulator's own calls (mydev_emulator.h): the seams a port to real
# hardware rewrites (docs/porting.md). A new one belongs in that list, and in the porting guide.
EMULATOR_SEAMS = {"core/Launch.h", "core/Allocator.cpp", "core/ComputeUnits.cpp", "native/hostkernel/HostCall.cpp",
                  "Module.cpp"}


def test_emulator_calls_stay_in_the_seams():
    users = {str(p.relative_to(CSRC)) for p in _sources(CSRC) if "mydev_emulator.h" in _includes(p)}
    assert users == EMULATOR_SEAMS
    emulator = (RUNTIME / "include" / "mydev_emulator.h").read_text()
    names = set(re.findall(r"MYDEV_API [^(]*?\b(mydev\w+)\(", emulator))
    assert "mydevKernelAddress" in names and "mydevLaunchHostFuncEx" in names
    for source in _sources(CSRC):
        if str(source.relative_to(CSRC)) in EMULATOR_SEAMS:
            continue
        text = source.read_text()
        used = sorted(n for n in names if re.search(rf"\b{n}\b", text))
        assert not used, f"{source.relative_to(ROOT)} calls {used} of mydev_emulator.h"


def test_every_patch_of_torch_is_listed_with_its_reason_and_test(python_subprocess):
    """my_device.patches() lists each change to torch (my_device/_patches.py) with why it is needed and the
    test that notices when it no longer is; that test exists; docs/torch-patches.md names it; and each
    replaced attribute still holds the patch, with torch's original reachable."""
    script = r'''
import json, my_device, torch
import torch._inductor.compile_fx, torch._inductor.output_code, torch._inductor.cudagraph_utils
import torch.nested._internal.ops
import torch.nn.attention.flex_attention
from my_device.inductor import backend
import my_device.distributed
backend.register()
torch.nn.parallel.DataParallel
print(json.dumps(my_device.patches()))
'''
    result = python_subprocess(script)
    assert result.returncode == 0, result.stderr
    patches = json.loads(result.stdout.strip().splitlines()[-1])
    docs = (ROOT / "docs" / "torch-patches.md").read_text()
    assert len(patches) >= 20
    for p in patches:
        assert p["why"] and p["test"], p
        target = p["target"].split(" ")[0].rstrip(":")
        if p["kind"] == "replaced":
            assert f"`{target}`" in docs or target.rsplit(".", 1)[0] in docs, target
        file, name = re.search(r"(\w+\.py)::(\w+)", p["test"]).groups()
        assert re.search(rf"def {name}\b", (ROOT / "test" / file).read_text()), p["test"]


def test_precompiled_header_hook_still_fits_torch():
    """setup.py wraps cpp_extension's ninja writer to give every unit csrc/Precompiled.h precompiled:
    the writer must still take the flags by those names, and the wrapper can go once BuildExtension
    makes a precompiled header itself (today only load() does)."""
    import inspect

    import torch.utils.cpp_extension as cpp_extension

    params = inspect.signature(cpp_extension._write_ninja_file_and_compile_objects).parameters
    assert {"cflags", "post_cflags"} <= set(params)
    assert "pch" not in inspect.getsource(cpp_extension.BuildExtension).lower()
    # Torch's headers only: a csrc header in it would rebuild every unit whenever it changed.
    assert all(h.split("/")[0] in ("ATen", "torch", "c10") for h in _includes(CSRC / "Precompiled.h"))
