"""Run code written for CUDA on mydev, unchanged: `import my_device.transfer_to_mydev` first.

Importing this module patches torch for the rest of the process (there is no undo), so that:

- `torch.device("cuda")`, `torch.device("cuda", 1)`, `torch.device("cuda:1")` build mydev devices (so
  `with torch.device("cuda"):` makes mydev the default device, and `t.device == torch.device("cuda", 0)`
  holds for a tensor on mydev:0); `torch.device` is then a class standing for the C type, which
  `isinstance`, `type(d) == torch.device`, pickling, TorchScript and Dynamo accept as the C type;
- device arguments naming CUDA ("cuda", "cuda:1", a CUDA torch.device built before the import) name
  mydev instead, in the tensor factories (`torch.zeros(..., device="cuda")`, `torch.tensor`, `*_like`,
  `arange`, ...), `Tensor.to`, `Tensor.new_*`, `Tensor.pin_memory`, `Module.to`, `Module.to_empty`,
  `torch.set_default_device`, `torch.Generator(device=...)`, `torch.cuda.Stream(device=...)`,
  `torch.load(map_location=...)` (and checkpoints saved from CUDA load onto mydev when no map_location
  is given), `DataLoader(pin_memory_device=...)`, `torch.autocast`/`torch.amp.autocast`,
  `torch.amp.GradScaler`, `torch.amp.custom_fwd/custom_bwd` and the autocast state queries
  (`torch.is_autocast_enabled()`, `torch.get_autocast_dtype("cuda")`, ...);
- `Tensor.cuda()` / `Module.cuda()` move to mydev, and `Tensor.is_cuda` is true for mydev tensors;
- `torch.cuda.<name>` is `torch.mydev.<name>` for every name both modules have (devices, streams,
  events, memory statistics, random state, synchronisation, `is_bf16_supported`...), and
  `torch.cuda.amp` is `torch.mydev.amp`;
- TorchScript code from `torch.jit.script`, `torch.jit.trace` and `torch.jit.load` that names CUDA
  (`x.to("cuda")`, `torch.device("cuda", 1)`, `device="cuda:0"`, `x.cuda()`, `x.is_cuda`) runs on mydev: its
  graphs are rewritten as those functions return them.

`redirections()` lists what was redirected and `not_redirected()` the torch.cuda names left alone (they
behave as on a machine without CUDA). What cannot be redirected is listed in docs/transfer-to-mydev.md: `t.device.type`
is "mydev", not "cuda"; CUDA-only APIs (graphs, NCCL, NVTX, jiterator, cuDNN/cuBLAS settings, custom
CUDA or Triton kernels), legacy `torch.cuda.FloatTensor` types, TorchScript code compiled before the
import, and device strings passed to functions outside the list above.
"""
import functools
import inspect
import re
import sys

import torch
import torch.utils.data

import my_device  # noqa: F401  (registers mydev and torch.mydev)

__all__ = ["not_redirected", "redirections"]

_CUDA = re.compile(r"^cuda(:\d+)?$")
_redirected: dict = {}


# The C types, kept: after the import `torch.device` and `torch.Generator` name redirecting classes.
_real_device = torch.device
_real_generator = torch.Generator


def _device(value):
    """`value` with CUDA swapped for mydev, when it names a CUDA device; otherwise `value` itself."""
    if isinstance(value, str) and _CUDA.match(value):
        return "mydev" + value[4:]
    if isinstance(value, _real_device) and value.type == "cuda":
        return _real_device("mydev", value.index)
    return value


class _DeviceType(type):
    """Metaclass of the redirecting `torch.device`: the class stands for the C type wherever code compares,
    hashes or type-checks against it. Devices are only ever instances of the C type (the class builds
    them), so `isinstance(d, torch.device)` must ask the C type; and since torch keeps the C type in sets
    and dicts built at import (Dynamo's constant-folded classes and guard globals, pytree's constant types)
    and tests `type(d) in (torch.device, ...)`, the class hashes and compares equal to it."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, _real_device)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _real_device)

    def __eq__(cls, other):
        return other is cls or other is _real_device

    def __ne__(cls, other):
        return not (other is cls or other is _real_device)

    def __hash__(cls):
        return hash(_real_device)


class _Device(metaclass=_DeviceType):
    # torch.device is a C type whose constructor cannot be patched, so `torch.device` is replaced by this
    # class, which returns a real torch.device with CUDA swapped for mydev. Named `torch.device` so that
    # pickling a device (its __reduce__ names `torch.device`) finds it and unpickling a CUDA device
    # gives a mydev one.
    def __new__(cls, *args, **kwargs):
        if args:
            args = (_device(args[0]),) + args[1:]
        if "type" in kwargs:
            kwargs["type"] = _device(kwargs["type"])
        return _real_device(*args, **kwargs)


_Device.__name__ = _Device.__qualname__ = "device"
_Device.__module__ = "torch"
_Device.__doc__ = _real_device.__doc__


def _redirect_devices(fn, name):
    """Wraps `fn` so that positional and `device=` arguments naming CUDA name mydev."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args = tuple(_device(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _device(kwargs["device"])
        return fn(*args, **kwargs)

    _redirected[name] = "device arguments 'cuda[:N]' -> 'mydev[:N]'"
    # TorchScript compiles a call to an ATen function (torch.zeros...) by the function's identity, and would
    # try to compile the wrapper's Python source instead: the wrapper stands for the same operator there.
    op = torch.jit._builtins._find_builtin(fn)
    if op is not None:
        torch.jit._builtins._register_builtin(wrapper, op)
    return wrapper


_FACTORIES = [
    "tensor", "as_tensor", "asarray", "scalar_tensor", "empty", "empty_strided", "empty_like", "zeros", "zeros_like",
    "ones", "ones_like", "full", "full_like", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
    "randperm", "arange", "range", "linspace", "logspace", "eye", "tril_indices", "triu_indices", "normal",
    "sparse_coo_tensor", "sparse_csr_tensor", "from_file", "frombuffer", "complex", "polar", "bartlett_window",
    "blackman_window", "hamming_window", "hann_window", "kaiser_window",
]
_TENSOR_METHODS = ["to", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "new_empty_strided",
                   "pin_memory", "is_pinned"]


def _patch_device_arguments():
    # torch.set_default_device's mode recognises factories by identity, from a set it builds once
    # (torch.utils._device._device_constructors): built now, it holds the C functions the wrappers call.
    import torch.utils._device

    torch.utils._device._device_constructors()
    for name in _FACTORIES:
        if hasattr(torch, name):
            setattr(torch, name, _redirect_devices(getattr(torch, name), f"torch.{name}"))
    for name in _TENSOR_METHODS:
        setattr(torch.Tensor, name, _redirect_devices(getattr(torch.Tensor, name), f"torch.Tensor.{name}"))
    torch.nn.Module.to = _redirect_devices(torch.nn.Module.to, "torch.nn.Module.to")
    torch.nn.Module.to_empty = _redirect_devices(torch.nn.Module.to_empty, "torch.nn.Module.to_empty")
    torch.set_default_device = _redirect_devices(torch.set_default_device, "torch.set_default_device")

    # torch.Generator is a C type and generators made by torch (torch.default_generator, the devices'
    # default ones) are instances of it: the replacement builds a real torch.Generator, and answers
    # isinstance()/issubclass() for it, so both kinds pass type checks.
    real = _real_generator

    class _GeneratorType(type(real)):
        def __instancecheck__(cls, obj):
            return isinstance(obj, real)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, real)

    class Generator(real, metaclass=_GeneratorType):
        def __new__(cls, device="cpu"):
            return real(_device(device))

    Generator.__doc__ = real.__doc__
    torch.Generator = Generator
    _redirected["torch.Generator"] = "device argument 'cuda[:N]' -> 'mydev[:N]'"


def _patch_cuda_methods():
    def tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        return self.to(torch.device("mydev", _index(device)), non_blocking=non_blocking, memory_format=memory_format)

    def module_cuda(self, device=None):
        return self.to(torch.device("mydev", _index(device)))

    def is_cuda(self):
        return self.device.type in ("cuda", "mydev")

    torch.Tensor.cuda = tensor_cuda
    torch.nn.Module.cuda = module_cuda
    torch.Tensor.is_cuda = property(is_cuda)
    _redirected["torch.Tensor.cuda"] = "moves to mydev"
    _redirected["torch.nn.Module.cuda"] = "moves to mydev"
    _redirected["torch.Tensor.is_cuda"] = "true for mydev tensors"


def _index(device):
    if device is None:
        return torch.mydev.current_device()
    if isinstance(device, int):
        return device
    device = _device(device)
    return torch.device(device).index if not isinstance(device, torch.device) else device.index


def _device_context():
    class device(torch.mydev.device):
        def __init__(self, device):
            super().__init__(_device(device))

    device.__doc__ = torch.mydev.device.__doc__
    return device


def _patch_device():
    torch.device = _Device
    _redirected["torch.device"] = ("torch.device('cuda'[, N]) builds torch.device('mydev'[, N]) (so "
                                   "`with torch.device('cuda'):` makes mydev the default device)")
    # TorchScript recognises a device (generator) annotation by identity with `torch.device`
    # (`torch.Generator`) as it is when a function is compiled; annotations written before the import hold
    # the C type. Both spellings mean a device (generator).
    import torch.jit.annotations as annotations

    original = annotations.try_ann_to_type

    @functools.wraps(original)
    def try_ann_to_type(ann, *args, **kwargs):
        if ann is _real_device or ann is _Device:
            return torch._C.DeviceObjType.get()
        if ann is _real_generator or ann is torch.Generator:
            return torch._C._GeneratorType.get()
        return original(ann, *args, **kwargs)

    annotations.try_ann_to_type = try_ann_to_type
    # ...and a `torch.device(...)` call in scripted code by identity too: it compiles to aten::device
    # (which runs in TorchScript's interpreter, so a "cuda" string there stays CUDA; see docs/transfer-to-mydev.md).
    torch.jit._builtins._register_builtin(_Device, "aten::device")


def _stream_type():
    """torch.cuda.Stream: a mydev Stream whose `device` may name CUDA. Streams made by torch.mydev
    (current_stream(), ...) are instances of it too."""
    base = torch.mydev.Stream

    class _StreamType(type(base)):
        def __instancecheck__(cls, obj):
            return isinstance(obj, base)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, base)

    class Stream(base, metaclass=_StreamType):
        def __new__(cls, device=None, priority=0, **kwargs):
            return base.__new__(base if cls is Stream else cls, _device(device), priority, **kwargs)

    Stream.__doc__ = base.__doc__
    return Stream


def _patch_torch_cuda():
    import torch.cuda.amp

    mydev = torch.mydev
    renamed = {"CUDAGraph": "MyDevGraph"}
    for name in torch.cuda.__all__:
        target = getattr(mydev, renamed.get(name, name), None)
        if target is None or name == "amp" or isinstance(target, type(sys)):
            continue
        if inspect.isfunction(target):
            # so that torch.cuda.synchronize("cuda:1"), memory_allocated(torch.device("cuda", 1)) work
            target = _redirect_devices(target, f"torch.cuda.{name}")
        elif target is mydev.device:
            target = _device_context()
        elif target is mydev.Stream:
            target = _stream_type()
        setattr(torch.cuda, name, target)
        _redirected[f"torch.cuda.{name}"] = f"torch.mydev.{renamed.get(name, name)}"
    # The module object stays the one `from torch.cuda.amp import X` finds in sys.modules.
    for name in torch.mydev.amp.__all__:
        setattr(torch.cuda.amp, name, getattr(torch.mydev.amp, name))
        _redirected[f"torch.cuda.amp.{name}"] = f"torch.mydev.amp.{name}"


def _patch_amp():
    autocast = torch.amp.autocast_mode.autocast
    original_init = autocast.__init__

    @functools.wraps(original_init)
    def autocast_init(self, device_type, *args, **kwargs):
        original_init(self, "mydev" if device_type == "cuda" else device_type, *args, **kwargs)

    autocast.__init__ = autocast_init
    _redirected["torch.autocast"] = "device_type 'cuda' -> 'mydev'"

    # Autocast state queries naming CUDA (or, for is_autocast_enabled(), naming no device, which means
    # CUDA) answer for mydev, so code checking its own autocast region sees the region it opened.
    def state_query(fn, no_argument_means_cuda):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not args and not kwargs and no_argument_means_cuda:
                args = ("mydev",)
            args = tuple("mydev" if i == 0 and a == "cuda" else a for i, a in enumerate(args))
            if kwargs.get("device_type") == "cuda":
                kwargs["device_type"] = "mydev"
            return fn(*args, **kwargs)

        return wrapper

    for name in ("is_autocast_enabled", "get_autocast_dtype", "set_autocast_enabled", "set_autocast_dtype"):
        setattr(torch, name, state_query(getattr(torch, name), name == "is_autocast_enabled"))
        _redirected[f"torch.{name}"] = "device_type 'cuda' -> 'mydev'"

    scaler = torch.amp.GradScaler
    original_scaler_init = scaler.__init__

    @functools.wraps(original_scaler_init)
    def scaler_init(self, device="cuda", *args, **kwargs):
        original_scaler_init(self, "mydev" if device == "cuda" else device, *args, **kwargs)

    scaler.__init__ = scaler_init
    _redirected["torch.amp.GradScaler"] = "device 'cuda' (its default) -> 'mydev'"

    for name in ("custom_fwd", "custom_bwd"):
        original = getattr(torch.amp, name)

        def wrapper(*args, _original=original, **kwargs):
            if kwargs.get("device_type") == "cuda":
                kwargs["device_type"] = "mydev"
            return _original(*args, **kwargs)

        functools.update_wrapper(wrapper, original)
        setattr(torch.amp, name, wrapper)
        _redirected[f"torch.amp.{name}"] = "device_type 'cuda' -> 'mydev'"


def _backend(value):
    """A c10d backend string with NCCL swapped for mccl: "nccl" -> "mccl", "cuda:nccl" -> "mydev:mccl",
    "cpu:gloo,cuda:nccl" -> "cpu:gloo,mydev:mccl"; anything else as it is."""
    if not isinstance(value, str):
        return value
    parts = []
    for part in value.split(","):
        device, colon, name = part.strip().rpartition(":")
        if name.lower() == "nccl" and (not colon or device.lower() == "cuda"):
            part = "mydev:mccl" if colon else "mccl"
        parts.append(part)
    return ",".join(parts)


def _patch_distributed():
    import torch.distributed as dist

    if not dist.is_available():
        return
    c10d = dist.distributed_c10d

    def redirect(fn, name):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs)
            if "backend" in bound.arguments:
                bound.arguments["backend"] = _backend(bound.arguments["backend"])
            if "device_id" in bound.arguments:
                bound.arguments["device_id"] = _device(bound.arguments["device_id"])
            return fn(*bound.args, **bound.kwargs)

        _redirected[name] = "backend 'nccl' -> 'mccl', 'cuda:nccl' -> 'mydev:mccl'; device_id 'cuda' -> 'mydev'"
        return wrapper

    # Both names: scripts call dist.init_process_group, torch's own code c10d's.
    for name in ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration"):
        wrapper = redirect(getattr(c10d, name), f"torch.distributed.{name}")
        setattr(c10d, name, wrapper)
        setattr(dist, name, wrapper)
    # Code that picks NCCL when it is available picks it, and so mccl.
    dist.is_nccl_available = lambda: True
    _redirected["torch.distributed.is_nccl_available"] = "true: 'nccl' is mccl"
    # FSDP2 and tensor-parallel scripts build their mesh with init_device_mesh("cuda", ...).
    import torch.distributed.device_mesh as device_mesh

    if hasattr(device_mesh, "init_device_mesh"):
        wrapper = _redirect_devices(device_mesh.init_device_mesh, "torch.distributed.device_mesh.init_device_mesh")
        device_mesh.init_device_mesh = wrapper


def _patch_profiler():
    import torch.autograd.profiler
    import torch.profiler

    activity = torch.profiler.ProfilerActivity
    profile = torch.profiler.profile
    original_init = profile.__init__

    @functools.wraps(original_init)
    def profile_init(self, *args, **kwargs):
        if args:
            args = (_activities(args[0]),) + args[1:]
        if "activities" in kwargs:
            kwargs["activities"] = _activities(kwargs["activities"])
        original_init(self, *args, **kwargs)

    def _activities(activities):
        if activities is None:
            return None
        return [activity.PrivateUse1 if a == activity.CUDA else a for a in activities]

    profile.__init__ = profile_init
    _redirected["torch.profiler.profile"] = "ProfilerActivity.CUDA -> ProfilerActivity.PrivateUse1"

    legacy = torch.autograd.profiler.profile
    original_legacy_init = legacy.__init__

    @functools.wraps(original_legacy_init)
    def legacy_init(self, *args, **kwargs):
        if kwargs.pop("use_cuda", False):
            kwargs["use_device"] = "mydev"
        if kwargs.get("use_device") == "cuda":
            kwargs["use_device"] = "mydev"
        original_legacy_init(self, *args, **kwargs)

    legacy.__init__ = legacy_init
    _redirected["torch.autograd.profiler.profile"] = "use_cuda=True, use_device='cuda' -> use_device='mydev'"


def _restore_location(storage, location):
    # Tensors saved on CUDA carry location tags "cuda" / "cuda:N".
    return torch.serialization.default_restore_location(storage, _device(location))


def _map_location(map_location):
    if map_location is None:
        return _restore_location
    if isinstance(map_location, dict):
        return {key: _device(value) for key, value in map_location.items()}
    return _device(map_location)


def _patch_load():
    original = torch.load

    @functools.wraps(original)
    def load(f, map_location=None, *args, **kwargs):
        return original(f, _map_location(map_location), *args, **kwargs)

    torch.load = load
    _redirected["torch.load"] = ("map_location 'cuda[:N]', torch.device('cuda') and dict values -> mydev; "
                                 "without map_location, tensors saved on CUDA load onto mydev")


def _patch_data_loader():
    loader = torch.utils.data.DataLoader
    original_init = loader.__init__

    @functools.wraps(original_init)
    def init(self, *args, **kwargs):
        if "pin_memory_device" in kwargs:
            kwargs["pin_memory_device"] = _device(kwargs["pin_memory_device"]) or ""
        original_init(self, *args, **kwargs)

    loader.__init__ = init
    _redirected["torch.utils.data.DataLoader"] = "pin_memory_device 'cuda' -> 'mydev'"


def _redirect_graph(graph):
    """Rewrites, in place, what names CUDA in a TorchScript graph as eager code is redirected: Device
    constants "cuda[:N]", "cuda[:N]" strings made into devices (`torch.device("cuda", 1)`, a string passed
    where a device is expected), `Tensor.cuda()` and `Tensor.is_cuda`. Returns the number of rewrites.

    TorchScript code does not call the patched Python functions: the compiler folds `device="cuda"` into
    constants and `x.cuda()` into an interpreter op, so the redirection has to be made in the graph. It
    must happen before the function first runs, since its executor keeps an optimized copy of the graph."""
    count = 0
    for node in graph.findAllNodes("prim::Constant", True):
        if not node.hasAttribute("value") or node.kindOf("value") != "s" or not _CUDA.match(node.s("value")):
            continue
        kind = node.output().type().kind()
        if kind == "DeviceObjType":
            node.s_("value", _device(node.s("value")))
            count += 1
        elif kind == "StringType":
            # Constants are pooled: the same "cuda" may also be compared with `t.device.type` (which
            # says "mydev" in eager code too), so only its uses as a device get a mydev string.
            for use in node.output().uses():
                if use.user.kind() == "aten::device" and use.offset == 0:
                    with graph.insert_point_guard(use.user):
                        use.user.replaceInput(0, graph.insertConstant(_device(node.s("value"))))
                    count += 1
    for node in graph.findAllNodes("aten::device", True):
        # A device string only known when the code runs (an argument: `x.to(dev)` called with "cuda:1").
        # "cuda" can only start a valid device string, so renaming its first occurrence is the eager rule.
        name = node.inputsAt(0) if node.inputsSize() > 0 else None
        if name is None or name.type().kind() != "StringType" or name.node().kind() == "prim::Constant" or \
                _renames_cuda(name.node()):
            continue   # constants are rewritten above; and this one was renamed by an earlier call
        with graph.insert_point_guard(node):
            renamed = graph.insert("aten::replace", [name, graph.insertConstant("cuda"),
                                                     graph.insertConstant("mydev"), graph.insertConstant(1)])
        renamed.node().copyMetadata(node)
        node.replaceInput(0, renamed)
        count += 1
    for node in graph.findAllNodes("aten::cuda", True):
        # TorchScript's Tensor.cuda() moves to the current CUDA device: to the current mydev device here.
        with graph.insert_point_guard(node):
            moved = graph.insert("aten::to", [node.input(), graph.insertConstant(_real_device("mydev"))])
        moved.node().copyMetadata(node)   # the source line, for TorchScript's error traceback
        node.output().replaceAllUsesWith(moved)
        node.destroy()
        count += 1
    for node in graph.findAllNodes("prim::is_cuda", True):
        # `Tensor.is_cuda` is true for mydev tensors after the import.
        with graph.insert_point_guard(node):
            device_type = graph.insert("prim::type", [graph.insert("prim::device", [node.input()])])
            on_mydev = graph.insert("aten::eq", [device_type, graph.insertConstant("mydev")])
        on_mydev.node().copyMetadata(node)
        node.output().replaceAllUsesWith(on_mydev)
        node.destroy()
        count += 1
    if count:
        torch._C._jit_pass_dce(graph)   # the constants graph.insert made for the overloads it did not pick
    return count


def _renames_cuda(node):
    """Whether `node` is the aten::replace(s, "cuda", "mydev", 1) _redirect_graph inserts."""
    if node.kind() != "aten::replace":
        return False
    constants = [v.toIValue() if v.node().kind() == "prim::Constant" else None for v in node.inputs()]
    return constants[1:] == ["cuda", "mydev", 1]


def _redirect_script_module(module):
    """Every method of a (C++) ScriptModule and of its submodules, hooks included."""
    def visit(m):
        for name in m._method_names():
            _redirect_graph(m._get_method(name).graph)
        for hook in list(m._get_forward_pre_hooks()) + list(m._get_forward_hooks()):
            _redirect_graph(hook.graph)

    module.apply(visit)


# Free functions of the process-wide compilation unit that torch.jit.script compiles into, already
# rewritten: each is compiled once, and is rewritten once, before anything ran it.
_redirected_functions: set = set()


def _redirect_compilation_unit(cu, done=None):
    # Free functions called from scripted code (prim::CallFunction) live in a compilation unit: the
    # process-wide one for torch.jit.script, a new one per torch.jit.load.
    for fn in cu.get_functions():
        if done is not None:
            if fn.qualified_name in done:
                continue
            done.add(fn.qualified_name)
        _redirect_graph(fn.graph)


def _redirect_scripted(obj):
    if isinstance(obj, torch.jit.ScriptModule):
        _redirect_script_module(obj._c)
    elif isinstance(obj, torch.jit.ScriptFunction):
        _redirect_graph(obj.graph)
    _redirect_compilation_unit(torch.jit._state._python_cu, _redirected_functions)
    return obj


def _patch_torchscript():
    import torch.jit._script
    import torch.jit._trace

    # Scripting compiles the functions a function calls by calling torch.jit.script again, while the
    # caller's graph is still being built: graphs are rewritten when the outermost call returns.
    depth = [0]

    def returns_redirected(fn, name, where):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            depth[0] += 1
            try:
                result = fn(*args, **kwargs)
            finally:
                depth[0] -= 1
            return _redirect_scripted(result) if depth[0] == 0 else result

        for module in where:
            setattr(module, name, wrapper)
        return wrapper

    returns_redirected(torch.jit.script, "script", [torch.jit, torch.jit._script])
    returns_redirected(torch.jit.trace, "trace", [torch.jit, torch.jit._trace])
    returns_redirected(torch.jit.trace_module, "trace_module", [torch.jit, torch.jit._trace])
    _redirected["torch.jit.script"] = ("'cuda' devices, 'cuda[:N]' device strings, Tensor.cuda() and "
                                       "Tensor.is_cuda in the compiled code -> mydev")
    _redirected["torch.jit.trace"] = _redirected["torch.jit.trace_module"] = _redirected["torch.jit.script"]

    # torch.jit.load compiles the saved code into a compilation unit of its own, which the C importer
    # receives: wrapping the importer reaches the module and the free functions it calls.
    for name in ("import_ir_module", "import_ir_module_from_buffer"):
        original = getattr(torch._C, name)

        def importer(cu, f, map_location, *args, _original=original):
            module = _original(cu, f, _device(map_location), *args)
            _redirect_script_module(module)
            _redirect_compilation_unit(cu)
            return module

        functools.update_wrapper(importer, original)
        setattr(torch._C, name, importer)
    _redirected["torch.jit.load"] = "map_location 'cuda[:N]' -> mydev; 'cuda' in the saved code as torch.jit.script"


def _patch_inductor_system_key():
    # Inductor keys its on-disk cache by the host's GPU, read through torch.cuda.get_device_properties:
    # with torch.cuda answering for mydev, it took mydev's properties for a ROCm device's
    # (torch.version.cuda is None) and failed on the missing `gcnArchName`, so torch.compile's default
    # backend failed after the import. While the key is computed (once; it is cached) the function answers
    # as on a host without CUDA, which this host is (RuntimeError, which Inductor expects then).
    # Waits for the import, as importing Inductor costs about a second.
    def no_cuda_device(*args, **kwargs):
        raise RuntimeError("no CUDA device (torch.cuda is redirected to mydev)")

    def patch(codecache):
        original = codecache.CacheBase.get_system

        @functools.cache
        def get_system():
            redirected = torch.cuda.get_device_properties
            torch.cuda.get_device_properties = no_cuda_device
            try:
                return original()
            finally:
                torch.cuda.get_device_properties = redirected

        # uncached, for test_transfer_to_mydev.py, which notices when this is no longer needed
        get_system._torch_original = getattr(original, "__wrapped__", original)
        codecache.CacheBase.get_system = staticmethod(get_system)

    my_device.when_imported("torch._inductor.codecache", patch)


def _patch_accelerate():
    # accelerate (which transformers' Trainer trains through) refuses fp16 mixed precision on a device type
    # outside a list written into Accelerator.__init__ ("cuda", "npu", "xpu"...): a CUDA script's Trainer
    # with fp16=True failed on mydev. The list is a constant of that function, so the function gets a copy
    # of its code whose list names mydev too; nothing else changes. Waits for the import.
    # test_transfer_to_mydev.py::test_accelerate_still_refuses_fp16_on_mydev notices when the list names it.
    def patch(accelerator):
        init = accelerator.Accelerator.__init__
        lists = [c for c in init.__code__.co_consts if isinstance(c, tuple) and "cuda" in c and "npu" in c]
        if len(lists) != 1 or "mydev" in lists[0]:
            return
        consts = tuple(c + ("mydev",) if c is lists[0] else c for c in init.__code__.co_consts)
        patched = functools.wraps(init)(type(init)(init.__code__.replace(co_consts=consts), init.__globals__,
                                                   init.__name__, init.__defaults__, init.__closure__))
        patched.__kwdefaults__ = init.__kwdefaults__
        patched._torch_original = init
        accelerator.Accelerator.__init__ = patched
        _redirected["accelerate.Accelerator"] = "fp16 mixed precision accepts mydev"

    my_device.when_imported("accelerate.accelerator", patch)


def redirections() -> dict:
    """What this module redirected: {"torch.cuda.synchronize": "torch.mydev.synchronize", ...}."""
    return dict(_redirected)


def not_redirected() -> list:
    """The public torch.cuda names left as they are (CUDA-only: NCCL, NVTX, jiterator...)."""
    return sorted(f"torch.cuda.{n}" for n in torch.cuda.__all__
                  if f"torch.cuda.{n}" not in _redirected and n != "amp")


def _install():
    _patch_inductor_system_key()
    _patch_device()
    _patch_device_arguments()
    _patch_cuda_methods()
    _patch_torch_cuda()
    _patch_amp()
    _patch_load()
    _patch_data_loader()
    _patch_torchscript()
    _patch_distributed()
    _patch_profiler()
    _patch_accelerate()


_install()
