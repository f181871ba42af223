#include "Program.h"

#include <ATen/core/TensorBody.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/max_pool2d_with_indices.h>
#include <ATen/ops/mm.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <atomic>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "Fusion.h"
#include "core/ComputeUnits.h"
#include "core/Device.h"
#include "core/KernelArgs.h"
#include "core/Launch.h"
#include "core/Stream.h"
#include "native/Convolution.h"
#include "native/Factory.h"
#include "native/hostkernel/HostKernel.h"

namespace my_device::compiler {

CompilerCounters& counters() {
  static CompilerCounters c;
  return c;
}

namespace {

std::mutex g_counters_mutex;

c10::OperatorHandle resolve(const Node& n) {
  const auto dot = n.op.find('.');
  c10::OperatorName name{n.op.substr(0, dot), dot == std::string::npos ? "" : n.op.substr(dot + 1)};
  auto handle = c10::Dispatcher::singleton().findSchema(name);
  TORCH_CHECK(handle.has_value(), "mydev compiler: unknown operator '", n.op, "' (line ", n.line, ")");
  // A program runs each call through the op's CPU kernel on the device's bytes. Ops only the device
  // implements (the fused RNN cells, which ATen takes for PrivateUse1 inputs and ships for CUDA only) have
  // none: refused here, so the graph runs as mydev kernels instead of failing on the worker.
  TORCH_CHECK(handle->hasComputedKernelForDispatchKey(c10::DispatchKey::CPU), "mydev compiler: ", n.op,
              " has no CPU kernel for a program to run (line ", n.line, ")");
  return *handle;
}

// An arena value over a storage of its own that starts at the value's first
// byte (without owning it: the arena does), so that its storage offset is the
// one the graph traced. Kernels that take a storage offset count it from their
// tensor's storage (as_strided_scatter of a value placed in the arena's middle
// wrote its window at the arena's offset, not the value's: a lost write).
at::Tensor in_arena(const at::Tensor& arena, size_t byte_offset, const TensorMeta& meta) {
  char* start = static_cast<char*>(arena.data_ptr()) + byte_offset;
  c10::Storage storage(c10::Storage::use_byte_size_t(), meta.storage_bytes(), c10::DataPtr(start, arena.device()),
                       /*allocator=*/nullptr, /*resizable=*/false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), arena.key_set(),
                                                   c10::scalarTypeToTypeMeta(meta.dtype));
  impl->set_sizes_and_strides(meta.sizes, meta.strides, meta.offset);
  return at::Tensor(std::move(impl));
}

// Warnings raised while it is installed, to be raised again (replay) or dropped.
class HeldWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    held_.push_back(warning);
  }
  void replay() {
    for (const c10::Warning& w : held_) c10::warn(w);
    held_.clear();
  }

 private:
  std::vector<c10::Warning> held_;
};

// A clone's copy. One layout on both sides with no gaps is one memcpy on this thread: ATen's copy_ shares
// a copy of more than 32K elements among the intra-op threads, and waking them costs more than the copy.
void copy_values(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.sizes() == src.sizes() && dst.strides() == src.strides() && dst.is_non_overlapping_and_dense()) {
    std::memcpy(dst.data_ptr(), src.const_data_ptr(), dst.numel() * dst.element_size());
  } else {
    dst.copy_(src);
  }
}

// The out= overload of a functional op: same arguments, then one Tensor(a!)
// per return. Looked up once per op name.
std::optional<c10::OperatorHandle> out_overload(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::vector<std::string>> overloads;
  static std::unordered_map<std::string, std::optional<c10::OperatorHandle>> found;
  std::lock_guard<std::mutex> lock(mutex);
  const c10::FunctionSchema& fs = op.schema();
  const std::string key = fs.name() + "." + fs.overload_name();
  if (auto it = found.find(key); it != found.end()) return it->second;
  if (overloads.empty()) {
    for (const c10::OperatorName& n : c10::Dispatcher::singleton().getAllOpNames()) {
      overloads[n.name].push_back(n.overload_name);
    }
  }
  std::optional<c10::OperatorHandle> result;
  for (const std::string& overload : overloads[fs.name()]) {
    auto candidate = c10::Dispatcher::singleton().findSchema({fs.name(), overload});
    if (!candidate || !candidate->hasKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
    const c10::FunctionSchema& cs = candidate->schema();
    const size_t n = fs.arguments().size();
    if (cs.arguments().size() != n + fs.returns().size() || cs.returns().size() != fs.returns().size()) continue;
    bool same = true;
    for (size_t i = 0; i < n && same; ++i) {
      same = cs.arguments()[i].name() == fs.arguments()[i].name() &&
             cs.arguments()[i].type()->str() == fs.arguments()[i].type()->str();
    }
    for (size_t i = n; i < cs.arguments().size() && same; ++i) {
      const c10::Argument& a = cs.arguments()[i];
      same = a.alias_info() && a.alias_info()->isWrite() && a.type()->kind() == c10::TypeKind::TensorType;
    }
    for (const c10::Argument& r : fs.returns()) same = same && r.type()->kind() == c10::TypeKind::TensorType;
    if (same) {
      result = candidate;
      break;
    }
  }
  found[key] = result;
  return result;
}

// A view in the graph's sense: one Tensor return aliasing its first argument.
bool is_view(const c10::FunctionSchema& s) {
  if (s.returns().size() != 1 || s.returns()[0].type()->kind() != c10::TypeKind::TensorType) return false;
  const c10::AliasInfo* ret = s.returns()[0].alias_info();
  return ret != nullptr && !ret->isWrite() && !s.arguments().empty() && s.arguments()[0].alias_info() != nullptr &&
         !s.arguments()[0].alias_info()->isWrite();
}

bool mutates(const c10::FunctionSchema& s) {
  for (const c10::Argument& a : s.arguments()) {
    if ((a.alias_info() && a.alias_info()->isWrite()) || writes_unannotated(a)) return true;
  }
  return false;
}

// The argument a return aliases (a view, or an in-place op's self), or -1.
int aliased_argument(const c10::FunctionSchema& s, size_t ret) {
  const c10::AliasInfo* r = s.returns()[ret].alias_info();
  if (r == nullptr) return -1;
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    const c10::AliasInfo* a = s.arguments()[i].alias_info();
    if (a && a->beforeSets() == r->beforeSets()) return static_cast<int>(i);
  }
  return -1;
}

// Where result r of a node lives: argument `argument` (its list's `item`-th
// tensor, or -1), value `value`; value -1 when it is a storage of its own.
struct AliasSource {
  int argument = -1;
  int item = -1;
  int value = -1;
};

// aten::to and type_as are marked as aliasing self, but only return self when
// they convert nothing: a result of another dtype is a copy (an int64 result
// read as float32 over its argument's bytes would be garbage, and reach past a
// smaller one).
AliasSource aliased_source(const Graph& g, const Node& n, const c10::FunctionSchema& s, size_t r) {
  if (r >= n.outputs.size() || n.outputs[r] < 0) return {};
  // One list return (split's, broadcast_tensors'): every output aliases the argument it names, or, for a
  // list argument (broadcast_tensors'), that list's r-th tensor.
  const bool list_return = s.returns().size() == 1 && s.returns()[0].type()->kind() == c10::TypeKind::ListType;
  const int a = aliased_argument(s, list_return ? 0 : r);
  if (a < 0 || (!list_return && r >= s.returns().size())) return {};
  const Arg& arg = n.args[a];
  if (arg.is_list) {
    if (!list_return || r >= arg.items.size() || arg.items[r].value < 0) return {};
    return {a, static_cast<int>(r), arg.items[r].value};
  }
  if (arg.value < 0) return {};
  const bool converts = s.name() == "aten::to" || s.name() == "aten::type_as";
  if (converts && g.values[arg.value].meta.dtype != g.values[n.outputs[r]].meta.dtype) return {};
  return {a, -1, arg.value};
}

// A constant argument as the boxed kernel expects it for `type`. Devices
// become the CPU: inside the program every tensor is a CPU tensor over
// device memory, and CPU allocations land in device memory (HostCall).
c10::IValue boxed_constant(const Arg& a, const c10::TypePtr& type) {
  if (!a.is_list) {
    if (a.constant.isDevice()) return c10::Device(c10::DeviceType::CPU);
    // A number where the schema wants a Tensor (x + 1 traced as add.Tensor):
    // a wrapped number, as Python's argument parser would make it.
    const bool tensor_formal = type->kind() == c10::TypeKind::TensorType ||
                               (type->castRaw<c10::OptionalType>() &&
                                type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType);
    if (tensor_formal && (a.constant.isInt() || a.constant.isDouble() || a.constant.isBool())) {
      // Made without the dispatcher: frontends compile under Python dispatch
      // modes (aot_autograd's FakeTensorMode) that would make it a fake tensor.
      const at::ScalarType type = a.constant.isDouble() ? at::kDouble : a.constant.isInt() ? at::kLong : at::kBool;
      at::Tensor t = at::detail::empty_cpu({}, type, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
      if (type == at::kDouble) *t.data_ptr<double>() = a.constant.toDouble();
      if (type == at::kLong) *t.data_ptr<int64_t>() = a.constant.toInt();
      if (type == at::kBool) *t.data_ptr<bool>() = a.constant.toBool();
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
      return t;
    }
    return a.constant;
  }
  c10::TypePtr t = type;
  if (auto opt = t->castRaw<c10::OptionalType>()) t = opt->getElementType();
  auto list = t->castRaw<c10::ListType>();
  TORCH_CHECK(list, "mydev compiler: a list given for a ", type->str(), " argument");
  const c10::TypeKind kind = list->getElementType()->kind();
  if (kind == c10::TypeKind::IntType || kind == c10::TypeKind::SymIntType) {
    c10::List<int64_t> out;
    for (const Arg& e : a.items) out.push_back(e.constant.toInt());
    return out;
  }
  if (kind == c10::TypeKind::FloatType) {
    c10::List<double> out;
    for (const Arg& e : a.items) out.push_back(e.constant.isInt() ? e.constant.toInt() : e.constant.toDouble());
    return out;
  }
  if (kind == c10::TypeKind::BoolType) {
    c10::List<bool> out;
    for (const Arg& e : a.items) out.push_back(e.constant.toBool());
    return out;
  }
  c10::impl::GenericList out(list->getElementType());
  for (const Arg& e : a.items) out.push_back(e.constant);
  return out;
}

bool has_tensor(const Arg& a) {
  if (a.value >= 0) return true;
  for (const Arg& e : a.items) {
    if (has_tensor(e)) return true;
  }
  return false;
}

bool broadcasts_to(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 0; i < from.size(); ++i) {
    const int64_t f = from[from.size() - 1 - i], t = to[to.size() - 1 - i];
    if (f != t && f != 1) return false;
  }
  return true;
}

// Whether counting `m`'s elements and the bytes its storage needs stays
// within int64 (a program text may give any sizes).
bool fits_in_memory(const TensorMeta& m) {
  int64_t numel = 1, last = m.offset;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(numel, m.sizes[d], &numel)) return false;
    if (m.sizes[d] > 0 && (__builtin_mul_overflow(m.sizes[d] - 1, m.strides[d], &reach) ||
                           __builtin_add_overflow(last, reach, &last))) {
      return false;
    }
  }
  int64_t bytes = 0;
  return !__builtin_mul_overflow(last + 1, static_cast<int64_t>(c10::elementSize(m.dtype)), &bytes);
}

// Whether no two elements of `m` share a place in memory (what a result the
// program writes needs: an expanded geometry would be written over itself).
bool non_overlapping(const TensorMeta& m) {
  std::vector<size_t> dims;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) return true;
    if (m.sizes[d] != 1) dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return m.strides[a] < m.strides[b]; });
  int64_t span = 1;  // elements the smaller dims cover
  for (size_t d : dims) {
    if (m.strides[d] < span) return false;
    span = m.strides[d] * m.sizes[d];
  }
  return true;
}

// An uninitialised tensor of `m`'s geometry, over a storage that holds it.
at::Tensor empty_with_geometry(const TensorMeta& m, const at::TensorOptions& options) {
  const int64_t elements = static_cast<int64_t>(m.storage_bytes() / c10::elementSize(m.dtype));
  return at::empty({elements}, options.dtype(m.dtype)).as_strided(m.sizes, m.strides, m.offset);
}

at::Tensor meta_tensor(const TensorMeta& m) {
  return empty_with_geometry(m, at::TensorOptions().device(at::kMeta));
}

TensorMeta meta_of(const at::Tensor& t) {
  return {t.scalar_type(), t.sizes().vec(), t.strides().vec(), t.storage_offset()};
}

// An argument of `n` as a meta kernel takes it: values as meta tensors of
// their graph geometry, devices as the meta device.
c10::IValue meta_argument(const Graph& g, const Arg& a, const c10::TypePtr& type) {
  if (!a.is_list) {
    if (a.value >= 0) return meta_tensor(g.values[a.value].meta);
    if (a.constant.isDevice()) return c10::Device(c10::kMeta);
    return boxed_constant(a, type);
  }
  if (!has_tensor(a)) return boxed_constant(a, type);
  c10::TypePtr t = type;
  if (auto opt = t->castRaw<c10::OptionalType>()) t = opt->getElementType();
  auto list = t->castRaw<c10::ListType>();
  TORCH_CHECK(list, "mydev compiler: a list given for a ", type->str(), " argument");
  if (list->getElementType()->castRaw<c10::OptionalType>()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const Arg& e : a.items) {
      out.push_back(e.value < 0 ? std::nullopt : std::optional<at::Tensor>(meta_tensor(g.values[e.value].meta)));
    }
    return out;
  }
  c10::List<at::Tensor> out;
  for (const Arg& e : a.items) {
    TORCH_CHECK(e.value >= 0, "mydev compiler: a constant in a list of tensors");
    out.push_back(meta_tensor(g.values[e.value].meta));
  }
  return out;
}

// Whether `v` is something an argument of schema type `t` takes (the text's
// constants are untyped: i3 may stand for an int, a float or a dtype).
bool fits(const c10::IValue& v, const c10::TypePtr& t) {
  if (auto opt = t->castRaw<c10::OptionalType>()) return v.isNone() || fits(v, opt->getElementType());
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
      return v.isTensor();
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      return v.isInt();
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
      return v.isDouble() || v.isInt();
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
      return v.isBool();
    case c10::TypeKind::NumberType:
      return v.isInt() || v.isDouble() || v.isBool() || v.isComplexDouble();
    case c10::TypeKind::StringType:
      return v.isString();
    case c10::TypeKind::DeviceObjType:
      return v.isDevice();
    case c10::TypeKind::ListType: {
      if (!v.isList()) return false;
      const c10::TypePtr element = t->castRaw<c10::ListType>()->getElementType();
      for (const c10::IValue& e : v.toListRef()) {
        if (!fits(e, element)) return false;
      }
      return true;
    }
    default:
      return true;  // a type no frontend writes (a Generator is always None)
  }
}

// Whether an integer given for a dtype, layout or memory format (the
// schema's real type) names one: kernels cast it to the enum unchecked.
bool names_an_enum_value(const c10::IValue& v, const c10::TypePtr& real) {
  c10::TypePtr t = real;
  if (auto opt = t->castRaw<c10::OptionalType>()) {
    if (v.isNone()) return true;
    t = opt->getElementType();
  }
  if (!v.isInt()) return true;  // (fits() judges the kind)
  const int64_t i = v.toInt();
  switch (t->kind()) {
    case c10::TypeKind::ScalarTypeType:
      return i >= 0 && i < static_cast<int64_t>(c10::ScalarType::NumOptions) &&
             i != static_cast<int64_t>(c10::ScalarType::Undefined);
    case c10::TypeKind::LayoutType:
      return i >= 0 && i < static_cast<int64_t>(c10::Layout::NumOptions);
    case c10::TypeKind::MemoryFormatType:
      return i >= 0 && i < static_cast<int64_t>(c10::MemoryFormat::NumOptions);
    default:
      return true;
  }
}

std::vector<at::Tensor> tensors_of(const std::vector<c10::IValue>& stack) {
  std::vector<at::Tensor> results;
  for (const c10::IValue& r : stack) {
    if (r.isTensor()) {
      results.push_back(r.toTensor());
    } else if (r.isTensorList()) {
      for (const at::Tensor& t : r.toTensorList()) results.push_back(t);
    }
  }
  return results;
}

}  // namespace

// Frontends compile under Python dispatch modes (aot_autograd's FakeTensorMode):
// the meta kernels run below them.
MetaRun run_on_meta(const Graph& g, const Node& n, const c10::OperatorHandle& op) {
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  const c10::FunctionSchema& s = op.schema();
  MetaRun run;
  for (size_t k = 0; k < n.args.size(); ++k) {
    const c10::Argument& formal = s.arguments()[k];
    run.args.push_back(meta_argument(g, n.args[k], formal.type()));
    TORCH_CHECK(fits(run.args.back(), formal.type()) && names_an_enum_value(run.args.back(), formal.real_type()),
                "mydev compiler: ", n.op, " (line ", n.line, "): argument ", k + 1, " ('", formal.name(), "') is ",
                str(n.args[k]), ", which is not a ", formal.real_type()->str());
  }
  std::vector<c10::IValue> stack = run.args;
  try {
    op.callBoxed(stack);
    run.results = tensors_of(stack);
    run.ran = true;
  } catch (const c10::NotImplementedError&) {
    // no meta kernel
  } catch (const c10::Error& e) {
    run.refusal = e.what_without_backtrace();
  } catch (const std::exception&) {
  }
  return run;
}

// The argument (or list element) whose storage the meta kernel's result `r` is in.
AliasSource meta_alias_source(const Node& n, const MetaRun& meta, size_t r) {
  if (r >= n.outputs.size() || n.outputs[r] < 0 || r >= meta.results.size()) return {};
  for (size_t k = 0; k < n.args.size(); ++k) {
    const Arg& a = n.args[k];
    for (int item = a.is_list ? 0 : -1; item < (a.is_list ? static_cast<int>(a.items.size()) : 0); ++item) {
      const int value = item < 0 ? a.value : a.items[item].value;
      const std::optional<at::Tensor> in = meta.argument(k, item);
      if (value >= 0 && in && meta.results[r].is_alias_of(*in)) return {static_cast<int>(k), item, value};
    }
  }
  return {};
}

std::optional<at::Tensor> MetaRun::argument(size_t index, int item) const {
  if (index >= args.size()) return std::nullopt;
  const c10::IValue& v = args[index];
  if (item < 0) return v.isTensor() ? std::optional<at::Tensor>(v.toTensor()) : std::nullopt;
  if (!v.isTensorList()) return std::nullopt;
  const c10::List<at::Tensor> list = v.toTensorList();
  return static_cast<size_t>(item) < list.size() ? std::optional<at::Tensor>(list.get(item)) : std::nullopt;
}

bool MetaRun::plain_alias(size_t result, size_t index, int item) const {
  if (!ran) return true;  // the schema's word
  const std::optional<at::Tensor> in = argument(index, item);
  if (result >= results.size() || !in || !results[result].is_alias_of(*in)) return false;
  // _conj and _neg_view alias their argument but change how it reads: a geometry cannot say that.
  const at::Tensor& out = results[result];
  return out.is_conj() == in->is_conj() && out.is_neg() == in->is_neg();
}

namespace {

// The storage offset, in elements of `view`'s dtype, of a view whose graph
// geometry is `view`, of `base`, which has `root`'s geometry moved to
// base.storage_offset(). A view may change the dtype (view_as_real of a
// complex root): each offset counts elements of its own dtype.
int64_t view_offset(const at::Tensor& base, const TensorMeta& view, const TensorMeta& root) {
  const int64_t shift_bytes =
      (base.storage_offset() - root.offset) * static_cast<int64_t>(c10::elementSize(root.dtype));
  return view.offset + shift_bytes / static_cast<int64_t>(c10::elementSize(view.dtype));
}

// Whether `t`'s elements sit where `m`'s strides put them (the stride of a dim
// of one element, or of a tensor of none, addresses nothing). Sizes equal.
bool same_strides(const at::Tensor& t, const TensorMeta& m) {
  if (t.numel() == 0) return true;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] > 1 && t.stride(static_cast<int64_t>(d)) != m.strides[d]) return false;
  }
  return true;
}

bool has_geometry(const at::Tensor& t, const TensorMeta& m) {
  return t.sizes().vec() == m.sizes && t.storage_offset() == m.offset && same_strides(t, m);
}

// A copy of `t` laid out with `m`'s geometry (a CPU allocation: device memory, on the worker).
at::Tensor with_geometry(const at::Tensor& t, const TensorMeta& m) {
  at::Tensor out = empty_with_geometry(m, t.options());
  out.copy_(t);
  return out;
}

// A CPU tensor over `base`'s storage with `meta`'s geometry.
at::Tensor alias(const at::Tensor& base, const TensorMeta& meta, int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(base.storage()), base.key_set(),
                                                   c10::scalarTypeToTypeMeta(meta.dtype));
  impl->set_sizes_and_strides(meta.sizes, meta.strides, offset);
  return at::Tensor(std::move(impl));
}

// The GemmKernel that computes `n`, an out= call in `step`, if it is a small
// Float addmm or mm with number coefficients.
std::optional<GemmKernel> gemm_of(const Graph& g, const Node& n, const Step& step) {
  const bool addmm = n.op == "aten::addmm", mm = n.op == "aten::mm";
  if (!addmm && !mm) return std::nullopt;
  const size_t first = addmm ? 1 : 0;
  for (size_t k = 0; k < first + 2; ++k) {
    if (n.args[k].value < 0) return std::nullopt;
  }
  const int out = n.outputs[0];
  for (int v : {n.args[first].value, n.args[first + 1].value, out}) {
    const TensorMeta& m = g.values[v].meta;
    if (m.dtype != c10::ScalarType::Float || m.sizes.size() != 2) return std::nullopt;
  }
  if (addmm) {
    const TensorMeta& bias = g.values[n.args[0].value].meta;
    if (bias.dtype != c10::ScalarType::Float || bias.sizes.size() > 2) return std::nullopt;
  }
  const std::vector<int64_t>& a = g.values[n.args[first].value].meta.sizes;
  const std::vector<int64_t>& b = g.values[n.args[first + 1].value].meta.sizes;
  if (!GemmKernel::suits(a[0], b[1], a[1])) return std::nullopt;
  GemmKernel kernel;
  kernel.has_bias = addmm;
  if (addmm) {
    // Coefficients are constants of the step's stack (the program text's numbers).
    const c10::IValue& beta = step.stack[3];
    const c10::IValue& alpha = step.stack[4];
    if (!(beta.isInt() || beta.isDouble()) || !(alpha.isInt() || alpha.isDouble())) return std::nullopt;
    kernel.beta = static_cast<float>(beta.isInt() ? beta.toInt() : beta.toDouble());
    kernel.alpha = static_cast<float>(alpha.isInt() ? alpha.toInt() : alpha.toDouble());
  }
  return kernel;
}

// CPU tensors over the operands' bytes, with the program's geometry for them.
// Operands over one device storage share one host StorageImpl, as HostCall's
// do: ATen's alias and overlap checks (an in-place op whose source overlaps
// its destination) compare StorageImpls.
class HostViews {
 public:
  explicit HostViews(size_t operands) {
    storages_.reserve(operands);
  }

  at::Tensor operator()(const Operand& o, const TensorMeta& m) {
    if (o.host.defined()) return o.host;
    void* base = o.data();
    const size_t nbytes = o.size();
    const c10::Storage* storage = nullptr;
    for (const auto& [b, st] : storages_) {
      if (b == base) storage = &st;
    }
    if (storage == nullptr) {
      storages_.emplace_back(base, c10::Storage(c10::make_intrusive<c10::StorageImpl>(
                                       c10::StorageImpl::use_byte_size_t(), nbytes,
                                       c10::DataPtr(kernel_address(base), c10::Device(c10::kCPU)),
                                       /*allocator=*/nullptr, /*resizable=*/false)));
      storage = &storages_.back().second;
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(*storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                     c10::scalarTypeToTypeMeta(m.dtype));
    impl->set_sizes_and_strides(m.sizes, m.strides, o.offset);
    return at::Tensor(std::move(impl));
  }

 private:
  std::vector<std::pair<void*, c10::Storage>> storages_;
};

std::string label_of(const Node& n) {
  std::string s = n.op + " (line " + std::to_string(n.line) + ")";
  if (!n.source.empty()) s += " at " + n.source;
  return s;
}

} // namespace

std::shared_ptr<Program> Program::compile(Graph graph) {
  std::shared_ptr<Program> p(new Program(std::move(graph)));
  p->build();
  std::lock_guard<std::mutex> lock(g_counters_mutex);
  counters().graphs_compiled += 1;
  counters().fused_groups += p->stats_.fused_groups;
  counters().fused_nodes += p->stats_.fused_nodes;
  return p;
}

// What resolve_nodes finds out about each node.
struct Program::NodeFacts {
  std::vector<std::optional<c10::OperatorHandle>> ops;
  std::vector<bool> view;     // a view of its first argument
  std::vector<bool> barrier;  // mutates an argument: no fusion across it
  // Its meta kernel ran and gave each result the program's layout, so an out=
  // call may write them: a CPU out= kernel may assume the layout it would have
  // made (narrow_copy's copies a contiguous result), and one left unchecked at
  // build (no meta kernel) is checked by running the functional op.
  std::vector<bool> natural;
};

void Program::build() {
  const Graph& g = graph_;
  stats_.nodes = static_cast<int64_t>(g.nodes.size());
  where_.assign(g.values.size(), Location{});
  for (size_t i = 0; i < g.inputs.size(); ++i) where_[g.inputs[i]] = {Location::Input, g.inputs[i], static_cast<int>(i)};
  check_geometry();
  const NodeFacts facts = resolve_nodes();
  order_steps(facts);
  stats_.steps = static_cast<int64_t>(steps_.size());
  step_ns_ = std::vector<std::atomic<int64_t>>(steps_.size());
  out_calls_ = std::vector<std::atomic<OutCall>>(steps_.size());
  place_values();
  plan_schedule();
}

// Every value's geometry must be one a tensor can have, and a view must stay
// inside its base's storage. A program is text that may come from a file (a
// saved TorchScript module's lowered form): the kernels trust its geometry, so
// a wrong one would read or write out of bounds.
void Program::check_geometry() {
  const Graph& g = graph_;
  input_reach_.assign(g.inputs.size(), 0);
  input_low_.assign(g.inputs.size(), 0);
  for (size_t v = 0; v < g.values.size(); ++v) {
    const TensorMeta& m = g.values[v].meta;
    bool valid = m.offset >= 0 && m.sizes.size() == m.strides.size();
    for (size_t d = 0; valid && d < m.sizes.size(); ++d) valid = m.sizes[d] >= 0 && m.strides[d] >= 0;
    TORCH_CHECK(valid, "mydev compiler: value %", v, " has the geometry ", m.str(),
                ", which no tensor has (negative sizes, strides or offset, or sizes and strides of different ranks)");
    TORCH_CHECK(fits_in_memory(m), "mydev compiler: value %", v, " has the geometry ", m.str(),
                ", whose elements or bytes of storage do not fit in 64 bits");
  }
}

void Program::check_reach(const Node& n, int out, int base) {
  const Graph& g = graph_;
  const size_t need = g.values[out].meta.storage_bytes();
  if (where_[base].kind == Location::Input) {
    // Counted from the input's first element: the tensor given at run may start elsewhere in its storage
    // than the frontend's example did (aot_autograd's tangents of views are fresh tensors).
    const TensorMeta& input = g.values[base].meta;
    const TensorMeta& view = g.values[out].meta;
    const int64_t start = input.offset * static_cast<int64_t>(c10::elementSize(input.dtype));
    const size_t slot = static_cast<size_t>(where_[base].slot);
    if (view.numel() == 0) return;
    input_reach_[slot] = std::max(input_reach_[slot], static_cast<int64_t>(need) - start);
    input_low_[slot] =
        std::min(input_low_[slot], view.offset * static_cast<int64_t>(c10::elementSize(view.dtype)) - start);
    return;
  }
  TORCH_CHECK(need <= g.values[base].meta.storage_bytes(), "mydev compiler: ", n.op, " (line ", n.line,
              ") gives %", out, " ", g.values[out].meta.str(), ", which reaches ", need,
              " bytes of storage, but its base %", base, " (", g.values[base].meta.str(), ") holds ",
              g.values[base].meta.storage_bytes());
}

// Operators, views and aliases: each node's operator, and the storage each
// value lives in (where_[v].root).
Program::NodeFacts Program::resolve_nodes() {
  const Graph& g = graph_;
  NodeFacts f;
  f.ops.resize(g.nodes.size());
  f.view.assign(g.nodes.size(), false);
  f.barrier.assign(g.nodes.size(), false);
  f.natural.assign(g.nodes.size(), false);
  used_.assign(g.values.size(), false);
  std::function<void(const Arg&)> use = [&](const Arg& a) {
    if (a.value >= 0) used_[a.value] = true;
    for (const Arg& e : a.items) use(e);
  };
  for (const Node& n : g.nodes) {
    for (const Arg& a : n.args) use(a);
  }
  for (int v : g.outputs) used_[v] = true;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    f.ops[i] = resolve(n);
    const c10::FunctionSchema& s = f.ops[i]->schema();
    TORCH_CHECK(n.args.size() == s.arguments().size(), "mydev compiler: ", n.op, " takes ", s.arguments().size(),
                " arguments, the program gives ", n.args.size(), " (line ", n.line, ")");
    for (int out : n.outputs) {
      if (out >= 0) where_[out] = {Location::Held, out, -1};
    }
    const MetaRun meta = run_on_meta(g, n, *f.ops[i]);
    f.natural[i] = meta.ran;
    for (size_t r = 0; r < n.outputs.size() && r < meta.results.size(); ++r) {
      if (n.outputs[r] >= 0 && !has_geometry(meta.results[r], g.values[n.outputs[r]].meta)) f.natural[i] = false;
    }
    // Views and fused ops never run their kernel, so their meta kernel's word is the only check.
    TORCH_CHECK(meta.ran || meta.refusal.empty() || (!is_view(s) && !is_fusible_pointwise(g, n) && !fusible_reduction(g, n)),
                "mydev compiler: ", n.op, " (line ", n.line, ") refuses the arguments the program gives it: ",
                meta.refusal);
    const int first = n.args.empty() ? -1 : n.args[0].value;
    if (is_view(s) && first >= 0 && n.outputs[0] >= 0 && g.values[first].meta.dtype == g.values[n.outputs[0]].meta.dtype &&
        meta.plain_alias(0, 0, -1)) {
      f.view[i] = true;
      where_[n.outputs[0]].root = where_[first].root;
      check_reach(n, n.outputs[0], where_[first].root);
      stats_.views += 1;
      check_results(n, meta, {0});
      continue;
    }
    f.barrier[i] = mutates(s);
    // Returns that alias an argument (split, an in-place op's self) live in that argument's storage.
    std::vector<int> aliased(n.outputs.size(), -1);
    for (size_t r = 0; r < n.outputs.size(); ++r) {
      // The meta kernel's word where it ran: a schema need not say (broadcast_tensors returns views of its
      // list's tensors unannotated, and a value read through one after its source's arena slot was reused
      // read another value).
      const AliasSource src = meta.ran ? meta_alias_source(n, meta, r) : aliased_source(g, n, s, r);
      if (src.value >= 0 && meta.plain_alias(r, static_cast<size_t>(src.argument), src.item)) {
        aliased[r] = src.argument;
        where_[n.outputs[r]].root = where_[src.value].root;
        check_reach(n, n.outputs[r], where_[n.outputs[r]].root);
      }
    }
    check_results(n, meta, aliased);
  }
  // A storage is read if any value in it is (a view of it, or itself).
  read_.assign(g.values.size(), false);
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (used_[v]) read_[root(static_cast<int>(v))] = true;
  }
  return f;
}

// Each node's results must be what its operator makes of the geometry of its
// arguments: the dtype and sizes of every result and, for a result that aliases
// an argument (a view, an in-place op's self), also its strides and offset,
// which say where it reads; a result the program writes must not overlap
// itself. Kernels trust the text's geometry, so a text that disagrees with its
// ops (damaged, or from a faulty frontend) would read or write out of bounds.
// The operator runs on meta tensors; one whose meta kernel fails (none, or
// data-dependent sizes) is checked when it runs instead (execute()). A second
// or later result that nothing uses and the text gives no elements may have
// them: the CPU's native_batch_norm leaves its saved statistics empty outside
// training, where its meta kernel sizes them, so a program written from the
// CPU's geometry (TorchScript's) says [0].
void Program::check_results(const Node& n, const MetaRun& meta, const std::vector<int>& aliased) const {
  const Graph& g = graph_;
  for (size_t r = 0; meta.ran && r < n.outputs.size() && r < meta.results.size(); ++r) {
    const int v = n.outputs[r];
    if (v < 0) continue;
    const TensorMeta& want = g.values[v].meta;
    const at::Tensor& got = meta.results[r];
    const bool aliases = r < aliased.size() && aliased[r] >= 0;
    const bool same = got.scalar_type() == want.dtype &&
                      (got.sizes().vec() == want.sizes || (want.numel() == 0 && !aliases && r > 0 && !used_[v])) &&
                      (!aliases || (got.strides().vec() == want.strides && got.storage_offset() == want.offset));
    TORCH_CHECK(same, "mydev compiler: ", n.op, " (line ", n.line, ") gives %", v, " ",
                meta_of(got).str(),
                " for the arguments the program gives it, but the program says ", want.str());
    TORCH_CHECK(aliases || non_overlapping(want), "mydev compiler: ", n.op, " (line ", n.line, ") writes %", v, " ",
                want.str(), ", whose elements overlap in memory");
  }
}

// The steps: fusion groups and calls, in an order that respects every
// dependency. Nodes are taken in graph order; a fusible pointwise node joins the
// open group when it has the group's shape and reads only the group's results
// or inputs that broadcast to it; anything else closes the group (flush).
class Program::StepOrder {
 public:
  StepOrder(Program& p, const NodeFacts& f) : p_(p), g_(p.graph_), f_(f), users_(g_.values.size()) {
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      for (const Arg& a : g_.nodes[i].args) note_uses(a, static_cast<int>(i));
    }
    graph_outputs_.insert(g_.outputs.begin(), g_.outputs.end());
    any_mutation_ = std::find(f.barrier.begin(), f.barrier.end(), true) != f.barrier.end();
    done_.assign(g_.nodes.size(), false);
  }

  void run() {
    for (size_t idx = 0; idx < g_.nodes.size(); ++idx) {
      const int i = static_cast<int>(idx);
      const Node& n = g_.nodes[i];
      cursor_ = idx;
      if (f_.view[i] || done_[i]) continue;
      if (!f_.barrier[i] && is_fusible_pointwise(g_, n)) {
        if (members_.empty() || !joins_group(n)) {
          flush();
          shape_ = g_.values[n.outputs[0]].meta.sizes;
        }
        members_.push_back(i);
        produced_.insert(n.outputs[0]);
        continue;
      }
      if (!f_.barrier[i] && fusible_reduction(g_, n) && !members_.empty() && produced_.count(n.args[0].value) &&
          g_.values[n.args[0].value].meta.sizes == shape_) {
        members_.push_back(i);
        flush();
        continue;
      }
      if (uses_group(n) || f_.barrier[i]) flush();
      emit_call(i);
    }
    flush();
  }

 private:
  // Uses, for deciding what a fused group must store.
  void note_uses(const Arg& a, int node) {
    if (a.value >= 0) users_[a.value].push_back(node);
    for (const Arg& e : a.items) note_uses(e, node);
  }

  bool reads_group(const Arg& x) const {
    if (x.value >= 0 && produced_.count(p_.root(x.value))) return true;
    return std::any_of(x.items.begin(), x.items.end(), [&](const Arg& e) { return reads_group(e); });
  }
  bool uses_group(const Node& n) const {
    return std::any_of(n.args.begin(), n.args.end(), [&](const Arg& a) { return reads_group(a); });
  }

  bool joins_group(const Node& n) const {
    if (g_.values[n.outputs[0]].meta.sizes != shape_) return false;
    for (const Arg& a : n.args) {
      if (a.value < 0 || produced_.count(a.value)) continue;
      if (produced_.count(p_.root(a.value))) return false;  // a view of the group's own result
      if (!broadcasts_to(g_.values[a.value].meta.sizes, shape_)) return false;
    }
    return true;
  }

  void emit_call(int i) {
    const Node& n = g_.nodes[i];
    const c10::FunctionSchema& s = f_.ops[i]->schema();
    Step step;
    step.kind = Step::Call;
    step.node = i;
    step.label = label_of(n);
    step.outputs = n.outputs;
    step.op = f_.ops[i];
    for (size_t k = 0; k < n.args.size(); ++k) {
      const Arg& a = n.args[k];
      const c10::Argument& formal = s.arguments()[k];
      if (a.value >= 0) {
        step.slots.push_back({k, {a.value}, Step::Slot::Tensor});
        step.stack.emplace_back();
      } else if (a.is_list && has_tensor(a)) {
        std::vector<int> vs;
        bool optional = false;
        for (const Arg& e : a.items) {
          vs.push_back(e.value);
          optional = optional || e.value < 0;
        }
        const std::string type = formal.type()->str();
        optional = optional || type.find("Tensor?") != std::string::npos;
        step.slots.push_back({k, vs, optional ? Step::Slot::OptionalTensorList : Step::Slot::TensorList});
        step.stack.emplace_back();
      } else {
        if (is_optional_generator(formal) && a.constant.isNone()) step.generators.push_back(k);
        step.stack.push_back(boxed_constant(a, formal.type()));
      }
    }
    const bool all_used = std::find(n.outputs.begin(), n.outputs.end(), -1) == n.outputs.end();
    // clone's out= kernel (a generated one) clones and then copies: two passes and an allocation, where a copy
    // into the planned buffer is one pass. In any layout the program gives the result: copy_ takes strides.
    if (n.op == "aten::clone" && all_used && n.outputs.size() == 1 && step.slots.size() == 1 &&
        g_.values[n.outputs[0]].meta.dtype == g_.values[step.slots[0].values[0]].meta.dtype) {
      step.kind = Step::Copy;
      p_.stats_.calls += 1;
      p_.steps_.push_back(std::move(step));
      return;
    }
    // relu has no out= kernel of its own (its generated out= form allocates and copies, as the functional op
    // does); the CPU computes it as clamp_min(x, 0), whose out= kernel writes the planned buffer.
    if (n.op == "aten::relu" && n.outputs.size() == 1 && n.outputs[0] >= 0 &&
        g_.values[n.outputs[0]].meta.dtype != c10::ScalarType::Bool) {
      static const c10::OperatorHandle clamp_min = c10::Dispatcher::singleton().findSchemaOrThrow("aten::clamp_min", "");
      step.op = clamp_min;
      step.stack.emplace_back(c10::Scalar(0));
    }
    // Into outputs of another layout than contiguous, only the functional op: a CPU out= kernel may write its
    // result contiguously whatever the output's strides (_log_softmax_backward_data's does), and a meta kernel
    // written in Python may give the layout of an argument where the CPU kernel's own gives a contiguous one.
    const bool contiguous = std::all_of(n.outputs.begin(), n.outputs.end(),
                                        [&](int v) { return v < 0 || g_.values[v].meta.is_contiguous(); });
    if (auto out = out_overload(*step.op); out && !f_.barrier[i] && all_used && f_.natural[i] && contiguous) {
      step.functional = step.op;
      step.op = out;
      step.use_out = true;
      p_.stats_.out_calls += 1;
      if (auto gemm = gemm_of(g_, n, step)) {
        step.kind = Step::Gemm;
        step.gemm = *gemm;
        p_.stats_.gemms += 1;
      }
    }
    p_.stats_.calls += 1;
    p_.steps_.push_back(std::move(step));
  }

  // A reduction of the group's result that comes later in the graph (after a
  // reader of that result that ends the group: a bias gradient's sum after the
  // weight gradient's mm) joins the group now; it depends on nothing else, so
  // computing it early is safe in a graph without mutation.
  void pull_reduction() {
    if (any_mutation_ || members_.empty() || fusible_reduction(g_, g_.nodes[members_.back()])) return;
    for (size_t j = cursor_; j < g_.nodes.size(); ++j) {
      const Node& r = g_.nodes[j];
      if (done_[j] || f_.view[j] || !fusible_reduction(g_, r)) continue;
      const int in = r.args[0].value;
      if (produced_.count(in) && g_.values[in].meta.sizes == shape_) {
        members_.push_back(static_cast<int>(j));
        done_[j] = true;
        return;
      }
    }
  }

  // Closes the open group: one fused kernel, or its members as calls.
  void flush() {
    if (members_.empty()) return;
    pull_reduction();
    // A lone op is a fused kernel only while it is small: there the kernel's
    // flat pass beats the ATen call's setup; on large tensors ATen's own
    // vectorized loops win.
    if (members_.size() == 1 && g_.values[g_.nodes[members_[0]].outputs[0]].meta.numel() >= kFlatMaxElements) {
      emit_call(members_[0]);
    } else if (!emit_fused()) {
      for (int m : members_) emit_call(m);
    }
    members_.clear();
    produced_.clear();
  }

  // The group as one fused kernel, or false if its kernel needs more registers than a kernel has.
  bool emit_fused() {
    const std::unordered_set<int> in_group(members_.begin(), members_.end());
    std::vector<int> stored;
    for (int m : members_) {
      const int v = g_.nodes[m].outputs[0];
      bool outside = graph_outputs_.count(v) > 0 || m == members_.back();
      for (int u : users_[v]) outside = outside || !in_group.count(u);
      if (outside) stored.push_back(v);
    }
    Step step;
    step.kind = Step::Fused;
    step.node = members_.back();
    step.label = members_.size() == 1 ? "fused " + label_of(g_.nodes[members_[0]])
                                      : "fused group of " + std::to_string(members_.size()) + " ops ending with " +
                                            label_of(g_.nodes[members_.back()]);
    step.kernel = build_kernel(g_, members_, stored, step.inputs);
    if (step.kernel.num_registers > kMaxRegisters) return false;
    // A fused reduction's result is stored last (ElementwiseKernel::run).
    if (step.kernel.reduce != ReduceKind::None) {
      const int r = g_.nodes[members_.back()].outputs[0];
      stored.erase(std::remove(stored.begin(), stored.end(), r), stored.end());
      stored.push_back(r);
    }
    step.outputs = stored;
    p_.stats_.fused_groups += 1;
    p_.stats_.fused_nodes += static_cast<int64_t>(members_.size());
    p_.steps_.push_back(std::move(step));
    return true;
  }

  Program& p_;
  const Graph& g_;
  const NodeFacts& f_;
  std::vector<std::vector<int>> users_;
  std::unordered_set<int> graph_outputs_;
  bool any_mutation_ = false;
  std::vector<bool> done_;
  size_t cursor_ = 0;
  // The open group: its nodes, the values they produce, and its shape.
  std::vector<int> members_;
  std::unordered_set<int> produced_;
  std::vector<int64_t> shape_;
};

void Program::order_steps(const NodeFacts& facts) {
  StepOrder(*this, facts).run();
}

// Where each value lives: graph outputs' storages are returned buffers, other
// step results that an out= kernel or a fused kernel writes are planned in the
// arena, the rest are held as the call returned them.
void Program::place_values() {
  const Graph& g = graph_;
  const size_t nv = g.values.size();
  std::unordered_set<int> escaping;
  for (int o : g.outputs) {
    if (where_[root(o)].kind != Location::Input) escaping.insert(root(o));
  }
  std::vector<int> last_use(nv, -1), first_def(nv, -1);
  for (size_t si = 0; si < steps_.size(); ++si) {
    const Step& st = steps_[si];
    auto use = [&](int v) {
      if (v >= 0) last_use[root(v)] = static_cast<int>(si);
    };
    for (const Step::Slot& slot : st.slots) {
      for (int v : slot.values) use(v);
    }
    for (int v : st.inputs) use(v);
    for (int v : st.outputs) {
      if (v < 0) continue;
      if (first_def[v] < 0) first_def[v] = static_cast<int>(si);
      use(v);
    }
  }
  std::vector<BufferLife> lives;
  for (const Step& st : steps_) {
    const bool written_in_place = st.kind != Step::Call || st.use_out;
    for (int v : st.outputs) {
      if (v < 0 || root(v) != v) continue;  // unused, or aliases an argument
      if (escaping.count(v)) {
        where_[v] = {Location::Output, v, static_cast<int>(output_buffers_.size())};
        output_buffers_.push_back(g.values[v].meta);
      } else if (written_in_place) {
        where_[v] = {Location::Arena, v, static_cast<int>(arena_buffers_.size())};
        arena_buffers_.push_back(v);
        lives.push_back({g.values[v].meta.storage_bytes(), first_def[v], std::max(last_use[v], first_def[v])});
      }
    }
  }
  plan_ = plan_memory(lives);
  stats_.arena_bytes = plan_.arena_bytes;
  stats_.naive_bytes = plan_.naive_bytes;
  // Held results are dropped after their storage's last reader.
  for (size_t v = 0; v < nv; ++v) {
    if (where_[v].kind != Location::Held || root(v) < 0 || escaping.count(root(v))) continue;
    const int last = last_use[root(v)];
    if (last >= 0) steps_[last].release.push_back(static_cast<int>(v));
  }
}

std::vector<Touch> Program::touches(const Step& st) const {
  std::vector<Touch> out;
  auto touch = [&](int v, bool written) {
    if (v < 0) return;
    const int r = root(v);
    const Location& loc = where_[r];
    if (loc.kind == Location::Input) {
      out.push_back({Touch::Inputs, 0, 0, 0, written});
    } else if (loc.kind == Location::Output) {
      out.push_back({Touch::Output, loc.slot, 0, 0, written});
    } else if (loc.kind == Location::Arena) {
      const size_t begin = plan_.offsets[loc.slot];
      out.push_back({Touch::Arena, 0, begin, begin + graph_.values[r].meta.storage_bytes(), written});
    } else {
      out.push_back({Touch::Held, r, 0, 0, written});
    }
  };
  for (const Step::Slot& slot : st.slots) {
    bool written = false;  // an argument the op mutates (batch_norm's running statistics are not annotated)
    if (st.op && slot.index < st.op->schema().arguments().size()) {
      const c10::Argument& a = st.op->schema().arguments()[slot.index];
      written = (a.alias_info() != nullptr && a.alias_info()->isWrite()) || writes_unannotated(a);
    }
    for (int v : slot.values) touch(v, written);
  }
  for (int v : st.inputs) touch(v, false);
  for (int v : st.outputs) touch(v, true);
  return out;
}

// Whether, and in how many parts, a step runs side by side (Step::Split): each part must have work enough
// to pay for a hand-over between threads (a few microseconds).
void Program::choose_parts(Step& st) const {
  constexpr int64_t kMinPooledPerPart = kMinPooledPerBlock;  // a pooling's input elements, a convolution's gradient's
  st.split = Step::Whole;
  st.parts = 1;
  if (st.kind != Step::Call || st.outputs.empty() || st.outputs[0] < 0) return;
  for (const Step::Slot& slot : st.slots) {
    if (slot.kind != Step::Slot::Tensor || slot.values[0] < 0) return;
  }
  const std::string& name = (st.use_out ? st.functional : st.op)->schema().name();
  const TensorMeta& out = graph_.values[st.outputs[0]].meta;
  int64_t parts = 1;
  // Every tensor argument contiguous with the output's sizes, as the output: an elementwise call to cut by elements.
  auto dense_like_out = [&] {
    return out.is_contiguous() && std::all_of(st.slots.begin(), st.slots.end(), [&](const Step::Slot& slot) {
             const TensorMeta& t = graph_.values[slot.values[0]].meta;
             return t.sizes == out.sizes && t.is_contiguous();
           });
  };
  // Attention, forward and backward: every tensor argument and result has the batch first.
  auto batched = [&](int64_t min_elements) {
    const int64_t m = out.sizes.empty() ? 0 : out.sizes[0];
    if (m < 2 || st.slots.empty() || graph_.values[st.slots[0].values[0]].meta.numel() < min_elements) return false;
    for (const Step::Slot& slot : st.slots) {
      // (A 2-D attention mask, (queries, keys), broadcasts over the samples, whatever its first size.)
      const TensorMeta& t = graph_.values[slot.values[0]].meta;
      if (t.sizes.size() < 3 || t.sizes[0] != m) return false;
    }
    for (int v : st.outputs) {
      if (v >= 0 && (graph_.values[v].meta.sizes.empty() || graph_.values[v].meta.sizes[0] != m ||
                     graph_.values[v].meta.offset != 0)) {
        return false;
      }
    }
    return true;
  };
  if (!st.use_out && (name == "aten::_scaled_dot_product_flash_attention_for_cpu" ||
                      name == "aten::_scaled_dot_product_flash_attention_for_cpu_backward")) {
    if (batched(kMinPooledPerPart / 4)) {
      st.split = Step::Samples;
      parts = out.sizes[0];
    }
  } else if (!st.use_out && name == "aten::convolution" && st.outputs.size() == 1 && st.slots.size() >= 2 &&
             st.slots[0].index == 0 && st.stack.size() > kConvolutionTransposed && st.stack[kConvolutionTransposed].isBool()) {
    // By samples of its input, when batched (an unbatched input's first dimension is its channels).
    const TensorMeta& input = graph_.values[st.slots[0].values[0]].meta;
    const TensorMeta& weight = graph_.values[st.slots[1].values[0]].meta;
    if (input.sizes.size() == weight.sizes.size() && !out.sizes.empty() && out.sizes[0] == input.sizes[0] &&
        out.offset == 0 && !weight.sizes.empty() && weight.sizes[0] > 0) {
      const int64_t per_element = weight.numel() / weight.sizes[0];
      const bool transposed = st.stack[kConvolutionTransposed].toBool();
      st.split = Step::InputSamples;
      parts = block_count(input.sizes[0], 1, (transposed ? input.numel() : out.numel()) * per_element,
                          kMinMultiplyAddsPerBlock);
    }
  } else if (!st.use_out) {
    // Both the input's gradient and the weight's, from one call: two calls of one each.
    if (name == "aten::convolution_backward" && st.outputs.size() == 3 && st.stack.size() > kConvolutionBackwardMask &&
        st.stack[kConvolutionBackwardMask].isBoolList() && (st.outputs[1] >= 0 || st.outputs[2] >= 0) &&
        graph_.values[st.slots[0].values[0]].meta.numel() >= kMinPooledPerPart) {
      st.split = Step::Grads;
      parts = 2;
    } else if (name == "my_device::gelu_backward" && st.outputs.size() == 1 && dense_like_out()) {
      // (aten::gelu_backward as autograd calls it on mydev: GeluAutogradOverride.cpp)
      st.split = Step::Elements;
      parts = block_count(out.numel(), kMinElementwisePerBlock, out.numel(), kMinElementwisePerBlock);
    }
  } else if (name == "aten::max_pool2d_with_indices" && st.outputs.size() == 2 && st.outputs[1] >= 0 &&
             st.slots.size() == 1 && out.sizes.size() == 4 && out.is_contiguous() &&
             graph_.values[st.outputs[1]].meta.is_contiguous()) {
    st.split = Step::Batch;
    parts = std::min(out.sizes[0], graph_.values[st.slots[0].values[0]].meta.numel() / kMinPooledPerPart);
  } else if ((name == "aten::mm" && st.slots.size() == 2) ||
             (name == "aten::addmm" && st.slots.size() == 3 && st.stack.size() >= 5)) {
    const TensorMeta& mat1 = graph_.values[st.slots[st.slots.size() - 2].values[0]].meta;
    if (st.outputs.size() == 1 && out.sizes.size() == 2 && mat1.sizes.size() == 2 && out.is_contiguous()) {
      st.split = Step::Rows;
      parts = product_row_parts(out.sizes[0], out.sizes[1], mat1.sizes[1]);
    }
  } else if (st.use_out && st.node >= 0 && st.outputs.size() == 1 && is_fusible_pointwise(graph_, graph_.nodes[st.node]) &&
             dense_like_out()) {
    st.split = Step::Elements;
    parts = block_count(out.numel(), kMinElementwisePerBlock, out.numel(), kMinElementwisePerBlock);
  }
  st.parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(parts, kMaxStepParts)));
  if (st.parts == 1) st.split = Step::Whole;
}

void Program::plan_schedule() {
  std::vector<std::vector<Touch>> touched;
  std::vector<bool> draws;  // random steps keep their order: they share the generators
  size_t next_generator = 0;
  std::vector<int> parts;
  for (Step& st : steps_) {
    st.first_generator = next_generator;
    next_generator += st.generators.size();
    touched.push_back(touches(st));
    draws.push_back(!st.generators.empty());
    choose_parts(st);
    parts.push_back(st.parts);
  }
  schedule_ = StepSchedule::plan(touched, draws, parts);
  if (!schedule_.has_parallel_steps()) return;
  // Side by side, a held result is dropped once every step touching it ran, not at its last reader in
  // step order.
  const size_t nv = graph_.values.size();
  released_with_.assign(nv, {});
  held_users_.assign(nv, 0);
  for (const Step& st : steps_) {
    for (int v : st.release) released_with_[root(v)].push_back(v);
  }
  for (size_t si = 0; si < steps_.size(); ++si) {
    std::vector<int>& held = steps_[si].held;
    for (const Touch& t : touched[si]) {
      const int r = static_cast<int>(t.id);
      if (t.kind != Touch::Held || released_with_[r].empty()) continue;
      if (std::find(held.begin(), held.end(), r) == held.end()) held.push_back(r);
    }
    for (int r : held) ++held_users_[r];
  }
  const SideBySide asked = side_by_side_asked();
  parallel_.store(asked == SideBySide::Never    ? Parallel::No
                  : asked == SideBySide::Always ? Parallel::Yes
                                                : Parallel::Unknown);
}

std::vector<at::Tensor> Program::run(const std::vector<at::Tensor>& inputs, c10::DeviceIndex device) {
  const Graph& g = graph_;
  TORCH_CHECK(inputs.size() == g.inputs.size(), "mydev program '", g.name, "' takes ", g.inputs.size(),
              " inputs, got ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    const TensorMeta& m = g.values[g.inputs[i]].meta;
    // A 0-dim CPU tensor is a scalar argument, as in eager mixed-device
    // arithmetic (an optimizer's step count): the launch copies its value.
    const bool host_scalar = t.defined() && t.device().is_cpu() && t.dim() == 0;
    TORCH_CHECK(t.defined() && (t.device().type() == kMyDev || host_scalar), "mydev program '", g.name, "': input ", i,
                " must be a mydev tensor or a 0-dim CPU tensor, got ", t.defined() ? t.device().str() : "None");
    // The queued task reads the bytes with the program's geometry, which has no lazy negation.
    TORCH_CHECK(!t.is_neg() && !t.is_conj(), "mydev program '", g.name, "': input ", i,
                " has a lazy negation or conjugation bit; pass it through resolve_neg()/resolve_conj() first");
    if (!host_scalar) {
      // The kernels read the input's bytes as its geometry says (an efficient zero tensor has none).
      const size_t extent = meta_of(t).storage_bytes();
      TORCH_CHECK(!t._is_zerotensor() && t.storage().nbytes() >= extent, "mydev program '", g.name, "': input ", i,
                  " has ", t.storage().nbytes(), " bytes of storage, fewer than its own geometry reaches (", extent,
                  ")");
      const int64_t start = t.storage_offset() * static_cast<int64_t>(t.element_size());
      TORCH_CHECK(start + input_low_[i] >= 0 && start + input_reach_[i] <= static_cast<int64_t>(t.storage().nbytes()),
                  "mydev program '", g.name, "': input ", i, " has ", t.storage().nbytes(),
                  " bytes of storage, but the program's views of it reach ", start + input_reach_[i],
                  start + input_low_[i] < 0 ? " and start before it" : "");
      if (device < 0) device = t.device().index();
      TORCH_CHECK(t.device().index() == device,
                  "Expected all tensors to be on the same device, but found at least two devices, ",
                  c10::Device(kMyDev, device), " and ", t.device(), "!");
    }
    if (t.scalar_type() != m.dtype || t.sizes() != c10::IntArrayRef(m.sizes) || !same_strides(t, m)) {
      // Name the op that reads the input first, with the frontend's source location.
      std::string reader;
      for (const Node& n : g.nodes) {
        bool reads = false;
        for (const Arg& a : n.args) reads = reads || a.value == g.inputs[i];
        if (reads) {
          reader = ", read by " + label_of(n);
          break;
        }
      }
      TORCH_CHECK(false, "mydev program '", g.name, "': input ", i, " is ", t.scalar_type(), t.sizes(),
                  " with strides ", t.strides(), ", compiled for ", m.str(), reader);
    }
  }
  if (device < 0) device = current_device();
  const auto options = at::TensorOptions().device(kMyDev, device);
  KernelArgs args(device);
  std::vector<at::Tensor> buffers;
  for (const TensorMeta& m : output_buffers_) {
    if (m.offset == 0) {
      buffers.push_back(empty_device(m.sizes, m.strides, options.dtype(m.dtype)));
    } else {
      const int64_t elements = static_cast<int64_t>(m.storage_bytes() / c10::elementSize(m.dtype));
      buffers.push_back(empty_device({elements}, {}, options.dtype(m.dtype)).as_strided(m.sizes, m.strides, m.offset));
    }
  }
  // (An arena of no bytes still holds its buffers: empty tensors, which the
  // steps writing them must be given.)
  const at::Tensor arena = arena_buffers_.empty() ? at::Tensor() : arena_for(device);
  std::vector<at::Tensor> results;
  results.reserve(g.outputs.size());
  for (int o : g.outputs) {
    const Location& loc = where_[where_[o].root];
    const at::Tensor& base = loc.kind == Location::Input ? inputs[loc.slot] : buffers[loc.slot];
    const TensorMeta& m = g.values[o].meta;
    const TensorMeta& rm = g.values[loc.root].meta;
    if (o == loc.root && (loc.kind != Location::Input || (m.sizes == rm.sizes && m.strides == rm.strides))) {
      results.push_back(base);
    } else if (m.dtype == rm.dtype) {
      results.push_back(base.as_strided(m.sizes, m.strides, view_offset(base, m, rm)));
    } else {
      results.push_back(alias(base, m, view_offset(base, m, rm)));
    }
  }
  std::vector<Operand> operands;
  operands.reserve(inputs.size() + buffers.size() + 1);
  auto keep = [&](const at::Tensor& t) {
    Operand o;
    if (t.device().is_cpu()) {
      o.host = t.clone();
      return o;
    }
    const c10::Storage& storage = t.storage();
    o.hold = args.keep(storage);
    o.base = storage.mutable_data();
    o.nbytes = storage.nbytes();
    o.offset = t.storage_offset();
    return o;
  };
  for (const at::Tensor& t : inputs) operands.push_back(keep(t));
  for (const at::Tensor& t : buffers) operands.push_back(keep(t));
  if (arena.defined()) operands.push_back(keep(arena));
  std::vector<c10::IValue> generators;
  for (const Step& st : steps_) {
    for (size_t k : st.generators) {
      generators.push_back(host_generator(c10::IValue(), st.op->schema().arguments()[k], device));
    }
  }
  {
    std::lock_guard<std::mutex> lock(g_counters_mutex);
    counters().launches += 1;
    counters().ops_launched += stats_.nodes;
  }
  launch_async(device, g.name.c_str(),
               [self = shared_from_this(), device, ops = std::move(operands), gens = std::move(generators)]() mutable {
                 self->execute(device, ops, std::move(gens));
               });
  return results;
}

at::Tensor Program::arena_for(c10::DeviceIndex device) {
  const c10::Stream stream = current_stream(device);
  std::lock_guard<std::mutex> lock(arenas_mutex_);
  for (const auto& [s, arena] : arenas_) {
    if (s == stream) return arena;
  }
  const auto options = at::TensorOptions().device(kMyDev, device).dtype(at::kByte);
  at::Tensor arena = empty_device({static_cast<int64_t>(plan_.arena_bytes)}, {}, options);
  arenas_.emplace_back(stream, arena);
  return arena;
}

void Program::execute(c10::DeviceIndex device, const std::vector<Operand>& operands,
                      std::vector<c10::IValue> generators) const {
  const Graph& g = graph_;
  // Routes the CPU allocations of calls without an out= overload to device memory.
  HostCall call(device);
  std::vector<at::Tensor> values(g.values.size());
  HostViews host_view(operands.size());
  const size_t n_in = g.inputs.size(), n_out = output_buffers_.size();
  for (size_t i = 0; i < n_in; ++i) values[g.inputs[i]] = host_view(operands[i], g.values[g.inputs[i]].meta);
  at::Tensor host_arena;
  if (operands.size() > n_in + n_out) {
    TensorMeta bytes{c10::ScalarType::Byte, {static_cast<int64_t>(plan_.arena_bytes)}, {1}, 0};
    host_arena = host_view(operands[n_in + n_out], bytes);
  }
  for (size_t v = 0; v < where_.size(); ++v) {
    const Location& loc = where_[v];
    if (loc.root != static_cast<int>(v)) continue;
    if (loc.kind == Location::Output) {
      values[v] = host_view(operands[n_in + loc.slot], output_buffers_[loc.slot]);
    } else if (loc.kind == Location::Arena) {
      values[v] = in_arena(host_arena, plan_.offsets[loc.slot], g.values[v].meta);
    }
  }
  // Side by side, steps create views of values (value()) and drop held results from several threads.
  const Parallel parallel = parallel_.load(std::memory_order_relaxed);
  const bool deciding = parallel == Parallel::Unknown || parallel == Parallel::Trial;
  const int64_t run_index = deciding ? runs_.fetch_add(1, std::memory_order_relaxed) : -1;
  // While deciding, the two ways take turns, so that a change in the machine's load meets both.
  const bool side_by_side = parallel == Parallel::Yes || (parallel == Parallel::Trial && run_index % 2 == 0);
  std::mutex values_mutex;
  // In order, a step in parts runs them as blocks for whichever unit is free (run_blocks), as eager kernels
  // do; not in the run that times each step whole for the side-by-side decision.
  const bool blocks_in_order = !side_by_side && !timed_run(parallel, run_index) && blocks_split();
  std::vector<char> split(steps_.size());  // decided once a run, for all parts alike
  bool any_split = false;
  for (size_t si = 0; si < split.size(); ++si) {
    const Step& st = steps_[si];
    split[si] = (side_by_side || blocks_in_order) && st.parts > 1 &&
                (!st.use_out || out_calls_[si].load(std::memory_order_relaxed) == OutCall::Confirmed);
    any_split = any_split || split[si];
  }
  // Steps run on several threads: side by side, or in order in parts.
  const bool shared = side_by_side || any_split;
  auto value = [&](int v) -> const at::Tensor& {
    std::unique_lock<std::mutex> lock(values_mutex, std::defer_lock);
    if (shared) lock.lock();
    at::Tensor& t = values[v];
    if (!t.defined()) {
      const int r = where_[v].root;
      const at::Tensor& base = values[r];
      TORCH_INTERNAL_ASSERT(base.defined(), "mydev program: value %", v, " read before its storage was written");
      t = alias(base, g.values[v].meta, view_offset(base, g.values[v].meta, g.values[r].meta));
    }
    return t;
  };
  // An out= kernel that resizes its output on the way (mse_loss's meta sizes it
  // as the elementwise loss, then as the reduction) cannot write into planned
  // memory, which is not resizable: its step runs the functional op from then
  // on. The first try's warnings wait for its outcome: a refused try's
  // warning about resizing an output concerns the plan, not the caller.
  // An out= kernel may shrink an output without reallocating (the CPU's _embedding_bag leaves offset2bag
  // empty): the planned buffer then holds no values, which is fine only while nothing reads it.
  // One may also lay an output out anew (max_unpool2d's takes its input's memory format): its values are
  // then moved into the program's layout, and the step runs the functional op from then on. True if so.
  auto refuse_if_read = [&](int v, c10::IntArrayRef got) {
    TORCH_CHECK(!read_[root(v)], "left its result %", v, " ", got, " (its CPU kernel's fast path does not compute "
                "it), where the program reads ", g.values[v].meta.str());
  };
  auto settle_outputs = [&](const Step& st) {
    bool restrided = false;
    for (int v : st.outputs) {
      if (v < 0) continue;
      const TensorMeta& m = g.values[v].meta;
      if (values[v].sizes().vec() != m.sizes) {
        refuse_if_read(v, values[v].sizes());
      } else if (!has_geometry(values[v], m)) {
        const at::Tensor written = values[v].clone();
        values[v].unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes, m.strides, m.offset);
        values[v].copy_(written);
        restrided = true;
      }
    }
    return restrided;
  };
  auto call_out = [&](size_t si, const Step& st, std::vector<c10::IValue>& stack) {
    std::atomic<OutCall>& state = out_calls_[si];
    const OutCall known = state.load(std::memory_order_relaxed);
    if (known == OutCall::Refused) return false;
    for (int v : st.outputs) stack.emplace_back(value(v));
    if (known == OutCall::Confirmed) {
      st.op->callBoxed(stack);
      if (settle_outputs(st)) state.store(OutCall::Refused, std::memory_order_relaxed);
      return true;
    }
    HeldWarnings held;
    try {
      c10::WarningUtils::WarningHandlerGuard guard(&held);
      st.op->callBoxed(stack);
    } catch (const c10::Error&) {
      // The first try of an out= call that raises is retried as the functional op, which raises the op's
      // own error if there is one: out= kernels refuse what the functional op takes (a planned output that
      // must grow: mse_loss's; linalg_qr's asserts on an empty input's planned Q). The planned tensors get
      // the program's geometry back (resize_ sets the new sizes before it finds the storage not resizable),
      // or the functional op's result would be copied (broadcast) into the wrong one.
      for (int v : st.outputs) {
        if (v < 0) continue;
        const TensorMeta& m = g.values[v].meta;
        values[v].unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes, m.strides, values[v].storage_offset());
      }
      state.store(OutCall::Refused, std::memory_order_relaxed);
      return false;
    }
    held.replay();
    state.store(settle_outputs(st) ? OutCall::Refused : OutCall::Confirmed, std::memory_order_relaxed);
    return true;
  };
  const bool profiling = profiling_.load(std::memory_order_relaxed);
  const bool timed = timed_run(parallel, run_index);
  const auto run_start = deciding ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  std::vector<int64_t> took(timed ? steps_.size() : 0);
  auto arguments = [&](const Step& st) {
    std::vector<c10::IValue> stack = st.stack;
    for (const Step::Slot& slot : st.slots) {
      if (slot.kind == Step::Slot::Tensor) {
        stack[slot.index] = value(slot.values[0]);
      } else if (slot.kind == Step::Slot::TensorList) {
        c10::List<at::Tensor> list;
        for (int v : slot.values) list.push_back(value(v));
        stack[slot.index] = list;
      } else {
        c10::List<std::optional<at::Tensor>> list;
        for (int v : slot.values) list.push_back(v < 0 ? std::nullopt : std::optional<at::Tensor>(value(v)));
        stack[slot.index] = list;
      }
    }
    for (size_t k = 0; k < st.generators.size(); ++k) stack[st.generators[k]] = generators[st.first_generator + k];
    return stack;
  };
  // Puts result k of a call (not through out=) where the program keeps value st.outputs[k].
  auto place = [&](const Step& st, size_t k, const at::Tensor& result) {
    const int v = st.outputs[k];
    if (v < 0) return;
    // What check_results could not check at build (ops without a meta kernel). A later result
    // the CPU kernel leaves empty where the graph (its meta kernel) sized it is fine while nothing
    // reads it (native_batch_norm's saved statistics outside training); one that is read
    // (_embedding_bag's offset2bag, for its backward) has no values to give.
    const TensorMeta& want = graph_.values[v].meta;
    const bool empty = k > 0 && (result.numel() == 0 || want.numel() == 0);
    TORCH_CHECK(result.scalar_type() == want.dtype && (result.sizes().vec() == want.sizes || empty),
                "gave a ", result.scalar_type(), result.sizes(), " result where the program says ",
                want.str());
    if (result.numel() == 0 && want.numel() != 0) refuse_if_read(v, result.sizes());
    if (where_[v].kind == Location::Output && where_[v].root == v) {
      if (want.numel() != 0) values[v].copy_(result);
    } else if (where_[v].root == v && result.sizes().vec() == want.sizes && !has_geometry(result, want)) {
      // Views of the value read it with the program's geometry, which the CPU kernel need not
      // have given its result (its scaled_dot_product_attention lays its output out [B, T, H, D]).
      values[v] = with_geometry(result, want);
    } else {
      values[v] = result;
    }
  };
  // Value v, created where the program does not give it, for parts to write their pieces into (the first part
  // to finish creates it).
  auto whole_value = [&](int v) {
    std::lock_guard<std::mutex> lock(values_mutex);
    if (!values[v].defined()) {
      const TensorMeta& want = graph_.values[v].meta;
      values[v] = at::empty_strided(want.sizes, want.strides, at::TensorOptions().dtype(want.dtype));
    }
    return values[v];
  };
  // Part `part` of a step in parts (Step::Split): side by side its parts run at once, in order as blocks; while an
  // out= step's call is not confirmed to write its planned outputs, and in the timed run, part 0 runs the whole step.
  auto run_part = [&](size_t si, int part) {
    const Step& st = steps_[si];
    if (st.split == Step::Grads) {
      // convolution_backward: part 0 the input's gradient, part 1 the weight's and the bias's.
      std::vector<c10::IValue> stack = arguments(st);
      const c10::List<bool> mask = stack[kConvolutionBackwardMask].toBoolList();
      stack[kConvolutionBackwardMask] = c10::List<bool>({part == 0 && mask[0], part == 1 && mask[1], part == 1 && mask[2]});
      st.op->callBoxed(stack);
      const std::vector<at::Tensor> results = tensors_of(stack);
      for (size_t k = part == 0 ? 0 : 1; k < (part == 0 ? 1 : 3); ++k) place(st, k, results[k]);
      return;
    }
    if (st.split == Step::Samples || st.split == Step::InputSamples) {
      // Each part calls the op on its samples of every tensor argument (or of the first), and copies its results
      // into the program's values, which the first part to finish creates where the program does not give them.
      std::vector<c10::IValue> stack = arguments(st);
      const int64_t m = graph_.values[st.outputs[0]].meta.sizes[0];
      int64_t lo = m * part / st.parts, rows = m * (part + 1) / st.parts - lo;
      // A convolution whose blocks would take another algorithm than the whole batch runs whole, in part 0.
      if (st.split == Step::InputSamples &&
          convolution_sample_parts(stack[0].toTensor(), stack[1].toTensor(), stack[2].toOptional<at::Tensor>(),
                                   stack[3].toIntVector(), stack[4].toIntVector(), stack[5].toIntVector(),
                                   stack[kConvolutionTransposed].toBool(), stack[7].toIntVector(), stack[8].toInt(),
                                   graph_.values[st.outputs[0]].meta.numel()) < st.parts) {
        if (part != 0) return;
        lo = 0;
        rows = m;
      }
      for (const Step::Slot& slot : st.slots) {
        stack[slot.index] = stack[slot.index].toTensor().narrow(0, lo, rows);
        if (st.split == Step::InputSamples) break;
      }
      st.op->callBoxed(stack);
      const std::vector<at::Tensor> results = tensors_of(stack);
      for (size_t k = 0; k < st.outputs.size(); ++k) {
        if (st.outputs[k] >= 0) whole_value(st.outputs[k]).narrow(0, lo, rows).copy_(results[k]);
      }
      return;
    }
    if (st.split == Step::Elements) {
      // Parts start at multiples of a vector loop's step, so that every element goes through the code it does
      // in one call.
      std::vector<c10::IValue> stack = arguments(st);
      const int64_t n = graph_.values[st.outputs[0]].meta.numel();
      auto start = [&](int p) { return block_start(n, p, st.parts, kVectorLoopStep); };
      const int64_t lo = start(part), count = start(part + 1) - lo;
      for (const Step::Slot& slot : st.slots) stack[slot.index] = stack[slot.index].toTensor().view(-1).narrow(0, lo, count);
      if (st.use_out) {
        stack.emplace_back(value(st.outputs[0]).view(-1).narrow(0, lo, count));
        st.op->callBoxed(stack);
      } else {
        st.op->callBoxed(stack);
        whole_value(st.outputs[0]).view(-1).narrow(0, lo, count).copy_(tensors_of(stack)[0]);
      }
      return;
    }
    // By the first dimension of the outputs: rows of a product, samples of a pooling.
    const at::Tensor& out = value(st.outputs[0]);
    const int64_t m = out.size(0), lo = m * part / st.parts, rows = m * (part + 1) / st.parts - lo;
    if (st.split == Step::Batch) {
      at::Tensor indices = value(st.outputs[1]).narrow(0, lo, rows);
      at::Tensor o = out.narrow(0, lo, rows);
      at::max_pool2d_with_indices_out(o, indices, value(st.slots[0].values[0]).narrow(0, lo, rows),
                                      st.stack[1].toIntVector(), st.stack[2].toIntVector(), st.stack[3].toIntVector(),
                                      st.stack[4].toIntVector(), st.stack[5].toBool());
      return;
    }
    const at::Tensor& mat2 = value(st.slots[st.slots.size() - 1].values[0]);
    const at::Tensor mat1 = value(st.slots[st.slots.size() - 2].values[0]).narrow(0, lo, rows);
    at::Tensor o = out.narrow(0, lo, rows);
    if (st.slots.size() == 2) {
      at::mm_out(o, mat1, mat2);
      return;
    }
    at::Tensor bias = value(st.slots[0].values[0]);
    if (bias.dim() == 2 && bias.size(0) == m) bias = bias.narrow(0, lo, rows);
    at::addmm_out(o, bias, mat1, mat2, st.stack[3].toScalar(), st.stack[4].toScalar());
  };
  // Profiled side by side, a step in parts counts its longest part: its parts run at once, so that is its time on
  // the clock. In order, its blocks' whole run counts (the kernel's thread may run every block, one after another).
  std::vector<std::atomic<int64_t>> longest_part(profiling && side_by_side ? steps_.size() : 0);
  auto run_step = [&](size_t si, int part) {
    const Step& st = steps_[si];
    const bool in_parts = split[si];
    if (part > 0 && !in_parts) return;
    const bool clocked = profiling || timed;
    const auto start = clocked ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    // Each thread routes its calls' allocations to the device (the caller's HostCall covers its own).
    std::optional<HostCall> on_this_thread;
    if (shared) on_this_thread.emplace(device);
    try {
      if (in_parts) {
        run_part(si, part);
      } else if (st.kind == Step::Gemm) {
        const size_t first = st.gemm.has_bias ? 1 : 0;
        st.gemm.run(value(st.outputs[0]), st.gemm.has_bias ? value(st.slots[0].values[0]) : at::Tensor(),
                    value(st.slots[first].values[0]), value(st.slots[first + 1].values[0]));
      } else if (st.kind == Step::Copy) {
        copy_values(value(st.outputs[0]), value(st.slots[0].values[0]));
      } else if (st.kind == Step::Fused) {
        std::vector<at::Tensor> outs, ins;
        for (int v : st.outputs) outs.push_back(value(v));
        for (int v : st.inputs) ins.push_back(value(v));
        st.kernel.run(outs, ins);
      } else {
        std::vector<c10::IValue> stack = arguments(st);
        if (st.use_out && call_out(si, st, stack)) {
          // written in place
        } else {
          if (st.use_out) stack = arguments(st);  // a refused out= call took its arguments
          (st.use_out ? st.functional : st.op)->callBoxed(stack);
          std::vector<at::Tensor> results = tensors_of(stack);
          // A _conj or _neg_view result holds its argument's bytes with a bit a program's geometry cannot
          // carry: it becomes a value of its own (resolve_neg/conj copy it), which resolve_nodes planned.
          for (at::Tensor& t : results) {
            if (t.is_conj() || t.is_neg()) t = t.resolve_conj().resolve_neg();
            // An efficient zero tensor (_efficientzerotensor, in the backward of sgn) has no bytes for the
            // steps that read it: its zeros, in memory.
            if (t.defined() && t._is_zerotensor()) t = at::zeros(t.sizes(), t.options().device(c10::kCPU));
          }
          TORCH_CHECK(results.size() >= st.outputs.size(), "returned ", results.size(), " tensors, the program expects ",
                      st.outputs.size());
          for (size_t k = 0; k < st.outputs.size(); ++k) place(st, k, results[k]);
        }
      }
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, st.label, ": ", e.what_without_backtrace());
    }
    if (clocked) {
      const int64_t ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      if (profiling && in_parts && side_by_side) {
        std::atomic<int64_t>& longest = longest_part[si];
        for (int64_t seen = longest.load(); seen < ns && !longest.compare_exchange_weak(seen, ns);) {
        }
      } else if (profiling && !in_parts) {
        step_ns_[si] += ns;
      }
      if (timed) took[si] = ns;
    }
  };
  try {
    if (side_by_side) {
      std::vector<int> users(held_users_);
      schedule_.run(run_step, [&](size_t si) {
        for (int r : steps_[si].held) {
          if (--users[r] > 0) continue;
          std::lock_guard<std::mutex> lock(values_mutex);
          for (int v : released_with_[r]) values[v] = at::Tensor();
        }
      });
    } else {
      for (size_t si = 0; si < steps_.size(); ++si) {
        if (split[si]) {
          const auto start = profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
          run_blocks(steps_[si].parts, steps_[si].parts, [&](int64_t first, int64_t count) {
            for (int64_t part = first; part < first + count; ++part) run_step(si, static_cast<int>(part));
          });
          if (profiling) {
            step_ns_[si] += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                                 start).count();
          }
        } else {
          run_step(si, 0);
        }
        for (int v : steps_[si].release) values[v] = at::Tensor();
      }
    }
  } catch (const c10::Error&) {
    // The error is reported at the next synchronisation, and work queued after this program runs first:
    // its outputs are zeroed so that a kernel reading them as indices reads valid ones, not whatever the
    // memory held (embedding_bag's backward read a refused forward's offset2bag and crashed).
    for (size_t k = n_in; k < n_in + n_out; ++k) {
      const Operand& o = operands[k];
      if (o.data() != nullptr && o.size() != 0) std::memset(kernel_address(o.data()), 0, o.size());
    }
    throw;
  }
  if (deciding && run_index >= 1) {
    decide(parallel, side_by_side,
           std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - run_start).count(),
           took);
  }
  if (profiling) {
    for (size_t si = 0; si < longest_part.size(); ++si) step_ns_[si] += longest_part[si].load();
    profiled_runs_ += 1;
  }
}

void Program::decide(Parallel ran, bool side_by_side, int64_t ns, const std::vector<int64_t>& took) const {
  constexpr double kSideBySideGain = 0.95;  // side by side must save this much of the time in order
  std::lock_guard<std::mutex> lock(deciding_mutex_);
  if (parallel_.load(std::memory_order_relaxed) != ran) return;  // a run on another stream decided meanwhile
  // The fastest run of each way: other work on the machine only ever adds time to a run.
  auto fastest = [](const std::vector<int64_t>& v) { return static_cast<double>(*std::min_element(v.begin(), v.end())); };
  if (ran == Parallel::Unknown) {
    if (!schedule_.worth_it(took, blocks_split())) {
      parallel_.store(Parallel::No, std::memory_order_relaxed);
      return;
    }
    in_order_ns_.push_back(ns);
    parallel_.store(Parallel::Trial, std::memory_order_relaxed);
    return;
  }
  (side_by_side ? side_by_side_ns_ : in_order_ns_).push_back(ns);
  if (side_by_side_ns_.size() < kDecidingRuns || in_order_ns_.size() < kDecidingRuns) return;
  const bool faster = fastest(side_by_side_ns_) <= kSideBySideGain * fastest(in_order_ns_);
  parallel_.store(faster ? Parallel::Yes : Parallel::No, std::memory_order_relaxed);
}

std::optional<bool> Program::runs_side_by_side() const {
  const Parallel p = parallel_.load(std::memory_order_relaxed);
  if (p == Parallel::Unknown || p == Parallel::Trial) return std::nullopt;
  return p == Parallel::Yes;
}

std::string Program::dump() const {
  std::ostringstream s;
  s << graph_.str();
  s << "# " << steps_.size() << " steps (" << stats_.nodes << " ops: " << stats_.fused_nodes << " fused into "
    << stats_.fused_groups << " kernels, " << stats_.calls << " calls, " << stats_.views << " views)\n";
  const int64_t runs = profiled_runs_.load();
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& st = steps_[i];
    s << "step " << i << ": ";
    if (runs > 0) s << "[" << static_cast<double>(step_ns_[i].load() / runs) / 1000.0 << " us] ";
    if (st.kind == Step::Fused) {
      s << st.label << "\n  loads";
      for (int v : st.inputs) s << " %" << v;
      s << "\n  stores";
      for (int v : st.outputs) s << " %" << v;
      s << "\n" << st.kernel.str();
    } else if (st.kind == Step::Copy) {
      s << "copy " << st.label << " -> %" << st.outputs[0] << "\n";
    } else if (st.kind == Step::Gemm) {
      s << "gemm (beta " << st.gemm.beta << ", alpha " << st.gemm.alpha << (st.gemm.has_bias ? "" : ", no bias") << ") "
        << st.label << " ->";
      for (int v : st.outputs) s << " %" << v;
      s << "\n";
    } else {
      s << (st.use_out ? "call " + st.op->schema().name() + "." + st.op->schema().overload_name() : "call") << " "
        << st.label
        << (st.parts > 1 && side_by_side_asked() != SideBySide::Never  // (in order: as blocks)
                ? " in " + std::to_string(st.parts) + " parts"
                : "")
        << " ->";
      for (int v : st.outputs) s << " %" << v;
      s << "\n";
    }
  }
  const std::optional<bool> side_by_side = runs_side_by_side();
  s << "# steps run " << (!side_by_side ? "as the deciding runs try them (both ways, timed)" : *side_by_side ? "side by side" : "in order")
    << "\n";
  s << "# memory: arena " << plan_.arena_bytes << " bytes for " << arena_buffers_.size() << " buffers ("
    << plan_.naive_bytes << " without reuse)\n";
  for (size_t b = 0; b < arena_buffers_.size(); ++b) {
    s << "  %" << arena_buffers_[b] << " at " << plan_.offsets[b] << "\n";
  }
  return s.str();
}

} // namespace my_device::compiler
