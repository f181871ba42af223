"""Which OpInfos and dtypes a conformance run covers, from the environment.

MYDEV_CONFORMANCE=ci (default) runs manifest.CI_OPS in manifest.CI_DTYPES, the
subset `python -m pytest test` runs; MYDEV_CONFORMANCE=full runs every OpInfo in
every dtype CPU supports. MYDEV_CONFORMANCE_OPS (comma-separated OpInfo full
names) and MYDEV_CONFORMANCE_DTYPES (comma-separated dtype names, "float32")
narrow either; `python -m my_device.conformance` sets them per batch.
"""
import os

import torch

from . import manifest

MODE_VAR, OPS_VAR, DTYPES_VAR = "MYDEV_CONFORMANCE", "MYDEV_CONFORMANCE_OPS", "MYDEV_CONFORMANCE_DTYPES"
# The ModuleInfo suite (test/test_modules.py): module names ("nn.Linear") to run.
MODULES_VAR = "MYDEV_CONFORMANCE_MODULES"
# The frontend mydev's side of each sample runs through (frontends.py).
FRONTEND_VAR = "MYDEV_CONFORMANCE_FRONTEND"


def dtype_from_name(name):
    dtype = getattr(torch, name.strip().removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def _csv(var):
    value = os.environ.get(var, "").strip()
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def mode():
    m = os.environ.get(MODE_VAR, "ci")
    if m not in ("ci", "full"):
        raise ValueError(f"{MODE_VAR} must be ci or full, not {m!r}")
    return m


def op_allowlist(op_db):
    """Full names of the OpInfos to run, or None for all of op_db."""
    allowed = None
    if mode() == "ci":
        allowed = {op.full_name for op in op_db if op.name in manifest.CI_OPS}
    requested = _csv(OPS_VAR)
    if requested is not None:
        known = {op.full_name for op in op_db}
        unknown = sorted(set(requested) - known)
        if unknown:
            raise ValueError(f"{OPS_VAR}: no OpInfo named {unknown}")
        allowed = set(requested) if allowed is None else allowed & set(requested)
    return allowed


def dtypes():
    """The dtypes to run (each test further limits them to what the op supports), or None for all."""
    requested = _csv(DTYPES_VAR)
    if requested is not None:
        return tuple(dtype_from_name(n) for n in requested)
    return manifest.CI_DTYPES if mode() == "ci" else None


def selected_modules(module_db):
    """The ModuleInfos to run: manifest.CI_MODULES by default, all of module_db in full mode,
    narrowed by MYDEV_CONFORMANCE_MODULES."""
    chosen = list(module_db) if mode() == "full" else [m for m in module_db if m.name in manifest.CI_MODULES]
    requested = _csv(MODULES_VAR)
    if requested is not None:
        unknown = sorted(set(requested) - {m.name for m in module_db})
        if unknown:
            raise ValueError(f"{MODULES_VAR}: no ModuleInfo named {unknown}")
        chosen = [m for m in chosen if m.name in requested]
    return chosen


def module_dtypes():
    """The dtypes of the ModuleInfo suite: float32 and float64 (MYDEV_CONFORMANCE_DTYPES narrows)."""
    requested = _csv(DTYPES_VAR)
    if requested is not None:
        return tuple(dtype_from_name(n) for n in requested)
    return manifest.MODULE_DTYPES


def frontend(allowed=None):
    from . import frontends

    return frontends.check(os.environ.get(FRONTEND_VAR, "eager"), allowed or frontends.FRONTENDS)
