"""The C++ wrapper Inductor generates around mydev kernels
(torch._inductor.config.cpp_wrapper = True, and AOTInductor).

It is CPU's C++ wrapper (the wrapper itself runs on the host) with the
differences of the Python wrapper (wrapper.py), and two of AOTInductor's own:
- the device is named through the shim that exists for it,
  aoti_torch_device_type_privateuse1(), since Inductor would write
  aoti_torch_device_type_mydev();
- each C++ kernel is queued on the current mydev stream instead of called on
  the host thread: the kernel gets an entry point `mydev_entry_<kernel>(const
  int64_t*)` in the generated library, and the wrapper passes its address to
  the dispatcher op `mydev_inductor::launch` (launch.py);
- extern kernels (mm, addmm, convolution, attention, fallbacks) on mydev
  tensors are called through the dispatcher, where they reach mydev's own
  kernels; Inductor would call the aoti_torch_cpu_* shims, which run CPU
  kernels directly, on the host thread and out of stream order;
- (AOTInductor) the model refuses an input that is not a mydev tensor, naming
  it, before any kernel sees it;
- (AOTInductor) the model's constructor loads the packaged weights itself,
  each mydev weight straight onto mydev, once, when the package is loaded:
  AOTInductor's runtime cannot create a model for a PrivateUse1 device
  (csrc/inductor/AOTIModelRunner.cpp), so it would keep them on the host;
- (AOTInductor) an out= extern kernel's returned tensor gets a handle of its
  own, so that a kernel writing into a view of a buffer leaves the buffer's
  handle alone (the proxy executor assigns the result to the output handle).
"""

import torch
from torch._inductor import ir
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.wrapper import WrapperLine
from torch._inductor.virtualized import V

from .kernels import prelude, unpack_argument

# Written once into every generated wrapper that uses mydev.
_LAUNCH_HELPER = r"""
#include <torch/csrc/stable/c/shim.h>
#include <torch/csrc/stable/stableivalue_conversions.h>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace {
// Queues `entry` (a kernel of this library) on the current mydev stream: the
// op mydev_inductor::launch is registered by my_device (inductor/launch.py).
// Tensors are passed as new references, which the op's caller owns until the
// kernel ran; other arguments as int64 (a double as its bits).
void mydev_launch(void (*entry)(const int64_t*), const char* name,
                  std::initializer_list<AtenTensorHandle> tensors,
                  std::initializer_list<int64_t> tensor_slots,
                  std::initializer_list<int64_t> values) {
  StableListHandle tensor_list = nullptr;
  StableListHandle slot_list = nullptr;
  StableListHandle value_list = nullptr;
  AOTI_TORCH_ERROR_CODE_CHECK(torch_new_list_reserve_size(tensors.size(), &tensor_list));
  for (AtenTensorHandle t : tensors) {
    AtenTensorHandle owned = nullptr;
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_new_tensor_handle(t, &owned));
    AOTI_TORCH_ERROR_CODE_CHECK(torch_list_push_back(tensor_list, torch::stable::detail::from(owned)));
  }
  AOTI_TORCH_ERROR_CODE_CHECK(torch_new_list_reserve_size(tensor_slots.size(), &slot_list));
  for (int64_t s : tensor_slots) AOTI_TORCH_ERROR_CODE_CHECK(torch_list_push_back(slot_list, torch::stable::detail::from(s)));
  AOTI_TORCH_ERROR_CODE_CHECK(torch_new_list_reserve_size(values.size(), &value_list));
  for (int64_t v : values) AOTI_TORCH_ERROR_CODE_CHECK(torch_list_push_back(value_list, torch::stable::detail::from(v)));
  StableIValue stack[5] = {
      torch::stable::detail::from(reinterpret_cast<int64_t>(entry)), torch::stable::detail::from(std::string(name)), torch::stable::detail::from(tensor_list), torch::stable::detail::from(slot_list),
      torch::stable::detail::from(value_list)};
  AOTI_TORCH_ERROR_CODE_CHECK(torch_call_dispatcher("mydev_inductor::launch", "", stack, TORCH_ABI_VERSION));
}

// A graph input that is not a mydev tensor would reach mydev's kernels; the
// model refuses it first, naming it.
void mydev_check_input(AtenTensorHandle tensor, int64_t index, const char* name) {
  int32_t device_type = 0;
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(tensor, &device_type));
  if (device_type != aoti_torch_device_type_privateuse1()) {
    const std::string device = device_type == aoti_torch_device_type_cpu()
        ? std::string("cpu")
        : "device type " + std::to_string(device_type);
    throw std::runtime_error(
        "mydev model: input " + std::to_string(index) + " (" + name + ") is a " + device +
        " tensor, not a mydev tensor; the model was compiled for mydev, move its inputs with .to('mydev')");
  }
}

// AOTInductor's model runtime cannot create a model for mydev (see
// csrc/inductor/AOTIModelRunner.cpp), so a mydev model is a host model whose
// constructor loads the weights itself, each with mydev_load_constant: a
// weight Inductor placed on mydev is copied there once, when the package is
// loaded, and the model's constant map holds that mydev tensor from then on.

// One constant of the model image, `data` pointing at its storage: a mydev
// tensor when the model uses it on mydev, a host tensor owning a copy otherwise.
AtenTensorHandle mydev_load_constant(uint8_t* data, const std::vector<int64_t>& sizes,
                                     const std::vector<int64_t>& strides, int64_t offset, int32_t dtype,
                                     bool on_mydev) {
  const auto ndim = static_cast<int64_t>(sizes.size());
  AtenTensorHandle image = nullptr;
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_create_tensor_from_blob(
      data, ndim, sizes.data(), strides.data(), offset, dtype, aoti_torch_device_type_cpu(), 0, &image));
  torch::aot_inductor::RAIIAtenTensorHandle image_owner(image);
  AtenTensorHandle result = nullptr;
  if (on_mydev) {
    // -1: the current mydev device, as a CUDA model takes the current CUDA device.
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
        ndim, sizes.data(), strides.data(), dtype, aoti_torch_device_type_privateuse1(), -1, &result));
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_copy_(result, image, 0));
  } else {
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_clone(image, &result));
  }
  return result;
}

// A mydev weight as one call uses it. After loading it is on mydev, and the
// call takes a new reference to it. It is on the host only when the user
// replaced it (AOTICompiledModel.load_constants with host tensors, which the
// runtime copies into a host buffer, as the weight is declared a host
// tensor): then each call copies it to mydev.
torch::aot_inductor::RAIIAtenTensorHandle mydev_constant(AtenTensorHandle constant, const char* fqn) {
  if (constant == nullptr) {
    // A package whose weights are stored outside its library (aot_inductor.package_constants_in_so=False)
    // is loaded without them; the kernels would read no memory.
    throw std::runtime_error(std::string("mydev model: weight ") + fqn +
                             " is not loaded; give the model its weights with AOTICompiledModel.load_constants");
  }
  int32_t device_type = 0;
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(constant, &device_type));
  AtenTensorHandle result = nullptr;
  if (device_type == aoti_torch_device_type_privateuse1()) {
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_new_tensor_handle(constant, &result));
    return torch::aot_inductor::RAIIAtenTensorHandle(result);
  }
  int64_t ndim = 0;
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
  int32_t dtype = 0;
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dim(constant, &ndim));
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_sizes(constant, &sizes));
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_strides(constant, &strides));
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(constant, &dtype));
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
      ndim, sizes, strides, dtype, aoti_torch_device_type_privateuse1(), -1, &result));
  torch::aot_inductor::RAIIAtenTensorHandle copy(result);
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_copy_(copy.get(), constant, 0));
  return copy;
}

// A kernel argument as a handle, whatever holds it (RAII handle, constant, view).
template <typename T>
AtenTensorHandle mydev_handle(const T& tensor) {
  return tensor.get();
}
inline AtenTensorHandle mydev_handle(AtenTensorHandle tensor) {
  return tensor;
}

inline int64_t mydev_double_bits(double d) {
  int64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
}

inline double mydev_bits_to_double(int64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof(d));
  return d;
}
}  // namespace
"""

_FLOAT_TYPES = ("float", "double", "at::Half", "at::BFloat16", "half", "bfloat16")


def _is_float(cpp_type: str) -> bool:
    return cpp_type.replace("const", "").strip() in _FLOAT_TYPES


class MydevCppWrapperCodegen(CppWrapperCpu):
    def __init__(self):
        # AOTInductor's model is a mydev model (its constants are checked
        # against this); cpp_wrapper's module is host code compiled as CPU's.
        # Kernels are CPU code either way and need CPU's vector ISA headers.
        self.device = "mydev" if V.graph.aot_mode else "cpu"
        super().__init__()
        self.needs_vec_isa = True
        self._mydev_entries: set[str] = set()

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        # CPU's C++ wrapper has no subgraph wrapper either (it raises in codegen_subgraph).
        return MydevCppWrapperCodegen()

    # -- the device's name -------------------------------------------------
    def add_device_include(self, device: str) -> None:
        if device != "mydev":
            return super().add_device_include(device)
        # The wrapper is host code: CPU's headers, plus the launcher.
        super().add_device_include("cpu")
        if "mydev" not in self.included_devices:
            self.included_devices.add("mydev")
            self.header.splice(_LAUNCH_HELPER)
            self.header.splice(prelude())

    def codegen_device(self, device):
        if device.type == "mydev" and getattr(self, "_weights_on_host", False):
            return super().codegen_device(torch.device("cpu"))
        if device.type != "mydev":
            return super().codegen_device(device)
        self.used_cached_devices.add("privateuse1")
        return f"cached_torch_device_type_privateuse1, {device.index if device.index else 0}"

    # -- inputs and weights ------------------------------------------------
    def _write_input_unpacking(self):
        super()._write_input_unpacking()
        for idx, (name, value) in enumerate(V.graph.graph_inputs.items()):
            device = value.get_device() if isinstance(value, ir.TensorBox) else None
            if device is not None and device.type == "mydev":
                self.prefix.writeline(f'mydev_check_input({name}.get(), {idx}, "{name}");')

    def codegen_model_constructor(self):
        # AOTInductor's runtime creates weights on the model's device, which
        # for mydev is the host (csrc/inductor/AOTIModelRunner.cpp says why):
        # the weights are declared host tensors, and the constructor loads
        # them itself, the mydev ones onto mydev (mydev_load_constant).
        self._weights_on_host = True
        try:
            super().codegen_model_constructor()
        finally:
            self._weights_on_host = False
        if not _weights_in_library() or not V.graph.constants:
            return
        closing = self.prefix._lines.pop()
        assert str(closing).strip() == "}", closing  # the constructor's last line
        on_mydev = ", ".join(
            "true" if V.graph.get_original_value_of_constant(name).device.type == "mydev" else "false"
            for name in V.graph.constants
        )
        self.prefix.splice(
            f"""
                // mydev: the weights are loaded here, once, and load_constants
                // (which would copy each into one host buffer first) is skipped.
                include_weights = false;
                {{
                    static constexpr bool on_mydev[] = {{{on_mydev}}};
                    size_t image_offset = 0;  // where load_constants would read each weight
                    for (size_t i = 0; i < constants_info_.size(); ++i) {{
                        const auto& info = constants_info_[i];
                        if (info.from_folded) continue;
                        // The map is the container's, shared by its models: the first loads it.
                        if (constants_map_->count(info.name) == 0) {{
                            constants_map_->emplace(info.name, mydev_load_constant(
                                _get_constants_start() + image_offset, info.shape, info.stride,
                                info.offset, info.dtype, on_mydev[i]));
                        }}
                        image_offset += info.data_size;
                    }}
                    update_constants_array_from_map();
                }}
            """
        )
        self.prefix.writeline(closing)

    def _write_constants_unpacking(self):
        if not V.graph.aot_mode:
            return super()._write_constants_unpacking()
        for idx, name in enumerate(V.graph.constants.keys()):
            tensor = V.graph.get_original_value_of_constant(name)
            if tensor.device.type == "mydev":
                self.prefix.writeline(
                    f'[[maybe_unused]] auto {name} = mydev_constant(constants_->at({idx}), "{_original_fqn(name)}");'
                )
            else:
                self.prefix.writeline(f"[[maybe_unused]] auto& {name} = constants_->at({idx});")

    # -- kernels ------------------------------------------------------------
    def _mydev_entry(self, kernel_name: str, arg_types) -> str:
        entry = f"mydev_entry_{kernel_name}"
        if entry not in self._mydev_entries:
            self._mydev_entries.add(entry)
            unpacked = ", ".join(unpack_argument(i, str(t)) for i, t in enumerate(arg_types))
            self.header.splice(
                f'extern "C" void {entry}(const int64_t* args) {{ {kernel_name}({unpacked}); }}'
            )
        return entry

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True,
                                     arg_types=None, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if device.type != "mydev" or (triton and kernel_name in self._cpu_triton_kernel_names):
            return super()._generate_kernel_call_helper(
                kernel_name, call_args, device=device, triton=triton, arg_types=arg_types, **kwargs)
        assert arg_types is not None and len(arg_types) == len(call_args)
        entry = self._mydev_entry(kernel_name, arg_types)
        tensors, slots, values = [], [], []
        for i, (arg, cpp_type) in enumerate(zip(call_args, arg_types)):
            cpp_type = str(cpp_type)
            if "*" in cpp_type:
                tensors.append(f"mydev_handle({arg})")
                slots.append(str(i))
                values.append("0")
            elif _is_float(cpp_type):
                values.append(f"mydev_double_bits(static_cast<double>({arg}))")
            else:
                values.append(f"static_cast<int64_t>({arg})")
        self.writeline(
            f'mydev_launch(&{entry}, "{kernel_name}", {{{", ".join(tensors)}}}, '
            f'{{{", ".join(slots)}}}, {{{", ".join(values)}}});'
        )

    # -- extern kernels ----------------------------------------------------
    # Every extern kernel on mydev tensors is called through the dispatcher by
    # Inductor's own runtime-lookup paths: in cpp_wrapper mode a boxed
    # c10::Dispatcher call, in AOTInductor the proxy executor, which finds the
    # op by name when the package is loaded. Both reach mydev's kernels.

    def generate_extern_kernel_out(self, node: ir.ExternKernelOut) -> None:
        if not _on_mydev(node) or not isinstance(node.op_overload, torch._ops.OpOverload):
            return super().generate_extern_kernel_out(node)
        node.codegen_comment(self)
        args = [*node.inputs, *node.constant_args]
        kwargs = {**node.kwargs, "out": node.output_view or node}
        # The out= tensor is written in place: a mutated output, not a new one.
        self.writeline(_DispatchLine(self, node, node.op_overload, args, kwargs, [_MutatedOutput()]))

    def generate_extern_kernel_alloc(self, node: ir.ExternKernelAlloc) -> None:
        if not _on_mydev(node) or not isinstance(node.op_overload, torch._ops.OpOverload) \
                or getattr(node, "outputs", None):
            return super().generate_extern_kernel_alloc(node)
        node.codegen_comment(self)
        args = [*node.inputs, *node.constant_args]
        kwargs = dict(node.kwargs)
        self.writeline(_DispatchLine(self, node, node.op_overload, args, kwargs, [node]))
        if isinstance(node.layout, ir.Layout):
            node.codegen_size_asserts(self)

    def generate_fallback_kernel(self, node: ir.FallbackKernel) -> None:
        if not _on_mydev(node) or not isinstance(node.op_overload, torch._ops.OpOverload):
            return super().generate_fallback_kernel(node)
        # What FallbackKernel.codegen does for an op without a C shim.
        self.generate_fallback_kernel_with_runtime_lookup(
            node.get_name(),
            node.python_kernel_name,
            lambda: [*node.codegen_args(), *node.codegen_kwargs()],
            node.op_overload,
            node.export_extern_kernel_node(),
            node.outputs if node.outputs else node.mutation_outputs,
        )

    def generate_scatter_fallback(self, node: ir.ScatterFallback) -> None:
        if not _on_mydev(node) or not isinstance(node.op_overload, torch._ops.OpOverload):
            return super().generate_scatter_fallback(node)
        # CPU's C++ wrapper calls the aoti_torch_<device>_scatter*_out shim; mydev's goes through the
        # dispatcher, to mydev's in-place kernel, which writes into the first input.
        x, index, *src = node.inputs
        args = [x, node.constant_args[0], index, src[0] if node.src_is_tensor else node.constant_args[1]]
        schema = {a.name for a in node.op_overload._schema.arguments}
        kwargs = {k: v for k, v in node.kwargs.items() if k in schema and v is not None}
        self.writeline(_DispatchLine(self, node, node.op_overload, args, kwargs, [_MutatedOutput()]))

    def generate_c_shim_extern_kernel_call(self, kernel, args, device, **kwargs) -> None:
        if device == "mydev":
            # Reached only by extern kernels the overrides above do not route
            # (no OpOverload to dispatch); there is no aoti_torch_mydev_* shim.
            raise NotImplementedError(f"mydev: Inductor's C++ wrapper cannot call extern kernel {kernel} yet")
        super().generate_c_shim_extern_kernel_call(kernel, args, device, **kwargs)

    def _dispatch(self, node, op, args, kwargs, outputs) -> None:
        """Calls `op` through the dispatcher with the schema's arguments in order."""
        schema_args = op._schema.arguments
        raw_args = []
        for i, a in enumerate(schema_args):
            if i < len(args) and not a.kwarg_only:
                raw_args.append(args[i])
            elif a.name in kwargs:
                raw_args.append(kwargs[a.name])
            else:
                raw_args.append(a.default_value)
        if not V.graph.aot_mode:
            # The out= tensor (a buffer, or a view of one: cat's inputs are
            # written into its slices) is passed as an argument; the returned
            # alias of it is not kept.
            output_args = [node.get_name()]
            self.generate_fallback_kernel_with_runtime_lookup_boxed(op, raw_args, output_args, outputs)
            return
        if isinstance(outputs[0], _MutatedOutput):
            # The proxy executor assigns what the op returns to the handle it
            # is given for the output. For out= that is the out tensor itself,
            # or, when it is a view, a tensor that is not the buffer: so it gets
            # a handle of its own, dropped after the call, and the buffer's
            # handle keeps naming the whole buffer.
            output_args = [f"{node.get_name()}_returned"]
            outputs = [node]
        else:
            output_args = [node.get_name()]
        _export_extern_node(node, op, args, kwargs, output_args[0])
        self.generate_fallback_kernel_with_runtime_lookup_aot(op, raw_args, output_args, outputs)


class _MutatedOutput(ir.MutationOutput):
    """Marks an out= argument for Inductor's runtime-lookup code generation:
    written in place, so neither allocated nor returned."""

    def __init__(self):  # noqa: D107  (only the type is read)
        pass


class _DispatchLine(WrapperLine):
    """A wrapper line: generated in order with the others, after memory planning."""

    def __init__(self, wrapper, node, op, args, kwargs, outputs):
        self.wrapper, self.node, self.op = wrapper, node, op
        self.args, self.kwargs, self.outputs = args, kwargs, outputs

    def codegen(self, code) -> None:
        self.wrapper._dispatch(self.node, self.op, self.args, self.kwargs, self.outputs)


def _original_fqn(name: str) -> str:
    """The name a user gives a weight (AOTICompiledModel.get_constant_fqns)."""
    return V.graph.dynamo_flat_name_to_original_fqn.get(name, V.graph.allocated_constant_name.get(name, name))


def _weights_in_library() -> bool:
    """Whether AOTInductor writes the weights into the model's library (its
    default), where the constructor finds them, as CppWrapperCpu decides it."""
    from torch._inductor import config

    return config.aot_inductor.package_constants_in_so and \
        config.aot_inductor.package_constants_on_disk_format != "binary_blob"


def _on_mydev(node) -> bool:
    device = node.get_device()
    return device is not None and device.type == "mydev"


def _export_extern_node(node, op, args, kwargs, out_name) -> None:
    """Records the call for AOTInductor's proxy executor, as
    FallbackKernel.export_extern_kernel_node does for fallback ops."""
    from torch._export.serde import schema as export_schema
    from torch._export.serde.serialize import GraphModuleSerializer
    from torch._inductor.ir import ExternKernelNode

    named_arguments = GraphModuleSerializer(None, []).serialize_inputs(op, args, kwargs)
    output_arguments = [export_schema.Argument.create(as_tensor=export_schema.TensorArgument(name=out_name))]
    V.extern_kernel_nodes.append(
        ExternKernelNode(
            name=node.get_name(),
            node=export_schema.Node(target=op.name(), inputs=named_arguments, outputs=output_arguments, metadata={}),
        )
    )
