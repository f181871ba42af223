"""torch.compile(mode="reduce-overhead") on mydev: Inductor's compiled graphs replayed as mydev graphs.

Changes to Inductor, installed when its modules are imported (HOOKS), each answering for mydev only:
- torch._inductor.cudagraph_utils.check_multiple_devices_or_any_cpu_nodes accepts a graph whose one
  device is a mydev device (torch 2.13 accepts only "cuda", and records "multiple devices: mydev:0" as
  the reason to skip graphs);
- torch._inductor.output_code.cudagraph_partition_post_compile (the path taken with graph_partition, the
  default) hands a mydev graph without partitions to cudagraph_post_compile, which wraps the whole
  callable: mydev's C++ code generation makes no partitions, and without them graphs were silently
  skipped;
- torch._inductor.compile_fx.cudagraphify, with `torch._inductor.config.triton.cudagraph_trees = False`,
  wraps a callable whose inputs are on mydev with Inductor's own non-tree cudagraphify_impl, run with
  torch.cuda's names meaning torch.mydev's (mydev/graphs.py): each compiled graph captures on its first call
  and replays afterwards, returning the same output tensors each time, with what trees do about dynamic
  shapes and mutated inputs (_mydev_graphs). With trees on (the default), torch's own path is kept and the
  trees' entry point sends mydev's callables to graph_trees.py, which HOOKS also installs.
test_graphs.py notices when torch accepts mydev by itself.
"""
import threading

import torch

from .. import _patches
from . import graph_trees

_WHY_TEST = "test_graphs.py::test_inductor_still_refuses_graphs_on_mydev"


def install_device_check(cudagraph_utils) -> None:
    original = cudagraph_utils.check_multiple_devices_or_any_cpu_nodes

    def check_multiple_devices_or_any_cpu_nodes(device_node_mapping):
        devices = [d for d in device_node_mapping if d.type != "cpu"]
        if len(devices) == 1 and devices[0].type == "mydev" and torch.device("cpu") not in device_node_mapping:
            return None
        return original(device_node_mapping)

    _patches.replace(cudagraph_utils, "check_multiple_devices_or_any_cpu_nodes", check_multiple_devices_or_any_cpu_nodes,
                     target="torch._inductor.cudagraph_utils.check_multiple_devices_or_any_cpu_nodes",
                     why="it accepts only 'cuda' and gives 'multiple devices: mydev:0' as the reason to skip graphs",
                     test=_WHY_TEST)


def _mydev_graphs(model, static_input_idxs, mutated_input_idxs, placeholders, mydev_impl):
    """`model` replayed as mydev graphs with what cudagraph trees add to the non-tree implementation on CUDA:
    - one graph per value of the integer inputs (dynamic shapes): the non-tree implementation records once
      and replays it for any sizes (Inductor specialises integers only when trees are off, and they are on);
    - a graph that mutates an input Inductor does not hold at a static address is not recorded: the write
      would land in the graph's copy of the input and be lost; the callable runs as compiled, with
      Inductor's skip message and counter;
    - static inputs the graph mutates (a BatchNorm's running statistics, a compiled optimizer's state) are
      restored after the recording's warm-up run, which has written them once already, so that the first
      replay writes them once in all."""
    from torch._dynamo import utils as dynamo_utils
    from torch._inductor import cudagraph_utils

    static = set(static_input_idxs)
    unmanaged = [i for i in mutated_input_idxs if i not in static]
    if unmanaged:
        cudagraph_utils.log_cudagraph_skip_and_bump_counter(
            cudagraph_utils.get_mutation_stack_trace(placeholders, unmanaged))
        return model
    mutated_static = [i for i in mutated_input_idxs if i in static]
    graphs = {}

    def record(inputs):
        saved = [(inputs[i], inputs[i].clone()) for i in mutated_static if isinstance(inputs[i], torch.Tensor)]
        with dynamo_utils.preserve_rng_state():
            fn = mydev_impl(model, inputs, static_input_idxs)
        for tensor, before in saved:
            tensor.copy_(before)
        return fn

    def run(inputs):
        key = tuple(x for x in inputs if isinstance(x, int))
        fn = graphs.get(key)
        if fn is None:
            fn = graphs[key] = record(inputs)
        return fn(inputs)

    return run


def install_cudagraphify(compile_fx) -> None:
    original = compile_fx.cudagraphify
    from ..mydev.graphs import _with_mydev_as_cuda

    mydev_impl = _with_mydev_as_cuda(compile_fx.cudagraphify_impl, compile_fx)

    def cudagraphify(model, static_input_idxs=(), **kwargs):
        from torch._inductor import config

        on_other_devices = original(model, static_input_idxs, **kwargs)
        if config.triton.cudagraph_trees:
            return on_other_devices  # torch's trees send mydev's callables to graph_trees.py
        state = threading.local()

        def run(new_inputs):
            fn = getattr(state, "fn", None)
            if fn is None:
                if not graph_trees.on_mydev(new_inputs):
                    fn = on_other_devices
                else:
                    fn = _mydev_graphs(model, static_input_idxs, kwargs.get("mutated_input_idxs", ()),
                                       kwargs.get("placeholders", ()), mydev_impl)
                state.fn = fn
            return fn(new_inputs)

        return run

    _patches.replace(compile_fx, "cudagraphify", cudagraphify, target="torch._inductor.compile_fx.cudagraphify",
                     why="cudagraph trees and cudagraphify_impl call torch.cuda by name: mydev callables get "
                         "Inductor's non-tree cudagraphify_impl with torch.cuda's names meaning torch.mydev's",
                     test=_WHY_TEST)


def install_whole_graph_path(output_code) -> None:
    original = output_code.cudagraph_partition_post_compile

    def cudagraph_partition_post_compile(example_inputs, compiled_graph, *args, **kwargs):
        if "mydev" in compiled_graph.device_types and not compiled_graph.partition_maps:
            return output_code.cudagraph_post_compile(example_inputs, compiled_graph, *args, **kwargs)
        return original(example_inputs, compiled_graph, *args, **kwargs)

    _patches.replace(output_code, "cudagraph_partition_post_compile", cudagraph_partition_post_compile,
                     target="torch._inductor.output_code.cudagraph_partition_post_compile",
                     why="with graph_partition (the default) a graph without partitions skips graphs silently, and "
                         "mydev's C++ code generation makes none",
                     test=_WHY_TEST)


# Module imported -> what to install then (my_device/__init__.py registers them with when_imported).
HOOKS = {
    "torch._inductor.cudagraph_utils": install_device_check,
    "torch._inductor.output_code": install_whole_graph_path,
    "torch._inductor.compile_fx": install_cudagraphify,
    "torch._inductor.cudagraph_trees": graph_trees.install_tree_dispatch,
    "torch._dynamo.backends.cudagraphs": graph_trees.install_backend_device,
}
