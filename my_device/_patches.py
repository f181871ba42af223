"""Every change my_device makes to torch's own code goes through here, and `my_device.patches()` lists them.

A patch replaces one attribute (a function or method of torch) with a wrapper that answers for mydev and
passes everything else to torch's original, which stays reachable as the wrapper's `_torch_original`.
Each is recorded with why it is needed and the test that fails once torch no longer needs it
(docs/torch-patches.md is the same list, with the patches `transfer_to_mydev` makes on request).
Changes that replace no attribute (an import hook, an exit handler, autograd's threading) are recorded too.
Some patches are installed only when the torch module they change is first imported.
"""
import threading

_lock = threading.Lock()
_installed = {}


def replace(owner, name: str, replacement, *, target: str, why: str, test: str):
    """Sets owner.<name> to `replacement` (once: a second call keeps the first), keeping torch's original as
    `replacement._torch_original`, and records the patch. Returns what owner.<name> is afterwards."""
    with _lock:
        current = getattr(owner, name)
        if getattr(current, "_torch_original", None) is not None:
            return current
        replacement._torch_original = current
        setattr(owner, name, replacement)
        _installed[target] = {"target": target, "why": why, "test": test, "kind": "replaced"}
        return replacement


def record(target: str, *, why: str, test: str) -> None:
    """Records a change that replaces no attribute of torch."""
    with _lock:
        _installed.setdefault(target, {"target": target, "why": why, "test": test, "kind": "added"})


def original(function):
    """torch's own version of a patched function (the function itself if it is not a patch)."""
    return getattr(function, "_torch_original", function)


def patches() -> list:
    """The changes to torch installed in this process so far, each a dict: target, why, test (the one that
    fails once torch no longer needs it), kind ("replaced" an attribute, or "added" behaviour)."""
    with _lock:
        return [dict(p) for _, p in sorted(_installed.items())]
