"""torch.mydev.FloatStorage and its siblings: the legacy typed storage classes, as torch.cuda has them.

`Tensor.storage_type()` and `isinstance(t.storage(), torch.mydev.FloatStorage)` look a
storage's class up by name in the device's module (`torch.<device>.<Name>Storage`), and
tell its device from the module the class was defined in, by its last dotted part
(`torch.storage._get_device_from_module`): so the classes say they are `my_device.mydev`'s.
"""
import torch
from torch.storage import _LegacyStorage, _warn_typed_storage_removal
from torch._utils import classproperty

_MODULE = __name__.rsplit(".", 1)[0]  # my_device.mydev, whose last part names the device


class _MyDevLegacyStorage(_LegacyStorage):
    # Host-memory constructors make no sense for device memory, as for CUDA's.
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for mydev storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for mydev storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for mydev storage")


def _storage_class(name, dtype):
    def public_dtype(cls):
        _warn_typed_storage_removal()
        return dtype

    return type(name, (_MyDevLegacyStorage,), {
        "__module__": _MODULE,
        "dtype": classproperty(public_dtype),
        "_dtype": classproperty(lambda cls: dtype),
    })


_CLASSES = {name: _storage_class(name, dtype)
            for dtype, name in torch.storage._dtype_to_storage_type_map().items()}
globals().update(_CLASSES)
_MyDevLegacyStorage.__module__ = _MODULE
__all__ = sorted(_CLASSES)
