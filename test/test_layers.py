"""The layers a vendor forks along (docs/porting.md), checked on the sources' #include lines.

runtime (third_party/mydev_runtime) <- csrc/core <- the other csrc folders <- csrc/python, */Bindings.cpp,
Module.cpp. A lower layer includes nothing of a higher one, only the bindings include pybind11, and csrc
reaches the runtime through its public headers only.
"""
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
            assert not include.startswith(("pybind11/", "torch/extension.h", "torch/python.h")), (
                f"{source.relative_to(ROOT)} includes {include}: Python bindings go in csrc/python/ or a "
                "Bindings.cpp")


def test_nothing_includes_the_bindings():
    for source in _sources(CSRC):
        for include in _includes(source):
            folder = _csrc_folder_of(include, source)
            if folder == "python":
                raise AssertionError(f"{source.relative_to(ROOT)} includes {include}")
