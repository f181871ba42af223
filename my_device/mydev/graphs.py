"""torch.mydev's device graphs, as torch.cuda's: a stream's work captured once, replayed as one launch.

The graph class is torch.accelerator.Graph, whose C++ side finds the mydev implementation
(csrc/core/Graph.cpp) in PyTorch's graph registry; MyDevGraph gives it torch.cuda.CUDAGraph's
method signatures. docs/graphs.md says what can be captured.
"""
import gc
import types
from typing import Optional

import torch

from .. import _C

__all__ = [
    "MyDevGraph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
]


def graph_pool_handle():
    """A memory pool id that graphs captured with ``pool=`` it share (torch.cuda.graph_pool_handle)."""
    return _C._graph_pool_handle()


def is_current_stream_capturing() -> bool:
    """Whether the current stream of the current mydev device is capturing a graph."""
    from . import current_device, is_initialized

    return is_initialized() and _C._is_current_stream_capturing(current_device())


class MyDevGraph(torch.accelerator.Graph):
    """A captured mydev graph (torch.cuda.CUDAGraph's interface).

    ``keep_graph=True`` keeps the captured graph after ``capture_end`` (instantiated at ``instantiate()`` or
    the first ``replay()``); ``enable_debug_mode()`` before the capture ends keeps it for ``debug_dump``.
    """

    def __new__(cls, keep_graph: bool = False):
        return super().__new__(cls, keep_graph)

    def __init__(self, keep_graph: bool = False):
        super().__init__(keep_graph)

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        self.graph_pool = pool
        self.capture_error_mode = capture_error_mode
        super().capture_begin()


class graph:
    """Context manager: captures the block's mydev work into ``mydev_graph`` (torch.cuda.graph).

    The block runs on ``stream`` (by default one side stream shared by all captures), after the device was
    synchronised and the allocator's cache emptied. ``pool`` shares another graph's memory pool
    (``other.pool()`` or ``graph_pool_handle()``). If the block raises, the capture is ended and discarded
    and the block's exception propagates.
    """

    default_capture_stream: Optional[torch.Stream] = None

    def __init__(self, mydev_graph: MyDevGraph, pool=None, stream: Optional[torch.Stream] = None,
                 capture_error_mode: str = "global"):
        from . import Stream

        if stream is None:
            if graph.default_capture_stream is None:
                graph.default_capture_stream = Stream()
            stream = graph.default_capture_stream
        self.capture_stream = stream
        self.mydev_graph = mydev_graph
        self.pool = pool
        self.capture_error_mode = capture_error_mode

    def __enter__(self):
        from . import empty_cache, stream, synchronize

        synchronize()
        if torch.compiler.config.force_cudagraph_gc:
            gc.collect()
        empty_cache()
        self.stream_ctx = stream(self.capture_stream)
        self.stream_ctx.__enter__()
        try:
            self.mydev_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb):
        try:
            self.mydev_graph.capture_end()
        except Exception:
            if exc_type is None:
                raise
            # The block's own error explains this one (it invalidated the capture): let it through.
        finally:
            self.stream_ctx.__exit__(exc_type, exc, tb)
        return False


# torch.cuda.make_graphed_callables (and Inductor's non-tree cudagraphify_impl, inductor/graphs.py) are
# written against torch.cuda by name (torch.cuda.CUDAGraph, torch.cuda.graph, torch.cuda.Stream,
# torch.is_autocast_enabled() for CUDA) and torch 2.13 has no device-generic version. Their logic (warm-up,
# capture, static inputs and outputs, for make_graphed_callables one forward and one backward graph per
# callable and the autograd.Function replaying them) applies to mydev unchanged, so mydev runs PyTorch's own
# functions with those names bound to torch.mydev's. test_graphs.py notices when PyTorch ships
# device-generic ones.
class _TorchWithMyDevAsCuda(types.ModuleType):
    def __init__(self):
        super().__init__("torch")
        from . import Stream, current_stream, stream, synchronize

        self.cuda = types.SimpleNamespace(
            CUDAGraph=MyDevGraph, graph=graph, Stream=Stream, stream=stream, synchronize=synchronize,
            current_stream=current_stream, graph_pool_handle=graph_pool_handle,
            make_graphed_callables=make_graphed_callables,
        )

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def is_autocast_enabled(device_type: str = "mydev") -> bool:
        return torch.is_autocast_enabled(device_type)


def _with_mydev_as_cuda(function, module, **names):
    """`function` (of `module`) rebuilt with `torch.cuda` (and `names`) meaning torch.mydev's."""
    bound = dict(vars(module), torch=_TorchWithMyDevAsCuda(), **names)
    rebuilt = types.FunctionType(function.__code__, bound, function.__name__, function.__defaults__,
                                 function.__closure__)
    rebuilt.__kwdefaults__ = function.__kwdefaults__
    return rebuilt


_graphed_callables_impl = None


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           pool=None):
    """Graphed versions of callables (modules or functions) and their backward passes, as
    torch.cuda.make_graphed_callables: each is warmed up, captured once forward and once backward, and
    replayed by an autograd.Function. See its documentation for the rules (static shapes, no module hooks,
    autocast only with ``cache_enabled=False``)."""
    global _graphed_callables_impl
    if _graphed_callables_impl is None:
        from torch.cuda import graphs as cuda_graphs

        _graphed_callables_impl = _with_mydev_as_cuda(cuda_graphs.make_graphed_callables, cuda_graphs,
                                                      graph_pool_handle=graph_pool_handle)
    return _graphed_callables_impl(callables, sample_args, num_warmup_iters, allow_unused_input, pool)
