#pragma once
// A fused elementwise kernel: a chain of pointwise ops evaluated in one pass
// over memory, optionally ending in a reduction of its result.
//
// The fused expression is a small register program (`Instr`) interpreted over
// chunks of kChunk elements: each instruction is a loop over a chunk of floats,
// which the C++ compiler vectorizes, so no C++ compiler is needed at run time
// (unlike Inductor) and the interpreter's dispatch costs one switch per
// kChunk elements. at::TensorIterator supplies the iteration: broadcasting,
// dimension coalescing, strided operands and, for pure elementwise kernels,
// its parallel split.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace my_device::compiler {

enum class Opcode : uint8_t {
  Load,        // dst = input[a]
  Const,       // dst = imm
  Add, Sub, Mul, Div, Max, Min, Pow,            // dst = a op b
  Gt, Ge, Lt, Le, Eq, Ne,                       // dst = (a op b) ? 1 : 0
  Where,                                        // dst = a != 0 ? b : c
  Neg, Abs, Relu, Tanh, Sigmoid, Exp, Log, Sqrt, Rsqrt, Reciprocal, Erf, Sin, Cos, Log1p, Expm1, Sign,
  Gelu, GeluTanh,                               // dst = gelu(a)
  GeluBackward, GeluTanhBackward,               // dst = gelu'(b) * a
  TanhBackward,                                 // dst = a * (1 - b*b)   (a: grad, b: tanh output)
  SigmoidBackward,                              // dst = a * b * (1 - b) (b: sigmoid output)
  ThresholdBackward,                            // dst = b <= imm ? 0 : a
  Not,                                          // dst = a == 0
};

struct Instr {
  Opcode op;
  int16_t dst = 0, a = 0, b = 0, c = 0;
  float imm = 0;
};

enum class ReduceKind : uint8_t { None, Sum, Mean, Max, Min };

// Elements below which a kernel over dense operands of one shape runs as one
// flat pass (at::TensorIterator's grain size: below it, TensorIterator would
// not split the work across threads either).
constexpr int64_t kFlatMaxElements = 32768;

// Registers a kernel may use; the compiler leaves a group unfused beyond it.
constexpr int kMaxRegisters = 64;

struct ElementwiseKernel {
  std::vector<Instr> code;
  int num_registers = 0;
  // Registers stored to each output, in output order.
  std::vector<int16_t> stores;
  // The reduction, if any: its input register and the output it writes (the
  // last output; run() views it with stride 0 over the reduced dims).
  ReduceKind reduce = ReduceKind::None;
  int16_t reduce_register = 0;
  int64_t reduce_count = 1;  // elements per reduced output, for Mean
  std::vector<int64_t> reduce_shape;  // the reduced value's shape (the iteration shape)
  std::vector<int64_t> reduce_dims;   // dims of reduce_shape that are reduced
  bool keepdim = false;

  // Runs the kernel. `outputs` are written (or, for the reduction output,
  // accumulated into); `inputs` broadcast to the iteration shape. Every
  // operand is Float or Bool.
  void run(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs) const;
  std::string str() const;
};

const char* opcode_name(Opcode op);
// Whether transcendental opcodes use SLEEF's vector functions (see Elementwise.cpp).
bool vector_math_enabled();

} // namespace my_device::compiler
