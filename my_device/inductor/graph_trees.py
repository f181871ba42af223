"""Inductor's cudagraph trees on mydev: torch.compile(mode="reduce-overhead") as CUDA runs it by default.

torch 2.13's trees (torch/_inductor/cudagraph_trees.py) keep the graphs of a model's forward and backward, and
of the branches a program takes, in one memory pool, and tell a user who reads an output that a later replay
has overwritten. They are written against CUDA by name: torch.cuda's graph, stream and device classes, the CUDA
caching allocator's pool checkpoints and storage bindings in torch._C, and `tensor.is_cuda`. Their logic holds
for any device with graphs and a caching allocator with private pools, so mydev runs that file's own code a
second time, as a private module:
- its `torch` is torch with `torch.cuda` meaning torch.mydev and the CUDA-only bindings of torch._C meaning
  mydev's (csrc/python/Graph.cpp: pool checkpoints, storage ownership, tensors rebuilt from storages);
- its `.is_cuda` attribute reads are `.is_mydev` (its code objects, rewritten when loaded);
- its tree containers are torch's own, keyed by device index, so torch's `get_manager` (asked by Inductor for
  the backward of a graphed forward), `reset_cudagraph_trees` (torch._dynamo.reset) and
  `torch.compiler.cudagraph_mark_step_begin` reach mydev's trees as they reach CUDA's.
test_graphs.py notices when torch ships device-generic trees.
"""
import contextlib
import importlib
import inspect
import types

import torch

from .. import _C

_TREES = "torch._inductor.cudagraph_trees"
_WHY_TEST = "test_graphs.py::test_cudagraph_trees_are_still_cuda_only_in_pytorch"
_trees = None


def on_mydev(inputs) -> bool:
    """Whether a compiled graph's inputs are on mydev (its graphs are then mydev's)."""
    return any(isinstance(x, torch.Tensor) and x.device.type == "mydev" for x in inputs)


def _tensors_data_ptrs_at_indices_equal(tensors, data_ptrs, indices) -> bool:
    return all(tensors[i].data_ptr() == data_ptrs[i] for i in indices)


def _tensor_from_storage_and_metadata(metadata, storage):
    return _C._tensor_from_storage(storage, metadata["dtype"], list(metadata["size"]), list(metadata["stride"]),
                                   metadata["storage_offset"])


def _restore_pool(device, state, stale, alive) -> None:
    _C._pool_restore(state, stale, alive)


def _pool_allocations_are(device, pool, ptrs) -> bool:
    return _C._pool_allocations_are(device, pool, list(ptrs))


# A queued mydev kernel holds references to the small tensors it uses (KernelArgs.h), and a finished one
# until a host thread reaps it (at the next launch or synchronisation): a tensor dead to the program stays
# alive, and its block of the trees' pool allocated, a while longer (CUDA frees it at once, in stream
# order). The trees read which of their tensors are alive, and the pool's state, only when they warm up,
# record or check a graph, never on a replay; there the device is synchronised first, so that liveness is
# the program's and no reference goes away between the trees' reading of it and the pool's restoring.
def _after_synchronizing(function):
    def run(*args, **kwargs):
        for device in range(torch.mydev.device_count()):
            torch.mydev.synchronize(device)
        return function(*args, **kwargs)

    return run


def _no_workspaces() -> None:
    """mydev's kernels keep no library workspace between calls: nothing to clear around a recording."""


class _TorchCWithMyDev(types.ModuleType):
    """torch._C with the CUDA bindings the trees call answered for mydev."""

    def __init__(self):
        super().__init__("torch._C")
        self._cuda_clearCublasWorkspaces = _no_workspaces
        self._cuda_get_conv_benchmark_empty_cache = lambda: False
        self._cudnn_set_conv_benchmark_empty_cache = lambda enabled: None
        self._cuda_isHistoryEnabled = _C._memory_history_enabled
        self._cuda_beginAllocateCurrentThreadToPool = _C._begin_allocate_current_thread_to_pool
        self._cuda_endAllocateToPool = _C._end_allocate_current_thread_to_pool
        # The warm-up routes allocations to the trees' pool without taking a use of it: the trees' own
        # (empty) graph keeps that pool alive, so there is nothing to release.
        self._cuda_releasePool = lambda device, pool: None
        self._cuda_getCheckpointState = _C._pool_checkpoint
        self._cuda_setCheckpointPoolState = _restore_pool
        self._cuda_checkPoolLiveAllocations = _pool_allocations_are
        self._cuda_cudaCachingAllocator_raw_delete = _C._raw_delete
        self._free_And_Remove_DeleterFn = _C._free_and_disown
        self._has_Standard_Deleter = _C._owns_device_memory
        self._set_storage_access_error_msg = _C._set_storage_access_error_msg
        self._set_storage_data_ptr_access_error_msg = _C._set_storage_data_ptr_access_error_msg
        self._tensors_data_ptrs_at_indices_equal = _tensors_data_ptrs_at_indices_equal
        self._construct_CUDA_Tensor_From_Storage_And_Metadata = _tensor_from_storage_and_metadata

    def __getattr__(self, name):
        return getattr(torch._C, name)


def _torch_with_mydev():
    from ..mydev import device, memory, memory_snapshot
    from ..mydev.graphs import _TorchWithMyDevAsCuda

    view = _TorchWithMyDevAsCuda()
    view.cuda = types.SimpleNamespace(**vars(view.cuda), device=device, memory=memory,
                                      memory_snapshot=memory_snapshot)
    view._C = _TorchCWithMyDev()
    return view


def _reading_is_mydev(code: types.CodeType) -> types.CodeType:
    """`code` (and the functions and classes nested in it) with attribute reads of `is_cuda` made of `is_mydev`."""
    consts = tuple(_reading_is_mydev(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    names = tuple("is_mydev" if n == "is_cuda" else n for n in code.co_names)
    return code.replace(co_consts=consts, co_names=names)


def trees():
    """The mydev instance of Inductor's cudagraph trees module (built on first use)."""
    global _trees
    if _trees is not None:
        return _trees
    real = importlib.import_module(_TREES)
    # The containers of torch's trees, taken before this instance's module code registers its own in the
    # thread-local state that autograd's threads inherit; they are registered again below.
    containers = real.get_obj(real.local, "tree_manager_containers")
    locks = real.get_obj(real.local, "tree_manager_locks")
    source = inspect.getsource(real)
    module = types.ModuleType(_TREES)  # torch's name: its log artifacts ("cudagraphs") stay under TORCH_LOGS
    module.__dict__.update(__file__=real.__file__, __package__=real.__package__, __spec__=None)
    exec(_reading_is_mydev(compile(source, real.__file__, "exec")), module.__dict__)  # noqa: S102
    torch._C._stash_obj_in_tls("tree_manager_containers", containers)
    torch._C._stash_obj_in_tls("tree_manager_locks", locks)
    module.local = real.local
    module.MarkStepBox = real.MarkStepBox
    module.graph_capture_lock = real.graph_capture_lock
    module.torch = _torch_with_mydev()
    module.check_memory_pool = _after_synchronizing(module.check_memory_pool)
    manager = module.CUDAGraphTreeManager
    manager.apply_checkpoint_execution_state_in_allocator = _after_synchronizing(
        manager.apply_checkpoint_execution_state_in_allocator)
    # Both modes handle torch.cond in a graph through CUDA's conditional graph nodes (and a torch.cuda.Stream
    # made when they are entered); mydev's graphs have no conditional nodes, so a graph with torch.cond is
    # refused when its capture reads the predicate on the host.
    module.ControlFlowOpWarmupDispatchMode = contextlib.nullcontext
    module.CUDAGraphCaptureControlFlowOpDispatchMode = contextlib.nullcontext
    shared_get_container = module.get_container

    def get_container(device_index: int):
        container = shared_get_container(device_index)
        if not isinstance(container, module.TreeManagerContainer):
            raise RuntimeError(
                f"cudagraph trees on cuda:{device_index} and mydev:{device_index} in one process: torch 2.13 keeps "
                "one tree per device index, whatever the device type; compile one of them with "
                "torch._inductor.config.triton.cudagraph_trees = False")
        return container

    module.get_container = get_container
    _trees = module
    return module


def install_tree_dispatch(real) -> None:
    """torch's trees' entry point sends a callable whose inputs are on mydev to mydev's trees: Inductor's
    cudagraphify (mode="reduce-overhead") and Dynamo's backend="cudagraphs" both reach the trees there."""
    from .. import _patches

    original = real.cudagraphify_impl

    def cudagraphify_impl(model, inputs, static_input_idxs, *args, **kwargs):
        if on_mydev(inputs):
            return trees().cudagraphify_impl(model, inputs, static_input_idxs, *args, **kwargs)
        return original(model, inputs, static_input_idxs, *args, **kwargs)

    _patches.replace(real, "cudagraphify_impl", cudagraphify_impl,
                     target="torch._inductor.cudagraph_trees.cudagraphify_impl",
                     why="the trees call CUDA by name; mydev's callables get mydev's instance of them",
                     test=_WHY_TEST)


def install_backend_device(backend) -> None:
    """Dynamo's backend="cudagraphs" asks the graph's device index of a CUDA device only."""
    from .. import _patches

    original = backend.get_device_index

    def get_device_index(gm):
        device = next(iter(backend.get_device_node_mapping(gm)))
        return device.index if device.type == "mydev" else original(gm)

    _patches.replace(backend, "get_device_index", get_device_index,
                     target="torch._dynamo.backends.cudagraphs.get_device_index",
                     why="it asserts a CUDA device", test=_WHY_TEST)
