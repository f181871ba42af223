#include "Fusion.h"

#include <c10/util/Exception.h>

#include <functional>
#include <unordered_map>

namespace my_device::compiler {

namespace {

// Emits the instructions of one node into a kernel being built.
class KernelBuilder {
 public:
  KernelBuilder(const Graph& g, ElementwiseKernel& k, std::vector<int>& inputs) : g_(g), k_(k), inputs_(inputs) {}

  // The register holding argument `a` (a value or a number).
  int16_t reg(const Arg& a) {
    if (a.value >= 0) {
      auto it = regs_.find(a.value);
      if (it != regs_.end()) return it->second;
      // An input of the group: loaded first, so loads of a chunk happen before any math on it.
      const int16_t r = fresh();
      k_.code.insert(k_.code.begin() + loads_++,
                     Instr{Opcode::Load, r, static_cast<int16_t>(inputs_.size()), 0, 0, 0});
      inputs_.push_back(a.value);
      regs_[a.value] = r;
      return r;
    }
    return constant(number(a));
  }
  int16_t constant(float v) {
    const int16_t r = fresh();
    k_.code.push_back(Instr{Opcode::Const, r, 0, 0, 0, v});
    return r;
  }
  int16_t emit(Opcode op, int16_t a, int16_t b = 0, int16_t c = 0, float imm = 0) {
    const int16_t r = fresh();
    k_.code.push_back(Instr{op, r, a, b, c, imm});
    return r;
  }
  static float number(const Arg& a) {
    TORCH_CHECK(a.value < 0 && !a.is_list && (a.constant.isDouble() || a.constant.isInt() || a.constant.isBool()),
                "mydev compiler: expected a number argument");
    if (a.constant.isDouble()) return static_cast<float>(a.constant.toDouble());
    if (a.constant.isInt()) return static_cast<float>(a.constant.toInt());
    return a.constant.toBool() ? 1.0f : 0.0f;
  }
  void bind(int value, int16_t r) {
    regs_[value] = r;
  }
  int16_t reg_of(int value) const {
    return regs_.at(value);
  }

 private:
  int16_t fresh() {
    return static_cast<int16_t>(k_.num_registers++);
  }
  const Graph& g_;
  ElementwiseKernel& k_;
  std::vector<int>& inputs_;
  std::unordered_map<int, int16_t> regs_;
  int loads_ = 0;
};

using Rule = std::function<int16_t(KernelBuilder&, const Node&)>;

// x + alpha * y, or x - alpha * y
Rule with_alpha(Opcode op) {
  return [op](KernelBuilder& b, const Node& n) {
    const int16_t x = b.reg(n.args[0]);
    int16_t y = b.reg(n.args[1]);
    if (n.args.size() > 2) {
      const float alpha = KernelBuilder::number(n.args[2]);
      if (alpha != 1.0f) y = b.emit(Opcode::Mul, y, b.constant(alpha));
    }
    return b.emit(op, x, y);
  };
}
Rule binary(Opcode op) {
  return [op](KernelBuilder& b, const Node& n) { return b.emit(op, b.reg(n.args[0]), b.reg(n.args[1])); };
}
Rule unary(Opcode op) {
  return [op](KernelBuilder& b, const Node& n) { return b.emit(op, b.reg(n.args[0])); };
}
bool is_tanh_approximation(const Arg& a) {
  return !a.is_list && a.constant.isString() && a.constant.toStringRef() == "tanh";
}

const std::unordered_map<std::string, Rule>& rules() {
  static const std::unordered_map<std::string, Rule> table = [] {
    std::unordered_map<std::string, Rule> t;
    t["aten::add.Tensor"] = t["aten::add.Scalar"] = with_alpha(Opcode::Add);
    t["aten::sub.Tensor"] = t["aten::sub.Scalar"] = with_alpha(Opcode::Sub);
    t["aten::rsub.Scalar"] = t["aten::rsub.Tensor"] = [](KernelBuilder& b, const Node& n) {
      int16_t x = b.reg(n.args[0]);
      if (n.args.size() > 2 && KernelBuilder::number(n.args[2]) != 1.0f) {
        x = b.emit(Opcode::Mul, x, b.constant(KernelBuilder::number(n.args[2])));
      }
      return b.emit(Opcode::Sub, b.reg(n.args[1]), x);
    };
    t["aten::mul.Tensor"] = t["aten::mul.Scalar"] = binary(Opcode::Mul);
    t["aten::div.Tensor"] = t["aten::div.Scalar"] = binary(Opcode::Div);
    t["aten::maximum"] = binary(Opcode::Max);
    t["aten::minimum"] = binary(Opcode::Min);
    t["aten::pow.Tensor_Scalar"] = t["aten::pow.Tensor_Tensor"] = binary(Opcode::Pow);
    for (const auto& [name, op] : {std::pair<const char*, Opcode>{"gt", Opcode::Gt}, {"ge", Opcode::Ge},
                                   {"lt", Opcode::Lt}, {"le", Opcode::Le}, {"eq", Opcode::Eq}, {"ne", Opcode::Ne}}) {
      t[std::string("aten::") + name + ".Tensor"] = t[std::string("aten::") + name + ".Scalar"] = binary(op);
    }
    t["aten::where.self"] = [](KernelBuilder& b, const Node& n) {
      return b.emit(Opcode::Where, b.reg(n.args[0]), b.reg(n.args[1]), b.reg(n.args[2]));
    };
    for (const auto& [name, op] :
         {std::pair<const char*, Opcode>{"neg", Opcode::Neg}, {"abs", Opcode::Abs}, {"relu", Opcode::Relu},
          {"tanh", Opcode::Tanh}, {"sigmoid", Opcode::Sigmoid}, {"exp", Opcode::Exp}, {"log", Opcode::Log},
          {"sqrt", Opcode::Sqrt}, {"rsqrt", Opcode::Rsqrt}, {"reciprocal", Opcode::Reciprocal},
          {"erf", Opcode::Erf}, {"sin", Opcode::Sin}, {"cos", Opcode::Cos}, {"log1p", Opcode::Log1p},
          {"expm1", Opcode::Expm1}, {"sign", Opcode::Sign}, {"logical_not", Opcode::Not}}) {
      t[std::string("aten::") + name] = unary(op);
    }
    t["aten::clamp"] = [](KernelBuilder& b, const Node& n) {
      int16_t x = b.reg(n.args[0]);
      if (n.args.size() > 1 && !n.args[1].constant.isNone()) x = b.emit(Opcode::Max, x, b.reg(n.args[1]));
      if (n.args.size() > 2 && !n.args[2].constant.isNone()) x = b.emit(Opcode::Min, x, b.reg(n.args[2]));
      return x;
    };
    t["aten::clamp_min"] = binary(Opcode::Max);
    t["aten::clamp_max"] = binary(Opcode::Min);
    t["aten::gelu"] = [](KernelBuilder& b, const Node& n) {
      const bool tanh = n.args.size() > 1 && is_tanh_approximation(n.args[1]);
      return b.emit(tanh ? Opcode::GeluTanh : Opcode::Gelu, b.reg(n.args[0]));
    };
    t["aten::gelu_backward"] = [](KernelBuilder& b, const Node& n) {
      const bool tanh = n.args.size() > 2 && is_tanh_approximation(n.args[2]);
      return b.emit(tanh ? Opcode::GeluTanhBackward : Opcode::GeluBackward, b.reg(n.args[0]), b.reg(n.args[1]));
    };
    t["aten::tanh_backward"] = binary(Opcode::TanhBackward);
    t["aten::sigmoid_backward"] = binary(Opcode::SigmoidBackward);
    t["aten::threshold_backward"] = [](KernelBuilder& b, const Node& n) {
      return b.emit(Opcode::ThresholdBackward, b.reg(n.args[0]), b.reg(n.args[1]), 0,
                    KernelBuilder::number(n.args[2]));
    };
    return t;
  }();
  return table;
}

bool float_or_bool(c10::ScalarType t) {
  return t == c10::ScalarType::Float || t == c10::ScalarType::Bool;
}

bool args_fusible(const Graph& g, const std::vector<Arg>& args) {
  for (const Arg& a : args) {
    if (a.is_list) return false;
    if (a.value >= 0 && !float_or_bool(g.values[a.value].meta.dtype)) return false;
  }
  return true;
}

} // namespace

bool is_fusible_pointwise(const Graph& g, const Node& node) {
  if (node.outputs.size() != 1 || node.outputs[0] < 0) return false;
  if (!float_or_bool(g.values[node.outputs[0]].meta.dtype)) return false;
  if (!rules().count(node.op) || !args_fusible(g, node.args)) return false;
  // Binary ops whose output is Bool but not a comparison would be logical
  // ops in disguise (add of two bools): not what the float registers compute.
  const bool bool_out = g.values[node.outputs[0]].meta.dtype == c10::ScalarType::Bool;
  const bool makes_bool = node.op.rfind("aten::gt", 0) == 0 || node.op.rfind("aten::ge", 0) == 0 ||
                          node.op.rfind("aten::lt", 0) == 0 || node.op.rfind("aten::le", 0) == 0 ||
                          node.op.rfind("aten::eq", 0) == 0 || node.op.rfind("aten::ne", 0) == 0 ||
                          node.op == "aten::logical_not" || node.op == "aten::where.self";
  if (bool_out && !makes_bool) return false;
  if (node.op == "aten::where.self" && bool_out) return false;
  // where's condition must be Bool, as its CPU kernel demands (a fused kernel would take any nonzero).
  if (node.op == "aten::where.self" &&
      (node.args.empty() || node.args[0].value < 0 || g.values[node.args[0].value].meta.dtype != c10::ScalarType::Bool)) {
    return false;
  }
  // Comparisons of Bool tensors, and where() picking between Bool tensors, stay unfused.
  if (makes_bool && node.op != "aten::where.self" && node.op != "aten::logical_not") {
    for (const Arg& a : node.args) {
      if (a.value >= 0 && g.values[a.value].meta.dtype != c10::ScalarType::Float) return false;
    }
  }
  // Only floating arithmetic: a Bool input of arithmetic (x * mask) is a 0/1 float here.
  return true;
}

std::optional<ReduceKind> fusible_reduction(const Graph& g, const Node& node) {
  static const std::unordered_map<std::string, ReduceKind> kinds = {
      {"aten::sum.dim_IntList", ReduceKind::Sum}, {"aten::mean.dim", ReduceKind::Mean},
      {"aten::amax", ReduceKind::Max}, {"aten::amin", ReduceKind::Min}};
  auto it = kinds.find(node.op);
  if (it == kinds.end() || node.outputs.size() != 1 || node.outputs[0] < 0) return std::nullopt;
  if (node.args.empty() || node.args[0].value < 0) return std::nullopt;
  if (g.values[node.args[0].value].meta.dtype != c10::ScalarType::Float) return std::nullopt;
  if (g.values[node.outputs[0]].meta.dtype != c10::ScalarType::Float) return std::nullopt;
  // sum/mean's dtype argument must be absent; dims must be a constant list of
  // dims the input has. (A 0-dim input's dim 0 is ATen's to interpret, and a
  // program from a file may name any dim: both are left to the ATen call.)
  if (node.args.size() < 3 || !node.args[1].is_list) return std::nullopt;
  if (node.args.size() > 3 && !node.args[3].constant.isNone()) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(g.values[node.args[0].value].meta.sizes.size());
  if (rank == 0) return std::nullopt;
  for (const Arg& d : node.args[1].items) {
    if (!d.constant.isInt() || d.constant.toInt() < -rank || d.constant.toInt() >= rank) return std::nullopt;
  }
  return it->second;
}

ElementwiseKernel build_kernel(const Graph& g, const std::vector<int>& members, const std::vector<int>& stored,
                               std::vector<int>& inputs) {
  ElementwiseKernel k;
  KernelBuilder b(g, k, inputs);
  for (int index : members) {
    const Node& n = g.nodes[index];
    auto reduction = fusible_reduction(g, n);
    if (reduction && index == members.back()) {
      const int source = n.args[0].value;
      const TensorMeta& in = g.values[source].meta;
      k.reduce = *reduction;
      k.reduce_register = b.reg(n.args[0]);
      k.reduce_shape = in.sizes;
      const int64_t rank = static_cast<int64_t>(in.sizes.size());
      for (const Arg& d : n.args[1].items) {
        int64_t dim = d.constant.toInt();
        if (dim < 0) dim += rank;
        k.reduce_dims.push_back(dim);
      }
      if (k.reduce_dims.empty()) {  // an empty dim list reduces everything
        for (int64_t d = 0; d < rank; ++d) k.reduce_dims.push_back(d);
      }
      k.keepdim = n.args[2].constant.toBool();
      k.reduce_count = 1;
      for (int64_t d : k.reduce_dims) k.reduce_count *= in.sizes[d];
      continue;
    }
    b.bind(n.outputs[0], rules().at(n.op)(b, n));
  }
  for (int v : stored) {
    if (k.reduce != ReduceKind::None && v == g.nodes[members.back()].outputs[0]) continue;
    k.stores.push_back(b.reg_of(v));
  }
  return k;
}

} // namespace my_device::compiler
