"""Runs a function when a given module has been imported.

WORKAROUND (torch 2.13): Dynamo keeps a fixed list of device interfaces
(torch._dynamo.device_interface.init_device_reg: cuda, xpu, mtia, cpu, mps,
tpu) and, unlike Inductor's backend registry, never asks the privateuse1
module for one. Registering mydev's at `import my_device` would import
torch._dynamo (about a second) for every eager user, so the registration
waits for torch._dynamo.device_interface to be imported.
test_inductor.py::test_dynamo_device_interface_workaround_still_needed fails
once torch finds the interface by itself.
"""

import importlib.abc
import sys
import threading

_pending: dict = {}
_lock = threading.Lock()


class _Loader(importlib.abc.Loader):
    def __init__(self, wrapped, callbacks):
        self._wrapped = wrapped
        self._callbacks = callbacks

    def create_module(self, spec):
        return self._wrapped.create_module(spec)

    def exec_module(self, module):
        self._wrapped.exec_module(module)
        for callback in self._callbacks:
            callback(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _pending:
            return None
        with _lock:
            callbacks = _pending.pop(name, None)
        if callbacks is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _Loader(spec.loader, callbacks)
                return spec
        return None


_finder = _Finder()


def when_imported(name: str, callback) -> None:
    """Calls callback(module) once `name` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    with _lock:
        _pending.setdefault(name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
    from . import _patches

    _patches.record(
        "sys.meta_path: an import hook (my_device._import_hooks)", why="registrations that must wait for a "
        "torch module's import (Dynamo's device interface, Inductor's graphs, jagged attention): importing "
        "those modules at `import my_device` would cost every eager user about a second",
        test="test_inductor.py::test_dynamo_device_interface_workaround_still_needed")
