// The foreach ops that torch.optim's foreach SGD, Adam and AdamW call, as one
// queued kernel per call.
//
// PyTorch's CPU foreach kernels are loops of per-tensor ops (t.add_(o, alpha)
// for each pair). Here the per-tensor ops are the same structured kernels
// (StructuredKernel.h): every tensor's meta() runs at the call, so a bad
// shape raises there, and one task runs every tensor's impl() in list order,
// which is the order the CPU's loop writes them in (lists whose tensors alias
// each other give the CPU's results). A small list of small tensors (the
// optimizer on a small model) is a short kernel (Launch.h).
//
// The fast path takes calls whose tensors all sit on one mydev device with one
// float or double dtype, whose numbers convert to that dtype, and whose every
// meta() finds one common dtype; a meta() error (shapes, overlap, a bool
// subtracted) is the CPU's error for that entry and is raised at the call.
// Every other call (empty or unequal lists, mixed dtypes or devices, integer,
// half or complex operands) goes where it went before: an in-place op to the
// host kernel (hostkernel/Plan.h, Kind::InPlaceList), which runs the CPU's own
// composite kernel and so gives the CPU's results and errors; an out-of-place
// op to PyTorch's per-tensor composite, each op of which is a mydev op.
#include "StructuredKernel.h"

#include <unordered_set>

#include "core/ComputeUnits.h"

#include <ATen/ops/_foreach_add_native.h>
#include <ATen/ops/_foreach_addcdiv_native.h>
#include <ATen/ops/_foreach_addcmul_native.h>
#include <ATen/ops/_foreach_div_native.h>
#include <ATen/ops/_foreach_lerp_native.h>
#include <ATen/ops/_foreach_maximum_native.h>
#include <ATen/ops/_foreach_mul_native.h>
#include <ATen/ops/_foreach_neg_native.h>
#include <ATen/ops/_foreach_sqrt_native.h>
#include <ATen/ops/_foreach_sub_native.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/addcdiv_native.h>
#include <ATen/ops/addcmul_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/lerp_native.h>
#include <ATen/ops/clamp_min_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/Lerp.h>
#include <ATen/native/PointwiseOps.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ScalarOps.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace my_device {
namespace {

using namespace structured;

// The per-tensor kernels' stubs are mirrored where their single-tensor ops
// live (BinaryOps.cpp, PointwiseOps.cpp, UnaryOps.cpp); these two have no
// single-tensor kernel of their own here.
const bool g_stubs_mirrored = [] {
  mirror_cpu_stub(at::native::maximum_stub);
  mirror_cpu_stub(at::native::neg_stub);
  return true;
}();

// The device of a call the fast path may take: every tensor of every list on
// the first one's mydev device, strided, with its dtype (float or double), and
// the lists (and `scalars`, if given) of one non-zero length.
std::optional<c10::DeviceIndex> list_device(std::initializer_list<at::TensorList> lists,
                                            std::optional<size_t> scalars = std::nullopt) {
  const at::TensorList first = *lists.begin();
  if (first.empty() || (scalars && *scalars != first.size())) return std::nullopt;
  const at::Tensor& t0 = first[0];
  if (!t0.defined() || t0.device().type() != kMyDev) return std::nullopt;
  const at::ScalarType dtype = t0.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble) return std::nullopt;
  for (const at::TensorList list : lists) {
    if (list.size() != first.size()) return std::nullopt;
    for (const at::Tensor& t : list) {
      if (!t.defined() || t.device() != t0.device() || t.scalar_type() != dtype || t.layout() != c10::kStrided ||
          t.is_neg() || t.is_conj()) {
        return std::nullopt;
      }
    }
  }
  return t0.device().index();
}

// A number handed to the kernel (alpha, weight, value) is checked at the call
// (check_number_converts), in the same place among the checks as the CPU's
// entry raises it, after that entry's meta().
template <class T>
void check_number(const T&, at::ScalarType) {}
void check_number(const at::Scalar& s, at::ScalarType dtype) {
  check_number_converts(s, dtype);
}

// `tensor.op_(number)` is `tensor.op_(wrapped_scalar_tensor(number))`, and on
// the CPU the iterator converts the 0-dim double (or int64) to the tensor's
// dtype first (a plain cast, which takes overflow to inf): this makes that
// converted tensor directly. Half and bfloat16 loops read the unconverted
// number instead, which is one reason the fast path takes float and double only.
std::optional<at::Tensor> number_as(const at::Scalar& s, at::ScalarType dtype) {
  if (s.isSymbolic() || s.isComplex()) return std::nullopt;
  if (s.isBoolean()) {
    // Kept a bool, as the CPU's meta() sees it: sub rejects it there; the
    // others promote it, which the fast path leaves to the host kernel.
    at::Tensor t = at::detail::scalar_tensor_static(s, at::kBool, at::kCPU);
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return t;
  }
  at::Tensor t = at::detail::empty_cpu({}, dtype);
  if (dtype == at::kFloat) {
    *t.data_ptr<float>() = s.isIntegral(false) ? (s.isUnsigned() ? static_cast<float>(s.toUInt64()) : static_cast<float>(s.toLong())) : static_cast<float>(s.toDouble());
  } else {
    *t.data_ptr<double>() = s.isIntegral(false) ? (s.isUnsigned() ? static_cast<double>(s.toUInt64()) : static_cast<double>(s.toLong())) : s.toDouble();
  }
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// One per-tensor structured op per list entry: `make(i, held)` gives entry
// i's meta() arguments (`self` first), its tensors taken through `held`. The
// entries' operands stay where they are built (the ops keep pointers to them).
template <class Op, class Make>
struct ListJob : Pooled<ListJob<Op, Make>> {
  using Args = std::invoke_result_t<Make&, size_t, KernelArgs&>;
  ListJob(c10::DeviceIndex device, size_t n) : held(device), ops(new std::optional<Op>[n]), size(n) {
    args.reserve(n);
  }
  KernelArgs held;
  std::vector<Args> args;
  std::unique_ptr<std::optional<Op>[]> ops;
  size_t size;
};

// Builds every entry and runs its meta(), in list order as the CPU's loop
// does: an entry's meta() error is the one the CPU raises for that entry, and
// is raised here, at the call, before anything was queued (where the CPU has
// already written the entries before it). False if the fast path cannot serve
// the call (the job is then dropped, outputs included, and nothing was queued).
template <class Op, class Job, class Make, class Construct>
bool build(Job& job, Make& make, Construct construct, int64_t& numel) {
  for (size_t i = 0; i < job.size; ++i) {
    const auto& args = job.args.emplace_back(make(i, job.held));
    Op& op = construct(job.ops[i], args);
    std::apply([&](const auto&... a) { op.meta(a...); }, args);
    if (!uniform_dtype(op)) return false;
    std::apply([&](const auto&... a) { (check_number(a, op.common_dtype()), ...); }, args);
    numel += op.numel();
  }
  return true;
}

// A list's entries run in two blocks on the device's compute units when the
// list is big enough (an optimizer's step over a model's parameters) and no
// entry writes memory another entry touches: the blocks then run in any order,
// and each entry's bits are its own. The cut falls where half the elements
// are; 0 is no cut. (Entries writing views of one storage stay in order.)
constexpr int64_t kMinElementsPerBlock = 1 << 17;  // a few tens of microseconds of one core's loop

template <class Job>
size_t entry_cut(const Job& job, int64_t numel, bool writes_self) {
  if (job.size < 2 || block_count(2, 1, numel, kMinElementsPerBlock) < 2) return 0;
  if (writes_self) {
    std::unordered_set<const void*> written;
    for (size_t i = 0; i < job.size; ++i) {
      if (!written.insert(std::get<0>(job.args[i]).storage().data()).second) return 0;
    }
    bool shared = false;
    for (size_t i = 0; i < job.size && !shared; ++i) {
      const void* own = std::get<0>(job.args[i]).storage().data();
      std::apply([&](const auto&, const auto&... rest) {
        auto check = [&](const auto& a) {
          if constexpr (std::is_same_v<std::decay_t<decltype(a)>, at::Tensor>) {
            const void* read = a.storage().data();
            shared = shared || (read != own && written.count(read) != 0);
          }
        };
        (check(rest), ...);
      }, job.args[i]);
    }
    if (shared) return 0;
  }
  int64_t seen = 0;
  for (size_t i = 0; i < job.size; ++i) {
    seen += job.ops[i]->numel();
    if (2 * seen >= numel) return i + 1 < job.size ? i + 1 : 0;
  }
  return 0;
}

// Runs `entry(i)` for each entry, in two blocks cut at `cut` (entry_cut).
template <class Entry>
void run_entries(size_t size, size_t cut, const Entry& entry) {
  run_blocks(2, cut == 0 ? 1 : 2, [&](int64_t first, int64_t count) {
    const size_t lo = count == 2 || first == 0 ? 0 : cut;
    const size_t hi = count == 2 || first == 1 ? size : cut;
    for (size_t i = lo; i < hi; ++i) entry(i);
  });
}

// The in-place op `Base` on every entry, as one queued kernel; false (and
// nothing done) if the fast path cannot serve the call.
template <class Base, class Make>
bool in_place_list(const char* label, c10::DeviceIndex device, size_t n, Make make) {
  using Job = ListJob<InPlace<Base>, Make>;
  auto job = std::make_unique<Job>(device, n);
  int64_t numel = 0;
  const bool built = build<InPlace<Base>>(*job, make, [](std::optional<InPlace<Base>>& slot, const auto& args)
                                              -> InPlace<Base>& { return slot.emplace(std::get<0>(args)); },
                                          numel);
  if (!built) return false;
  const KernelArgs* touches = &job->held;
  const size_t cut = entry_cut(*job, numel, true);
  launch_async(device, label, [job = std::move(job), cut] {
    run_entries(job->size, cut, [&](size_t i) {
      InPlace<Base>& op = *job->ops[i];
      use_kernel_addresses(op);
      std::apply([&](const auto&... a) { op.impl(a..., std::get<0>(job->args[i])); }, job->args[i]);
    });
  }, is_short_kernel(numel), touches);
  return true;
}

// The functional op `Base` on every entry, as one queued kernel; its outputs,
// or nothing if the fast path cannot serve the call.
template <class Base, class Make>
std::optional<std::vector<at::Tensor>> functional_list(const char* label, c10::DeviceIndex device, size_t n,
                                                       Make make) {
  using Job = ListJob<Functional<Base>, Make>;
  auto job = std::make_unique<Job>(device, n);
  int64_t numel = 0;
  const bool built = build<Functional<Base>>(
      *job, make, [](std::optional<Functional<Base>>& slot, const auto&) -> Functional<Base>& { return slot.emplace(); },
      numel);
  if (!built) return std::nullopt;
  std::vector<at::Tensor> outputs;
  outputs.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // As structured::functional: the caller's handle, and a lease for the job.
    outputs.push_back(kernel_handle(job->ops[i]->outputs[0]));
    job->held.lease_in_place(job->ops[i]->outputs[0]);
  }
  const KernelArgs* touches = &job->held;
  const size_t cut = entry_cut(*job, numel, false);
  launch_async(device, label, [job = std::move(job), cut] {
    run_entries(job->size, cut, [&](size_t i) {
      Functional<Base>& op = *job->ops[i];
      use_kernel_addresses(op);
      std::apply([&](const auto&... a) { op.impl(a..., op.outputs[0]); }, job->args[i]);
    });
  }, is_short_kernel(numel), touches);
  return outputs;
}

// The fallbacks: the host kernel for in-place ops (as before these kernels),
// PyTorch's per-tensor composite for the others.
template <class... Args>
void in_place_fallback(const char* label, const Args&... args) {
  run_host_kernel(label, args...);
}

// ---- the ops ------------------------------------------------------------------------------------
// Each names its CPU composite's per-tensor call in a comment: the structured
// op, and its arguments, must be the ones that call reaches.

using AddOp = at::native::structured_ufunc_add_CPU;
using SubOp = at::native::structured_sub_out;
using MulOp = at::native::structured_mul_out;
using DivOp = at::native::structured_div_out;

// A list and a list (t.op_(o[i], alpha)).
template <class Base>
bool binary_list_(const char* label, at::TensorList self, at::TensorList other) {
  const auto device = list_device({self, other});
  return device && in_place_list<Base>(label, *device, self.size(), [&](size_t i, KernelArgs& held) {
    return std::make_tuple(held.share(self[i]), held.share(other[i], Touch::kReads));
  });
}
template <class Base>
bool binary_list_alpha_(const char* label, at::TensorList self, at::TensorList other, const at::Scalar& alpha) {
  const auto device = list_device({self, other});
  return device &&
         in_place_list<Base>(label, *device, self.size(), [&](size_t i, KernelArgs& held) {
           return std::make_tuple(held.share(self[i]), held.share(other[i], Touch::kReads), alpha);
         });
}

// A list and a number (t.op_(number) is t.op_(wrapped number), with alpha 1 for add and sub).
template <class Base, bool kAlpha>
bool binary_scalar_(const char* label, at::TensorList self, const at::Scalar& scalar) {
  const auto device = list_device({self});
  if (!device) return false;
  const auto number = number_as(scalar, self[0].scalar_type());
  if (!number) return false;
  return in_place_list<Base>(label, *device, self.size(), [&](size_t i, KernelArgs& held) {
    if constexpr (kAlpha) {
      return std::make_tuple(held.share(self[i]), *number, at::Scalar(1));
    } else {
      return std::make_tuple(held.share(self[i]), *number);
    }
  });
}

// A list and a list of numbers.
template <class Base, bool kAlpha>
bool binary_scalar_list_(const char* label, at::TensorList self, at::ArrayRef<at::Scalar> scalars) {
  const auto device = list_device({self}, scalars.size());
  if (!device) return false;
  std::vector<at::Tensor> numbers;
  numbers.reserve(scalars.size());
  for (const at::Scalar& s : scalars) {
    auto n = number_as(s, self[0].scalar_type());
    if (!n) return false;
    numbers.push_back(std::move(*n));
  }
  return in_place_list<Base>(label, *device, self.size(), [&](size_t i, KernelArgs& held) {
    if constexpr (kAlpha) {
      return std::make_tuple(held.share(self[i]), numbers[i], at::Scalar(1));
    } else {
      return std::make_tuple(held.share(self[i]), numbers[i]);
    }
  });
}

void add_list_(at::TensorList self, at::TensorList other, const at::Scalar& alpha) {
  static constexpr char kLabel[] = "aten::_foreach_add_.List";
  if (!binary_list_alpha_<AddOp>(kLabel, self, other, alpha)) in_place_fallback(kLabel, self, other, alpha);
}
void sub_list_(at::TensorList self, at::TensorList other, const at::Scalar& alpha) {
  static constexpr char kLabel[] = "aten::_foreach_sub_.List";
  if (!binary_list_alpha_<SubOp>(kLabel, self, other, alpha)) in_place_fallback(kLabel, self, other, alpha);
}
void mul_list_(at::TensorList self, at::TensorList other) {
  static constexpr char kLabel[] = "aten::_foreach_mul_.List";
  if (!binary_list_<MulOp>(kLabel, self, other)) in_place_fallback(kLabel, self, other);
}
void div_list_(at::TensorList self, at::TensorList other) {
  static constexpr char kLabel[] = "aten::_foreach_div_.List";
  if (!binary_list_<DivOp>(kLabel, self, other)) in_place_fallback(kLabel, self, other);
}
// The CPU's _foreach_maximum_ is t.clamp_min_(o[i]) (whose kernel is maximum's).
void maximum_list_(at::TensorList self, at::TensorList other) {
  static constexpr char kLabel[] = "aten::_foreach_maximum_.List";
  if (!binary_list_<at::native::structured_clamp_min_Tensor_out>(kLabel, self, other)) {
    in_place_fallback(kLabel, self, other);
  }
}

void add_scalar_(at::TensorList self, const at::Scalar& scalar) {
  static constexpr char kLabel[] = "aten::_foreach_add_.Scalar";
  if (!binary_scalar_<AddOp, true>(kLabel, self, scalar)) in_place_fallback(kLabel, self, scalar);
}
void sub_scalar_(at::TensorList self, const at::Scalar& scalar) {
  static constexpr char kLabel[] = "aten::_foreach_sub_.Scalar";
  if (!binary_scalar_<SubOp, true>(kLabel, self, scalar)) in_place_fallback(kLabel, self, scalar);
}
void mul_scalar_(at::TensorList self, const at::Scalar& scalar) {
  static constexpr char kLabel[] = "aten::_foreach_mul_.Scalar";
  if (!binary_scalar_<MulOp, false>(kLabel, self, scalar)) in_place_fallback(kLabel, self, scalar);
}
void div_scalar_(at::TensorList self, const at::Scalar& scalar) {
  static constexpr char kLabel[] = "aten::_foreach_div_.Scalar";
  if (!binary_scalar_<DivOp, false>(kLabel, self, scalar)) in_place_fallback(kLabel, self, scalar);
}

void add_scalar_list_(at::TensorList self, at::ArrayRef<at::Scalar> scalars) {
  static constexpr char kLabel[] = "aten::_foreach_add_.ScalarList";
  if (!binary_scalar_list_<AddOp, true>(kLabel, self, scalars)) in_place_fallback(kLabel, self, scalars);
}
void mul_scalar_list_(at::TensorList self, at::ArrayRef<at::Scalar> scalars) {
  static constexpr char kLabel[] = "aten::_foreach_mul_.ScalarList";
  if (!binary_scalar_list_<MulOp, false>(kLabel, self, scalars)) in_place_fallback(kLabel, self, scalars);
}
void div_scalar_list_(at::TensorList self, at::ArrayRef<at::Scalar> scalars) {
  static constexpr char kLabel[] = "aten::_foreach_div_.ScalarList";
  if (!binary_scalar_list_<DivOp, false>(kLabel, self, scalars)) in_place_fallback(kLabel, self, scalars);
}

// A list and one tensor (t.mul_(other)). The fast path takes a 0-dim
// `other` on the lists' device, of their dtype. (A CPU tensor would have to be
// read at the launch: that case keeps the host kernel's handling.)
void mul_tensor_(at::TensorList self, const at::Tensor& other) {
  static constexpr char kLabel[] = "aten::_foreach_mul_.Tensor";
  if (other.defined() && other.dim() != 0) {
    // The CPU's composite checks `other` before any per-tensor op: its own
    // check raises here, at the call (the host kernel would raise it only
    // from the queued kernel).
    at::native::foreach_tensor_mul_tensor_kernel_slow_(self, other);
    return;
  }
  const auto device = list_device({self});
  const bool fast = device && other.defined() && other.device() == self[0].device() &&
                    other.scalar_type() == self[0].scalar_type() && other.layout() == c10::kStrided &&
                    !other.is_neg() &&
                    in_place_list<MulOp>(kLabel, *device, self.size(), [&](size_t i, KernelArgs& held) {
                      return std::make_tuple(held.share(self[i]), held.share(other, Touch::kReads));
                    });
  if (!fast) in_place_fallback(kLabel, self, other);
}

// t.lerp_(end[i], weight)
void lerp_scalar_(at::TensorList self, at::TensorList end, const at::Scalar& weight) {
  static constexpr char kLabel[] = "aten::_foreach_lerp_.Scalar";
  const auto device = list_device({self, end});
  const bool fast = device &&
                    in_place_list<at::native::structured_lerp_Scalar>(
                        kLabel, *device, self.size(), [&](size_t i, KernelArgs& held) {
                          return std::make_tuple(held.share(self[i]), held.share(end[i], Touch::kReads), weight);
                        });
  if (!fast) in_place_fallback(kLabel, self, end, weight);
}
// t.lerp_(end[i], weight[i])
void lerp_list_(at::TensorList self, at::TensorList end, at::TensorList weight) {
  static constexpr char kLabel[] = "aten::_foreach_lerp_.List";
  const auto device = list_device({self, end, weight});
  const bool fast = device && in_place_list<at::native::structured_lerp_Tensor>(
                                  kLabel, *device, self.size(), [&](size_t i, KernelArgs& held) {
                                    return std::make_tuple(held.share(self[i]), held.share(end[i], Touch::kReads),
                                                           held.share(weight[i], Touch::kReads));
                                  });
  if (!fast) in_place_fallback(kLabel, self, end, weight);
}

// t.addcmul_(t1[i], t2[i], value) and t.addcdiv_(...), value one number or one per entry.
template <class Base>
bool pointwise_(const char* label, at::TensorList self, at::TensorList t1, at::TensorList t2,
                at::ArrayRef<at::Scalar> values, bool per_entry) {
  const auto device = list_device({self, t1, t2}, per_entry ? std::optional<size_t>(values.size()) : std::nullopt);
  if (!device) return false;
  return in_place_list<Base>(label, *device, self.size(), [&](size_t i, KernelArgs& held) {
    return std::make_tuple(held.share(self[i]), held.share(t1[i], Touch::kReads), held.share(t2[i], Touch::kReads),
                           values[per_entry ? i : 0]);
  });
}
void addcmul_scalar_(at::TensorList self, at::TensorList t1, at::TensorList t2, const at::Scalar& value) {
  static constexpr char kLabel[] = "aten::_foreach_addcmul_.Scalar";
  if (!pointwise_<at::native::structured_addcmul_out>(kLabel, self, t1, t2, value, false)) {
    in_place_fallback(kLabel, self, t1, t2, value);
  }
}
void addcmul_scalar_list_(at::TensorList self, at::TensorList t1, at::TensorList t2,
                          at::ArrayRef<at::Scalar> values) {
  static constexpr char kLabel[] = "aten::_foreach_addcmul_.ScalarList";
  if (!pointwise_<at::native::structured_addcmul_out>(kLabel, self, t1, t2, values, true)) {
    in_place_fallback(kLabel, self, t1, t2, values);
  }
}
void addcdiv_scalar_(at::TensorList self, at::TensorList t1, at::TensorList t2, const at::Scalar& value) {
  static constexpr char kLabel[] = "aten::_foreach_addcdiv_.Scalar";
  if (!pointwise_<at::native::structured_addcdiv_out>(kLabel, self, t1, t2, value, false)) {
    in_place_fallback(kLabel, self, t1, t2, value);
  }
}
void addcdiv_scalar_list_(at::TensorList self, at::TensorList t1, at::TensorList t2,
                          at::ArrayRef<at::Scalar> values) {
  static constexpr char kLabel[] = "aten::_foreach_addcdiv_.ScalarList";
  if (!pointwise_<at::native::structured_addcdiv_out>(kLabel, self, t1, t2, values, true)) {
    in_place_fallback(kLabel, self, t1, t2, values);
  }
}

// t.sqrt_(), t.neg_()
template <class Base>
bool unary_(const char* label, at::TensorList self) {
  const auto device = list_device({self});
  return device && in_place_list<Base>(label, *device, self.size(), [&](size_t i, KernelArgs& held) {
    return std::make_tuple(held.share(self[i]));
  });
}
void sqrt_(at::TensorList self) {
  static constexpr char kLabel[] = "aten::_foreach_sqrt_";
  if (!unary_<at::native::structured_sqrt_out>(kLabel, self)) in_place_fallback(kLabel, self);
}
void neg_(at::TensorList self) {
  static constexpr char kLabel[] = "aten::_foreach_neg_";
  if (!unary_<at::native::structured_neg_out>(kLabel, self)) in_place_fallback(kLabel, self);
}

// ---- out-of-place ---------------------------------------------------------------------------------
// Same per-tensor calls (t.op(...)), each result a new tensor.

std::vector<at::Tensor> add_list(at::TensorList self, at::TensorList other, const at::Scalar& alpha) {
  const auto device = list_device({self, other});
  std::optional<std::vector<at::Tensor>> out;
  if (device) {
    out = functional_list<AddOp>("aten::_foreach_add.List", *device, self.size(), [&](size_t i, KernelArgs& held) {
      return std::make_tuple(held.share(self[i], Touch::kReads), held.share(other[i], Touch::kReads), alpha);
    });
  }
  return out ? std::move(*out) : at::native::foreach_tensor_add_list_kernel_slow(self, other, alpha);
}

std::vector<at::Tensor> sub_list(at::TensorList self, at::TensorList other, const at::Scalar& alpha) {
  const auto device = list_device({self, other});
  std::optional<std::vector<at::Tensor>> out;
  if (device) {
    out = functional_list<SubOp>("aten::_foreach_sub.List", *device, self.size(), [&](size_t i, KernelArgs& held) {
      return std::make_tuple(held.share(self[i], Touch::kReads), held.share(other[i], Touch::kReads), alpha);
    });
  }
  return out ? std::move(*out) : at::native::foreach_tensor_sub_list_kernel_slow(self, other, alpha);
}

template <class Base>
std::optional<std::vector<at::Tensor>> binary_list(const char* label, at::TensorList self, at::TensorList other) {
  const auto device = list_device({self, other});
  if (!device) return std::nullopt;
  return functional_list<Base>(label, *device, self.size(), [&](size_t i, KernelArgs& held) {
    return std::make_tuple(held.share(self[i], Touch::kReads), held.share(other[i], Touch::kReads));
  });
}
std::vector<at::Tensor> mul_list(at::TensorList self, at::TensorList other) {
  auto out = binary_list<MulOp>("aten::_foreach_mul.List", self, other);
  return out ? std::move(*out) : at::native::foreach_tensor_mul_list_kernel_slow(self, other);
}
std::vector<at::Tensor> div_list(at::TensorList self, at::TensorList other) {
  auto out = binary_list<DivOp>("aten::_foreach_div.List", self, other);
  return out ? std::move(*out) : at::native::foreach_tensor_div_list_kernel_slow(self, other);
}
std::vector<at::Tensor> maximum_list(at::TensorList self, at::TensorList other) {
  auto out = binary_list<at::native::structured_clamp_min_Tensor_out>("aten::_foreach_maximum.List", self, other);
  return out ? std::move(*out) : at::native::foreach_tensor_clamp_min_list_kernel_slow(self, other);
}

template <class Base, bool kAlpha>
std::optional<std::vector<at::Tensor>> binary_scalar(const char* label, at::TensorList self,
                                                     const at::Scalar& scalar) {
  const auto device = list_device({self});
  if (!device) return std::nullopt;
  const auto number = number_as(scalar, self[0].scalar_type());
  if (!number) return std::nullopt;
  return functional_list<Base>(label, *device, self.size(), [&](size_t i, KernelArgs& held) {
    if constexpr (kAlpha) {
      return std::make_tuple(held.share(self[i], Touch::kReads), *number, at::Scalar(1));
    } else {
      return std::make_tuple(held.share(self[i], Touch::kReads), *number);
    }
  });
}
std::vector<at::Tensor> add_scalar(at::TensorList self, const at::Scalar& scalar) {
  auto out = binary_scalar<AddOp, true>("aten::_foreach_add.Scalar", self, scalar);
  return out ? std::move(*out) : at::native::foreach_tensor_add_scalar_kernel_slow(self, scalar);
}
std::vector<at::Tensor> sub_scalar(at::TensorList self, const at::Scalar& scalar) {
  auto out = binary_scalar<SubOp, true>("aten::_foreach_sub.Scalar", self, scalar);
  return out ? std::move(*out) : at::native::foreach_tensor_sub_scalar_kernel_slow(self, scalar);
}
std::vector<at::Tensor> mul_scalar(at::TensorList self, const at::Scalar& scalar) {
  auto out = binary_scalar<MulOp, false>("aten::_foreach_mul.Scalar", self, scalar);
  return out ? std::move(*out) : at::native::foreach_tensor_mul_scalar_kernel_slow(self, scalar);
}
std::vector<at::Tensor> div_scalar(at::TensorList self, const at::Scalar& scalar) {
  auto out = binary_scalar<DivOp, false>("aten::_foreach_div.Scalar", self, scalar);
  return out ? std::move(*out) : at::native::foreach_tensor_div_scalar_kernel_slow(self, scalar);
}

template <class Base>
std::optional<std::vector<at::Tensor>> unary(const char* label, at::TensorList self) {
  const auto device = list_device({self});
  if (!device) return std::nullopt;
  return functional_list<Base>(label, *device, self.size(), [&](size_t i, KernelArgs& held) {
    return std::make_tuple(held.share(self[i], Touch::kReads));
  });
}
std::vector<at::Tensor> sqrt(at::TensorList self) {
  auto out = unary<at::native::structured_sqrt_out>("aten::_foreach_sqrt", self);
  return out ? std::move(*out) : at::native::foreach_tensor_sqrt_slow(self);
}
std::vector<at::Tensor> neg(at::TensorList self) {
  auto out = unary<at::native::structured_neg_out>("aten::_foreach_neg", self);
  return out ? std::move(*out) : at::native::foreach_tensor_neg_slow(self);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_foreach_add_.List", TORCH_FN(add_list_));
  m.impl("_foreach_sub_.List", TORCH_FN(sub_list_));
  m.impl("_foreach_mul_.List", TORCH_FN(mul_list_));
  m.impl("_foreach_div_.List", TORCH_FN(div_list_));
  m.impl("_foreach_maximum_.List", TORCH_FN(maximum_list_));
  m.impl("_foreach_add_.Scalar", TORCH_FN(add_scalar_));
  m.impl("_foreach_sub_.Scalar", TORCH_FN(sub_scalar_));
  m.impl("_foreach_mul_.Scalar", TORCH_FN(mul_scalar_));
  m.impl("_foreach_div_.Scalar", TORCH_FN(div_scalar_));
  m.impl("_foreach_add_.ScalarList", TORCH_FN(add_scalar_list_));
  m.impl("_foreach_mul_.ScalarList", TORCH_FN(mul_scalar_list_));
  m.impl("_foreach_div_.ScalarList", TORCH_FN(div_scalar_list_));
  m.impl("_foreach_mul_.Tensor", TORCH_FN(mul_tensor_));
  m.impl("_foreach_lerp_.Scalar", TORCH_FN(lerp_scalar_));
  m.impl("_foreach_lerp_.List", TORCH_FN(lerp_list_));
  m.impl("_foreach_addcmul_.Scalar", TORCH_FN(addcmul_scalar_));
  m.impl("_foreach_addcmul_.ScalarList", TORCH_FN(addcmul_scalar_list_));
  m.impl("_foreach_addcdiv_.Scalar", TORCH_FN(addcdiv_scalar_));
  m.impl("_foreach_addcdiv_.ScalarList", TORCH_FN(addcdiv_scalar_list_));
  m.impl("_foreach_sqrt_", TORCH_FN(sqrt_));
  m.impl("_foreach_neg_", TORCH_FN(neg_));
  m.impl("_foreach_add.List", TORCH_FN(add_list));
  m.impl("_foreach_sub.List", TORCH_FN(sub_list));
  m.impl("_foreach_mul.List", TORCH_FN(mul_list));
  m.impl("_foreach_div.List", TORCH_FN(div_list));
  m.impl("_foreach_maximum.List", TORCH_FN(maximum_list));
  m.impl("_foreach_add.Scalar", TORCH_FN(add_scalar));
  m.impl("_foreach_sub.Scalar", TORCH_FN(sub_scalar));
  m.impl("_foreach_mul.Scalar", TORCH_FN(mul_scalar));
  m.impl("_foreach_div.Scalar", TORCH_FN(div_scalar));
  m.impl("_foreach_sqrt", TORCH_FN(sqrt));
  m.impl("_foreach_neg", TORCH_FN(neg));
}

} // namespace
} // namespace my_device
