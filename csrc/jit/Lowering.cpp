#include "Lowering.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <optional>

#include "core/Device.h"

namespace my_device::jit {

namespace {

using torch::jit::Node;
using torch::jit::Value;
namespace prim = c10::prim;

// What a TorchScript value is while lowering: a tensor value of the program
// (with its Meta tensor), a constant, or a list/tuple of either.
struct Entry {
  int value = -1;         // program value id
  bool scalar = false;    // a 0-dim tensor standing for a Scalar (aten::ScalarImplicit of a program value)
  bool size = false;      // a number a trace made a tensor (prim::NumToTensor), or computed from such
  at::Tensor traced_number;  // a 0-dim CPU constant (a Python number a trace recorded as a tensor: `C // 4`)
  at::Tensor meta;        // when value >= 0
  c10::IValue constant;   // when value < 0 and !is_list
  bool is_list = false;
  std::vector<Entry> items;

  bool is_constant() const {
    if (value >= 0) return false;
    for (const Entry& e : items) {
      if (!e.is_constant()) return false;
    }
    return true;
  }
};

std::string where(const Node* node) {
  if (auto flc = node->sourceRange().file_line_col()) {
    return std::get<0>(*flc) + ":" + std::to_string(std::get<1>(*flc));
  }
  return "";
}

// An exception's message without a C++ backtrace (a Meta kernel written in
// Python raises a plain std::exception).
std::string brief(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

[[noreturn]] void unsupported(const Node* node, const std::string& why) {
  std::ostringstream s;
  s << "mydev: cannot lower " << node->kind().toQualString() << " into a mydev program: " << why << "\n";
  node->sourceRange().highlight(s);
  TORCH_CHECK(false, s.str());
}

compiler::TensorMeta meta_of(const at::Tensor& t) {
  compiler::TensorMeta m;
  m.dtype = t.scalar_type();
  m.sizes = t.sizes().vec();
  m.strides = t.strides().vec();
  m.offset = t.storage_offset();
  return m;
}

at::Tensor to_meta(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta))
      .as_strided(t.sizes(), t.strides(), t.storage_offset());
}

// The IR argument for an entry.
compiler::Arg arg_of(const Entry& e) {
  compiler::Arg a;
  if (e.value >= 0) {
    a.value = e.value;
  } else if (e.is_list) {
    a.is_list = true;
    for (const Entry& item : e.items) a.items.push_back(arg_of(item));
  } else if (e.constant.isList()) {
    a.is_list = true;
    for (const c10::IValue& item : e.constant.toListRef()) {
      Entry sub;
      sub.constant = item;
      a.items.push_back(arg_of(sub));
    }
  } else if (e.constant.isTuple()) {
    a.is_list = true;
    for (const c10::IValue& item : e.constant.toTupleRef().elements()) {
      Entry sub;
      sub.constant = item;
      a.items.push_back(arg_of(sub));
    }
  } else {
    a.constant = e.constant;
  }
  return a;
}

// The entry as an argument of a Meta run of the op (devices become Meta).
c10::IValue meta_value(const Entry& e, const c10::TypePtr& type) {
  if (e.value >= 0) return e.meta;
  if (!e.is_list) {
    if (e.constant.isDevice()) return c10::Device(c10::kMeta);
    const bool tensor_formal = type->kind() == c10::TypeKind::TensorType;
    if (tensor_formal && (e.constant.isInt() || e.constant.isDouble() || e.constant.isBool())) {
      // A number for a Tensor argument: a wrapped number, as the program passes it (Program.cpp).
      const auto dtype = e.constant.isDouble() ? at::kDouble : e.constant.isInt() ? at::kLong : at::kBool;
      // (on the CPU: wrapped numbers are CPU tensors, which mix with Meta ones; with their value, for
      // the numbers folded at lowering time: a traced module's sizes)
      at::Tensor t = at::scalar_tensor(e.constant.toScalar(), at::TensorOptions().dtype(dtype));
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
      return t;
    }
    return e.constant;
  }
  c10::TypePtr t = type;
  if (auto opt = t->castRaw<c10::OptionalType>()) t = opt->getElementType();
  const auto list = t->castRaw<c10::ListType>();
  const c10::TypePtr elem = list ? list->getElementType() : c10::TensorType::get();
  if (elem->kind() == c10::TypeKind::TensorType) {
    c10::List<at::Tensor> out;
    for (const Entry& i : e.items) out.push_back(meta_value(i, elem).toTensor());
    return out;
  }
  if (auto opt = elem->castRaw<c10::OptionalType>(); opt && opt->getElementType()->kind() == c10::TypeKind::TensorType) {
    c10::List<std::optional<at::Tensor>> out;
    for (const Entry& i : e.items) {
      const c10::IValue v = meta_value(i, elem);
      out.push_back(v.isNone() ? std::nullopt : std::optional<at::Tensor>(v.toTensor()));
    }
    return out;
  }
  c10::impl::GenericList out(elem);
  for (const Entry& i : e.items) out.push_back(meta_value(i, elem));
  return out;
}

// The JIT operator of a node whose schema has no dispatcher op (aten::Int,
// aten::__getitem__...): these only compute numbers, which fold into constants.
std::optional<c10::OperatorHandle> dispatcher_op(const c10::FunctionSchema& s) {
  return c10::Dispatcher::singleton().findSchema({s.name(), s.overload_name()});
}

// The overload of `op` taking a Tensor where it takes a Scalar at argument
// `index`, the other arguments alike (add.Scalar -> add.Tensor).
std::optional<c10::OperatorHandle> tensor_overload(const c10::OperatorHandle& op, size_t index) {
  static const auto overloads = [] {
    std::unordered_map<std::string, std::vector<std::string>> m;
    for (const c10::OperatorName& n : c10::Dispatcher::singleton().getAllOpNames()) m[n.name].push_back(n.overload_name);
    return m;
  }();
  const c10::FunctionSchema& s = op.schema();
  auto it = overloads.find(s.name());
  if (it == overloads.end()) return std::nullopt;
  for (const std::string& overload : it->second) {
    auto candidate = c10::Dispatcher::singleton().findSchema({s.name(), overload});
    if (!candidate) continue;
    const auto& cs = candidate->schema();
    if (cs.arguments().size() != s.arguments().size() || cs.returns().size() != s.returns().size()) continue;
    bool match = cs.arguments()[index].type()->kind() == c10::TypeKind::TensorType;
    for (size_t i = 0; i < s.arguments().size() && match; ++i) {
      if (i != index) match = cs.arguments()[i].type()->str() == s.arguments()[i].type()->str();
    }
    if (match) return candidate;
  }
  return std::nullopt;
}

bool runs_on_device(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
}

class Lowerer {
 public:
  Lowerer(const std::string& name, const std::unordered_map<Node*, int64_t>* handles) : handles_(handles) {
    out_.graph.name = name;
  }

  LoweredGraph run(const std::shared_ptr<torch::jit::Graph>& graph, const std::vector<c10::IValue>& inputs,
                  const std::vector<bool>* numbers) {
    const auto& formals = graph->inputs();
    TORCH_CHECK(inputs.size() == formals.size(), "mydev: the graph takes ", formals.size(), " inputs, ",
                inputs.size(), " given");
    for (size_t i = 0; i < formals.size(); ++i) {
      Entry e;
      if (inputs[i].isTensor()) {
        const at::Tensor& t = inputs[i].toTensor();
        if (device_ < 0 && t.device().type() == kMyDev) device_ = t.device().index();
        e = new_value(t, -1);
        e.scalar = numbers && i < numbers->size() && (*numbers)[i] && t.dim() == 0;
        out_.graph.inputs.push_back(e.value);
        out_.input_slots.push_back(static_cast<int>(out_.graph.inputs.size()) - 1);
      } else {
        e.constant = inputs[i];
        out_.input_slots.push_back(-1);
      }
      env_[formals[i]] = std::move(e);
    }
    for (Node* node : graph->nodes()) lower_node(node);
    // Tensor constants are inputs after the graph's own.
    for (size_t k = 0; k < constant_ids_.size(); ++k) out_.graph.inputs.push_back(constant_ids_[k]);
    for (const Value* v : graph->outputs()) add_output(entry(v), graph->return_node());
    return std::move(out_);
  }

 private:
  Entry new_value(const at::Tensor& t, int producer) {
    Entry e;
    e.value = static_cast<int>(out_.graph.values.size());
    e.meta = t.device().is_meta() ? t : to_meta(t);
    out_.graph.values.push_back(compiler::Value{meta_of(t), producer});
    return e;
  }

  const Entry& entry(const Value* v) {
    auto it = env_.find(v);
    TORCH_INTERNAL_ASSERT(it != env_.end(), "mydev: value %", v->debugName(), " lowered before its producer");
    return it->second;
  }

  void add_output(const Entry& e, const Node* ret) {
    if (e.value >= 0) {
      out_.graph.outputs.push_back(e.value);
    } else if (e.is_list) {
      for (const Entry& i : e.items) add_output(i, ret);
    } else {
      unsupported(ret, "the program returns a constant (" + e.constant.tagKind() + "), not a tensor");
    }
  }

  void lower_node(Node* node) {
    const c10::Symbol kind = node->kind();
    if (kind == prim::Constant) {
      const auto v = torch::jit::toIValue(node->output());
      TORCH_INTERNAL_ASSERT(v.has_value());
      if (v->isTensor()) {
        Entry e = new_value(v->toTensor(), -1);
        constant_ids_.push_back(e.value);
        out_.constants.push_back(v->toTensor());
        if (v->toTensor().dim() == 0 && v->toTensor().device().is_cpu()) e.traced_number = v->toTensor();
        env_[node->output()] = std::move(e);
      } else {
        Entry e;
        e.constant = *v;
        env_[node->output()] = std::move(e);
      }
      return;
    }
    if (kind == prim::ListConstruct || kind == prim::TupleConstruct) {
      Entry e;
      e.is_list = true;
      for (const Value* in : node->inputs()) e.items.push_back(entry(in));
      env_[node->output()] = std::move(e);
      return;
    }
    if (kind == prim::ListUnpack || kind == prim::TupleUnpack) {
      const Entry& in = entry(node->input());
      std::vector<Entry> items;
      if (in.is_list) {
        items = in.items;
      } else if (in.constant.isList() || in.constant.isTuple()) {
        const auto elems = in.constant.isList() ? in.constant.toListRef().vec()
                                                : in.constant.toTupleRef().elements().vec();
        for (const auto& x : elems) {
          Entry c;
          c.constant = x;
          items.push_back(c);
        }
      }
      if (items.size() != node->outputs().size()) unsupported(node, "unpacking a value of unknown length");
      for (size_t i = 0; i < items.size(); ++i) env_[node->outputs()[i]] = items[i];
      return;
    }
    if (kind == prim::device) {
      Entry e;
      e.constant = c10::Device(kMyDev, device_ < 0 ? 0 : device_);
      env_[node->output()] = std::move(e);
      return;
    }
    if (kind == prim::dtype) {
      const Entry& in = entry(node->input());
      if (in.value < 0) unsupported(node, "dtype of a non-tensor");
      Entry e;
      e.constant = static_cast<int64_t>(in.meta.scalar_type());
      env_[node->output()] = std::move(e);
      return;
    }
    // A traced module's sizes (`B, T, C = x.size()`) are numbers made tensors
    // (prim::NumToTensor), computed with as tensors (B * T) and made numbers again
    // (aten::Int) for a view: they fold into constants like any number.
    if (kind == prim::NumToTensor && entry(node->input()).is_constant()) {
      Entry e = entry(node->input());
      e.size = true;
      env_[node->output()] = std::move(e);
      return;
    }
    if (kind == c10::aten::ScalarImplicit && entry(node->input()).is_constant()) {
      env_[node->output()] = entry(node->input());  // a number given for a 0-dim tensor input
      return;
    }
    if (kind == c10::aten::ScalarImplicit && entry(node->input()).value >= 0) {
      // A number that lives in device memory: the op that takes it becomes
      // its overload taking a tensor there (add.Scalar -> add.Tensor).
      Entry e = entry(node->input());
      e.scalar = true;
      env_[node->output()] = std::move(e);
      return;
    }
    if (kind == prim::If || kind == prim::Loop) unsupported(node, "control flow");
    if (kind == prim::CallMethod || kind == prim::CallFunction) unsupported(node, "a call (inline the graph first)");
    if (kind == prim::GetAttr || kind == prim::SetAttr) unsupported(node, "module attributes (freeze the module)");

    const c10::FunctionSchema* schema = node->maybeSchema();
    std::vector<Entry> ins;
    for (const Value* v : node->inputs()) ins.push_back(entry(v));
    std::optional<c10::OperatorHandle> op = schema ? dispatcher_op(*schema) : std::nullopt;
    const bool tensor_result = [&] {
      for (const Value* o : node->outputs()) {
        if (o->type()->kind() != c10::TypeKind::IntType && o->type()->kind() != c10::TypeKind::FloatType &&
            o->type()->kind() != c10::TypeKind::BoolType && o->type()->kind() != c10::TypeKind::NumberType &&
            o->type()->kind() != c10::TypeKind::ListType) {
          return true;
        }
        if (auto l = o->type()->castRaw<c10::ListType>(); l && l->getElementType()->kind() == c10::TypeKind::TensorType) {
          return true;
        }
      }
      return false;
    }();

    // Arithmetic on such numbers (a Tensor argument given a number) folds too,
    // into the number of its 0-dim result.
    // (Only those: other constant-only tensor ops, as in lazy graphs, stay tensors.)
    // The other operands may be numbers the trace recorded as tensors (`C // 4`).
    bool size_for_tensor = false;
    bool foldable = true;
    for (size_t i = 0; schema && i < ins.size() && i < schema->arguments().size(); ++i) {
      size_for_tensor = size_for_tensor ||
                        (ins[i].size && schema->arguments()[i].type()->kind() == c10::TypeKind::TensorType);
      foldable = foldable && (ins[i].is_constant() || ins[i].traced_number.defined());
    }
    if (tensor_result && foldable && size_for_tensor && node->outputs().size() == 1 && node->maybeOperator()) {
      torch::jit::Stack stack;
      for (size_t i = 0; i < ins.size(); ++i) {
        stack.push_back(ins[i].traced_number.defined() ? c10::IValue(ins[i].traced_number)
                                                       : meta_value(ins[i], schema->arguments()[i].type()));
      }
      try {
        node->getOperation()(stack);
      } catch (const std::exception& e) {
        unsupported(node, std::string("it could not be evaluated at lowering time: ") + brief(e));
      }
      if (stack.back().isTensor() && stack.back().toTensor().dim() == 0) {
        Entry c;
        c.constant = c10::IValue(stack.back().toTensor().item());
        c.size = true;
        env_[node->output()] = std::move(c);
        return;
      }
    }
    // Numbers computed from constants or from shapes (aten::size, aten::Int...)
    // fold into constants: run the node's own operator on Meta tensors.
    if (!tensor_result) {
      if (!node->maybeOperator()) unsupported(node, "no operator");
      torch::jit::Stack stack;
      for (size_t i = 0; i < ins.size(); ++i) {
        stack.push_back(meta_value(ins[i], schema ? schema->arguments()[i].type() : c10::AnyType::get()));
      }
      try {
        node->getOperation()(stack);
      } catch (const std::exception& e) {
        unsupported(node, std::string("it could not be evaluated at lowering time: ") + brief(e));
      }
      for (size_t i = 0; i < node->outputs().size(); ++i) {
        Entry c;
        c.constant = stack[stack.size() - node->outputs().size() + i];
        env_[node->outputs()[i]] = std::move(c);
      }
      return;
    }
    if (!schema || !op) unsupported(node, "it is not an ATen operator");
    if (!runs_on_device(*op)) unsupported(node, "it has no CPU kernel for the device to run");
    // linear on a matrix is a transposed view and one addmm (mm without bias):
    // an out= kernel writing a planned buffer, where linear allocates and copies.
    if (kind == c10::aten::linear && ins[0].value >= 0 && ins[0].meta.dim() == 2 && ins[1].value >= 0) {
      const Entry t = emit(node, "aten::t", {ins[1]}, 1)[0];
      Entry one;
      one.constant = int64_t{1};
      const bool bias = ins[2].value >= 0;
      env_[node->output()] = bias ? emit(node, "aten::addmm", {ins[2], ins[0], t, one, one}, 1)[0]
                                  : emit(node, "aten::mm", {ins[0], t}, 1)[0];
      return;
    }
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!ins[i].scalar) continue;
      if (kind == c10::aten::pow) unsupported(node, "its exponent is a number on the device (pow answers some exponents otherwise)");
      if (!promotes_like_a_number(ins, i)) {
        unsupported(node, "a number on the device would promote otherwise than a number here (its other tensors "
                          "are 0-dim or of a lower kind)");
      }
      if (schema->arguments()[i].type()->kind() == c10::TypeKind::TensorType) continue;
      if (kind == c10::aten::addcdiv && i == 3 && ins.size() == 4) {
        env_[node->output()] = addcdiv_by(node, ins);
        return;
      }
      op = tensor_overload(*op, i);
      if (!op) unsupported(node, "a number computed on the device is passed where it takes a Scalar");
    }
    const std::vector<Entry> outs = emit(node, *op, ins, node->outputs().size());
    for (size_t i = 0; i < outs.size(); ++i) env_[node->outputs()[i]] = outs[i];
  }

  // Whether op(..., number i, ...) computes in the dtype it would with a Python number there. A number
  // is a wrapped 0-dim tensor to type promotion, which ranks it below 0-dim tensors; a plain 0-dim
  // tensor of its value (float64 for a float) computes in the same dtype as long as some dimensioned
  // tensor of at least its kind takes part and no other 0-dim tensor does.
  static bool promotes_like_a_number(const std::vector<Entry>& ins, size_t i) {
    const at::ScalarType number = ins[i].meta.scalar_type();
    bool dimensioned = false, of_its_kind = false;
    for (size_t j = 0; j < ins.size(); ++j) {
      if (j == i || ins[j].value < 0) continue;
      if (ins[j].meta.dim() == 0) return false;
      dimensioned = true;
      const at::ScalarType t = ins[j].meta.scalar_type();
      of_its_kind = of_its_kind || at::isComplexType(t) ||
                    (at::isFloatingType(t) && !at::isComplexType(number)) ||
                    (!at::isFloatingType(number) && !at::isComplexType(number));
    }
    return dimensioned && of_its_kind;
  }

  // addcdiv(self, t1, t2, value) with its value on the device, which no overload takes: self + value * t1 / t2
  // in the order the CPU kernel computes it, so with the same result bit for bit. Only where the three
  // tensors share a floating dtype, so that no step promotes.
  Entry addcdiv_by(const Node* node, const std::vector<Entry>& ins) {
    for (size_t j = 0; j < 3; ++j) {
      if (ins[j].value < 0 || ins[j].scalar || !at::isFloatingType(ins[j].meta.scalar_type()) ||
          ins[j].meta.scalar_type() != ins[0].meta.scalar_type()) {
        unsupported(node, "its value is a number on the device and its tensors are not of one floating dtype");
      }
    }
    Entry one;
    one.constant = int64_t{1};
    const Entry scaled = emit(node, "aten::mul.Tensor", {ins[1], ins[3]}, 1)[0];
    const Entry quotient = emit(node, "aten::div.Tensor", {scaled, ins[2]}, 1)[0];
    return emit(node, "aten::add.Tensor", {ins[0], quotient, one}, 1)[0];
  }

  std::vector<Entry> emit(const Node* node, const char* name, const std::vector<Entry>& ins, size_t n_out) {
    const std::string full(name);
    const auto dot = full.find('.');
    auto op = c10::Dispatcher::singleton().findSchema(
        {full.substr(0, dot), dot == std::string::npos ? "" : full.substr(dot + 1)});
    TORCH_INTERNAL_ASSERT(op, "mydev lowering: no operator ", name);
    return emit(node, *op, ins, n_out);
  }

  // Appends a call of `op` to the program; the Meta run gives its outputs' geometry.
  std::vector<Entry> emit(const Node* node, const c10::OperatorHandle& op, const std::vector<Entry>& ins,
                          size_t n_out) {
    const c10::FunctionSchema& schema = op.schema();
    torch::jit::Stack stack;
    for (size_t i = 0; i < ins.size(); ++i) stack.push_back(meta_value(ins[i], schema.arguments()[i].type()));
    try {
      op.callBoxed(stack);
    } catch (const std::exception& e) {
      unsupported(node, std::string("its Meta kernel failed (its output shape depends on the data, it has no "
                                    "Meta kernel, or bad arguments): ") + brief(e));
    }
    compiler::Node n;
    n.op = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
    for (const Entry& e : ins) n.args.push_back(arg_of(e));
    n.source = where(node);
    if (handles_) {
      if (auto it = handles_->find(const_cast<Node*>(node)); it != handles_->end()) {
        n.source = "debug handle " + std::to_string(it->second) + (n.source.empty() ? "" : " " + n.source);
      }
    }
    const int index = static_cast<int>(out_.graph.nodes.size());
    std::vector<Entry> outs;
    for (size_t i = 0; i < n_out; ++i) {
      const c10::IValue& r = stack[stack.size() - n_out + i];
      if (r.isTensor() && r.toTensor().defined()) {
        Entry e = new_value(r.toTensor(), index);
        n.outputs.push_back(e.value);
        outs.push_back(std::move(e));
      } else if (r.isTensorList()) {
        Entry list;
        list.is_list = true;
        for (const at::Tensor& t : r.toTensorList()) {
          Entry e = new_value(t, index);
          n.outputs.push_back(e.value);
          list.items.push_back(std::move(e));
        }
        outs.push_back(std::move(list));
      } else if (r.isNone() || r.isTensor()) {  // an undefined tensor (a gradient not asked for)
        n.outputs.push_back(-1);
        outs.emplace_back();
      } else {
        unsupported(node, "it returns a " + r.tagKind() + " beside tensors");
      }
    }
    out_.graph.nodes.push_back(std::move(n));
    return outs;
  }

  const std::unordered_map<Node*, int64_t>* handles_;
  LoweredGraph out_;
  std::unordered_map<const Value*, Entry> env_;
  std::vector<int> constant_ids_;
  c10::DeviceIndex device_ = -1;
};

} // namespace

LoweredGraph lower(const std::shared_ptr<torch::jit::Graph>& graph, const std::vector<c10::IValue>& inputs,
                   const std::string& name, const std::unordered_map<torch::jit::Node*, int64_t>* debug_handles,
                   const std::vector<bool>* numbers) {
  return Lowerer(name, debug_handles).run(graph, inputs, numbers);
}

bool lowerable(const torch::jit::Node* node) {
  const c10::FunctionSchema* schema = node->maybeSchema();
  if (!schema || node->kind().ns() != c10::namespaces::aten) return false;
  auto op = dispatcher_op(*schema);
  if (!op || !runs_on_device(*op)) return false;
  if (!op->hasKernelForDispatchKey(c10::DispatchKey::Meta) &&
      !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
      !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)) {
    return false;
  }
  for (const c10::Argument& a : schema->arguments()) {
    if (a.alias_info() && a.alias_info()->isWrite()) return false;  // in-place: TorchScript keeps those
  }
  return true;
}

} // namespace my_device::jit
