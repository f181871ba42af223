#pragma once
// The mydev graph IR: what every graph frontend (the `mydev` Dynamo backend,
// TorchScript's to_backend, the Lazy Tensor backend) lowers into, and the only
// input of the compiler (Program.h).
//
// A graph is a list of ATen operator calls over numbered values, each tensor
// value with the exact geometry (dtype, sizes, strides, storage offset) that the
// frontend's shape propagation gave it. Geometry is part of the IR, not
// something the compiler infers, because views and out= kernels are only
// correct on the layout the frontend promised to its own users.
//
// Its serialized form is text, one statement a line, so a lowered program can
// be stored (a TorchScript backend's preprocessed blob) and read by a person:
//
//   program mlp_forward
//   input %0 : Float[4,16]{16,1}+0
//   %1 = aten::t(%2) : Float[16,8]{1,16}+0
//   %3 = aten::addmm(%4, %0, %1, i1, i1) : Float[4,8]{8,1}+0
//   %5, %6 = aten::max_pool2d_with_indices(...) : Float[..]{..}+0, Long[..]{..}+0
//   output %3 %5
//
// Arguments: `%N` a value, `n` None, `i<int>`, `f<double>` (also finf, f-inf,
// fnan), `b0`/`b1`, `s"text"`, `d"cpu"` a device, `t"Float"` a dtype, `[a, b]`
// a list. A return the program never uses (an undefined gradient) is `_`, in
// place of both its value and its geometry. Every
// argument of the schema is written, in order (frontends fill in defaults), so
// the compiler never has to know an op's keyword arguments. Dtypes, layouts
// and memory formats are integers, as the dispatcher passes them.
#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace my_device::compiler {

struct TensorMeta {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;

  int64_t numel() const;
  // Bytes of storage the tensor reaches, from element 0 of its storage.
  size_t storage_bytes() const;
  bool is_contiguous() const;
  std::string str() const;
};

// One argument of a call: a value, a constant, or a list of either.
struct Arg {
  int value = -1;            // a value id, or -1
  c10::IValue constant;      // when value < 0 and !is_list
  bool is_list = false;
  std::vector<Arg> items;    // when is_list
};

struct Node {
  std::string op;            // "aten::addmm" or "aten::add.Tensor"
  std::vector<Arg> args;
  std::vector<int> outputs;  // value ids (-1: a return the program does not use)
  int line = 0;              // of the serialized text, for error messages
  std::string source;        // the frontend's own location of the op, if any
};

struct Value {
  TensorMeta meta;
  int producer = -1;         // node index, or -1 for an input
};

struct Graph {
  std::string name;
  std::vector<Value> values;  // indexed by value id
  std::vector<Node> nodes;
  std::vector<int> inputs;
  std::vector<int> outputs;

  // Text form (see above). parse() raises c10::Error naming the line.
  static Graph parse(const std::string& text);
  std::string str() const;
};

std::string str(const Arg& arg);

} // namespace my_device::compiler
