"""python -m my_device.conformance.sync_scan: which OpInfos make the host wait for mydev.

On a GPU most ops are queued and only a few wait for the device (ops whose output shapes depend on the data,
host reads). This runs each OpInfo's first samples on mydev twice, the second time under
`torch.mydev.set_sync_debug_mode("error")`, and lists the OpInfos whose second run waited, with the aten ops
that did, as called from Python (a composite op such as cummax stands for the part of it that waited). The first
run lets the queued path learn each call's dtypes, which it runs at the call once.

    python -m my_device.conformance.sync_scan                      # float32, every OpInfo
    python -m my_device.conformance.sync_scan --dtype int64 --ops add,nn.functional.pad
"""
import argparse
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import my_device  # noqa: F401

SYNC_MESSAGE = "called a synchronizing mydev operation"


class _WaitingOps(TorchDispatchMode):
    """Records the aten ops that raised sync debug mode's error."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            return func(*args, **(kwargs or {}))
        except RuntimeError as e:
            if SYNC_MESSAGE in str(e):
                self.ops.add(str(func.overloadpacket) + "." + func._overloadname)
            raise


def _run(op, sample):
    try:
        op(sample.input, *sample.args, **sample.kwargs)
    except Exception:  # noqa: BLE001 - a sample the op rejects says nothing about waiting
        pass


def scan(dtype, names=None, samples_per_op=4):
    """{OpInfo full name: sorted aten ops that made the host wait}, for OpInfos whose samples waited."""
    from torch.testing._internal.common_methods_invocations import op_db

    waited = {}
    for op in op_db:
        full = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
        if (names and full not in names and op.name not in names) or dtype not in op.supported_dtypes("cpu"):
            continue
        try:
            samples = list(op.sample_inputs("mydev", dtype))[:samples_per_op]
        except Exception:  # noqa: BLE001 - OpInfos whose sample generators need another device
            continue
        for sample in samples:
            _run(op, sample)
            try:
                torch.mydev.synchronize()
            except RuntimeError:
                pass
            spy = _WaitingOps()
            torch.mydev.set_sync_debug_mode("error")
            try:
                with spy:
                    _run(op, sample)
            finally:
                torch.mydev.set_sync_debug_mode("default")
            try:
                torch.mydev.synchronize()
            except RuntimeError:
                pass
            if spy.ops:
                waited.setdefault(full, set()).update(spy.ops)
    return {k: sorted(v) for k, v in sorted(waited.items())}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    names = set(filter(None, args.ops.split(",")))
    waited = scan(getattr(torch, args.dtype), names)
    for name, ops in waited.items():
        print(f"{name:<45} {', '.join(ops)}")
    print(f"{len(waited)} OpInfos made the host wait ({args.dtype}).")


if __name__ == "__main__":
    main()
