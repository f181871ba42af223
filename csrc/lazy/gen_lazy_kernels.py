"""Generates mydev's Lazy kernels and IR nodes with torchgen, from csrc/lazy/mydev_lazy_ops.yaml.

Run by setup.py before the extension compiles (`python csrc/lazy/gen_lazy_kernels.py` does the same).
Writes build/generated/mydev_lazy/ (not committed):
  LazyIr.h                    one TsNode per op, lowered as the ATen builtin of the same name through
                              TorchScript (TSLoweringContext, then csrc/jit/Lowering.h)
  LazyNativeFunctions.h/.cpp  the Lazy kernels that build those nodes (shapes: the op's meta kernel, or
                              torch::lazy::compute_shape_<op>)
  RegisterLazy.cpp            at::RegisterMydevLazyNativeFunctions(), called by csrc/lazy/Backend.cpp's init()
  LazyNonNativeIr.h           empty (the IR builder's nodes are torch's, see Backend.cpp)
The generated files name their headers relative to csrc/ (the extension's include path, so the generated
directory adds no compiler flag that would change every other file's ccache key): the same text in every
checkout, and torchgen rewrites only the files whose text changed.
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
YAML = os.path.join(HERE, "mydev_lazy_ops.yaml")
# The hand-written kernels of the yaml's `supported` list (torchgen checks that each is defined there).
KERNELS = os.path.join(HERE, "LazyNativeFunctions.cpp")
# Sources include the generated headers as "../build/generated/mydev_lazy/LazyIr.h" (from csrc/).
OUT_DIR = os.path.join(ROOT, "build", "generated", "mydev_lazy")


def _torch_shape_header():
    import torch

    return os.path.join(os.path.dirname(torch.__file__), "include", "torch", "csrc", "lazy", "core",
                        "shape_inference.h")


def generate(out_dir=OUT_DIR):
    import torchgen
    import torchgen.gen_lazy_tensor as gen
    from torchgen.dest.lazy_ir import GenTSLazyIR

    # torchgen checks that each compute_shape_<op> the kernels call is declared, by reading the lines of
    # the header the kernels include (and opens it by the name it writes in the #include). Ours,
    # csrc/lazy/ShapeInference.h, includes torch's exported header and declares only what torch lacks,
    # so the check reads both files.
    check = gen.validate_shape_inference_header

    def check_torch_and_ours(_include_name, expected):
        with open(_torch_shape_header()) as a, open(os.path.join(HERE, "ShapeInference.h")) as b:
            text = a.read() + "\n" + b.read()
        with tempfile.NamedTemporaryFile("w", suffix=".h") as both:
            both.write(text)
            both.flush()
            check(both.name, expected)

    os.makedirs(out_dir, exist_ok=True)
    cwd = os.getcwd()
    gen.validate_shape_inference_header = check_torch_and_ours
    try:
        # The output directory, relative to csrc/: torchgen writes it into the generated #include lines.
        os.chdir(os.path.join(ROOT, "csrc"))
        gen.run_gen_lazy_tensor(
            aten_path=os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen"),
            source_yaml=YAML,
            output_dir=os.path.relpath(out_dir, os.path.join(ROOT, "csrc")),
            dry_run=False,
            impl_path=KERNELS,
            node_base="torch::lazy::TsNode",
            node_base_hdr="lazy/IrNode.h",
            shape_inference_hdr="lazy/ShapeInference.h",
            lazy_ir_generator=GenTSLazyIR,
            backend_name="Mydev",
        )
    finally:
        os.chdir(cwd)
        gen.validate_shape_inference_header = check


if __name__ == "__main__":
    generate(os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR)
