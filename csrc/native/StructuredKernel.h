#pragma once
// Structured CPU kernels run directly on mydev tensors, queued on the stream.
//
// PyTorch's structured kernels split an op into meta() (shapes, dtypes, device
// checks, type promotion; output allocation through set_output_*) and impl()
// (the loop). Here meta() runs at the call, over the device tensors, and impl()
// is queued with launch_async (a short one on an idle stream runs at the call:
// functional_now, and queue_functional for kernels outside TensorIterator);
// impl() reaches the loop through the op's
// DispatchStub, whose PrivateUse1 slot mirror_cpu_stub fills with the CPU loop.
// A vendor plugs in device loops by registering theirs in that slot instead.
// Op families using this: BinaryOps.cpp, UnaryOps.cpp, SoftMax.cpp, LinearAlgebra.cpp,
// ReduceOps.cpp, TensorCompare.cpp, TensorShape.cpp, LossOps.cpp, and Normalization.cpp (layer
// norm, which ATen does not write as a structured kernel, given that shape).
//
// The entry points (functional, queue_functional, in_place and their at-call
// halves) are MYDEV_ALWAYS_INLINE: a kernel run at the call pays for every frame
// between the op and impl() (Launch.h). With these inlined, and launch_if_idle
// running the body in a caller task, a short op on an idle stream has only its
// own function above impl(), where the CPU has its structured wrapper.

#include "CpuDispatchStub.h"  // (first: see the header)

#include <ATen/TensorIterator.h>
#include <ATen/Version.h>
#include <ATen/native/Resize.h>
#include <ATen/core/op_registration/adaption.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "Factory.h"
#include "hostkernel/Breakdown.h"
#include "hostkernel/HostKernel.h"
#include "core/JobPool.h"
#include "core/ComputeUnits.h"
#include "core/KernelArgs.h"
#include "core/Launch.h"
#include "core/TensorImpl.h"

namespace my_device::structured {

// Copies the CPU kernel a stub would pick on this machine into its PrivateUse1 slot.
template <class Stub>
void mirror_cpu_stub(Stub& stub) {
  using FnPtr = typename Stub::FnPtr;
  FnPtr chosen = Stub::DEFAULT;
#if defined(__x86_64__)
  // at::get_cpu_capability() honours ATEN_CPU_CAPABILITY, as the CPU path does.
  const std::string capability = at::get_cpu_capability();
  if (capability == "AVX512" && Stub::AVX512 != nullptr) {
    chosen = Stub::AVX512;
  } else if ((capability == "AVX512" || capability == "AVX2") && Stub::AVX2 != nullptr) {
    chosen = Stub::AVX2;
  }
#endif
  stub.set_privateuse1_dispatch_ptr(chosen);
}

// Structured kernels built on TensorIterator (pointwise, reductions) keep
// their operands in the iterator; the others (mm, softmax) only see outputs.
template <class Base>
constexpr bool kIterator = std::is_base_of_v<at::TensorIteratorBase, Base>;

// A structured kernel whose outputs (N of them: nll_loss_forward has two) are
// new mydev tensors. Each output is shared with the caller while the queued
// kernel runs, so it is a plain Tensor (an ExclusivelyOwned one would be
// destroyed regardless of the caller's reference).
template <class Base, size_t N = 1>
struct Functional final : Base {
  Functional() = default;
  // What meta() left in Base (cat's precomputed values, which its impl()
  // takes), without the outputs: a queued job's copy of the caller's.
  explicit Functional(const Base& after_meta) : Base(after_meta) {}
  void set_output_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          c10::TensorOptions options) override {
    outputs[idx] = empty_device(sizes, strides, options);
    if constexpr (kIterator<Base>) Base::set_output_raw_strided(idx, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    outputs[idx] = empty_device(sizes, strides, options);
    if constexpr (kIterator<Base>) Base::set_output_raw_strided(idx, sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t idx) override {
    return outputs[idx];
  }
  std::array<at::Tensor, N> outputs;
};

// A structured kernel writing into `self`, with the checks PyTorch's in-place wrappers make.
template <class Base>
struct InPlace final : Base {
  explicit InPlace(const at::Tensor& self) : self(&self) {}
  // Points the op at the job's own reference to the tensor.
  void rebind(const at::Tensor& owned) {
    self = &owned;
  }
  void check(c10::IntArrayRef sizes, const c10::TensorOptions& options) {
    TORCH_CHECK(options.dtype() == self->dtype(), "Bad in-place call: input tensor dtype ", self->dtype(),
                " and output tensor dtype ", options.dtype(), " should match");
    TORCH_CHECK(options.device() == self->device(), "Bad in-place call: input tensor device ", self->device(),
                " and output tensor device ", options.device(), " should match");
    TORCH_CHECK(sizes == self->sizes(), "Bad in-place call: input tensor size ", self->sizes(),
                " and output tensor size ", sizes, " should match");
  }
  void set_output_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          c10::TensorOptions options) override {
    check(sizes, options);
    if constexpr (kIterator<Base>) Base::set_output_raw_strided(idx, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    check(sizes, options);
    if constexpr (kIterator<Base>) Base::set_output_raw_strided(idx, sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t) override {
    return *self;
  }
  const at::Tensor* self;
};

// CPU loops assume every operand already has the common dtype: on CPU,
// TensorIterator inserts casts only when the common device is CPU. Mixed-dtype
// calls (int + float, tensor * python float) therefore take the host-kernel
// path, where it does. meta() still ran first, so device errors are the same.
inline bool uniform_dtype(const at::TensorIteratorBase& iter) {
  for (int i = 0; i < iter.ntensors(); ++i) {
    if (iter.dtype(i) != iter.common_dtype()) return false;
  }
  return true;
}

// Runs the op named `label` ("aten::add.Tensor") as a host kernel
// (HostKernel.cpp) and returns its results: for calls the structured path
// cannot take. Mixed dtypes: the CPU loops here assume one dtype, while the
// host kernel's CPU operator casts as the CPU does. Dtypes a CPU kernel may
// lack (integer matrix products): the host kernel runs the first such call at
// the call, so an unsupported dtype raises there. Either way the host kernel
// queues the call when it can (QueuedHostKernel.cpp).
// Arguments structured kernels take as views (OptionalScalarRef,
// OptionalIntArrayRef) over the caller's values, which are gone by the time a
// queued impl() runs: the job holds them by value and hands out views of its
// own copy (a job's arguments never move once it is built).
class HeldOptionalScalar {
 public:
  explicit HeldOptionalScalar(const std::optional<at::Scalar>& value) : value_(value) {}
  operator at::OptionalScalarRef() const {
    return value_ ? at::OptionalScalarRef(&*value_) : at::OptionalScalarRef();
  }
  c10::IValue ivalue() const {
    return value_ ? c10::IValue(*value_) : c10::IValue();
  }

 private:
  std::optional<at::Scalar> value_;
};

class HeldIntList {
 public:
  explicit HeldIntList(at::OptionalIntArrayRef value) {
    if (value) value_.emplace(value->begin(), value->end());
  }
  operator at::OptionalIntArrayRef() const {
    return value_ ? at::OptionalIntArrayRef(*value_) : at::OptionalIntArrayRef();
  }
  c10::IValue ivalue() const {
    return value_ ? c10::IValue(*value_) : c10::IValue();
  }

 private:
  std::optional<std::vector<int64_t>> value_;
};

// An optional tensor (nll_loss's weight), which structured kernels take as an
// OptionalTensorRef: a borrow that an undefined tensor must not be given.
class HeldOptionalTensor {
 public:
  explicit HeldOptionalTensor(const std::optional<at::Tensor>& value)
      : value_(value && value->defined() ? *value : at::Tensor()) {}
  explicit HeldOptionalTensor(at::Tensor value) : value_(std::move(value)) {}
  operator at::OptionalTensorRef() const {
    return value_.defined() ? at::OptionalTensorRef(value_) : at::OptionalTensorRef();
  }
  const at::Tensor& tensor() const {
    return value_;
  }
  c10::IValue ivalue() const {
    return value_.defined() ? c10::IValue(value_) : c10::IValue();
  }

 private:
  at::Tensor value_;
};

template <class T>
const T& ivalue_of(const T& value) {
  return value;
}
inline c10::IValue ivalue_of(const HeldOptionalScalar& value) {
  return value.ivalue();
}
inline c10::IValue ivalue_of(const HeldIntList& value) {
  return value.ivalue();
}
inline c10::IValue ivalue_of(const HeldOptionalTensor& value) {
  return value.ivalue();
}

// A number a loop reads converted to the op's dtype (alpha, weight, value)
// raises there if it is complex or a finite double beyond float's range: on
// the CPU when the loop runs, at the call. A queued loop runs later, so the
// conversion is checked at the call first, with the same error. For float and
// double ops (the loops of other dtypes read the number otherwise).
inline void check_number_converts(const at::Scalar& s, at::ScalarType dtype) {
  if (dtype == at::kFloat) {
    (void)s.to<float>();
  } else {
    (void)s.to<double>();
  }
}

template <class... Args>
torch::jit::Stack run_host_kernel(const char* label, const Args&... args) {
  const c10::OperatorHandle& op = op_named(label);
  TORCH_INTERNAL_ASSERT(op.schema().arguments().size() == sizeof...(Args), label, ": wrong number of arguments");
  torch::jit::Stack stack;
  stack.reserve(sizeof...(Args));
  (stack.emplace_back(ivalue_of(args)), ...);
  host_kernel(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
  return stack;
}

// Raises PyTorch's "Expected all tensors to be on the same device" error
// unless the named tensors share a device: TensorIterator checks this itself,
// the other structured kernels rely on their dispatcher wrapper, which this
// replaces (with the same message).
inline void check_same_device(const char* op,
                              std::initializer_list<std::pair<const char*, const at::Tensor&>> tensors) {
  std::optional<c10::Device> common;
  for (const auto& [name, t] : tensors) c10::impl::check_and_update_common_device(common, t, op, name);
}

// The kernel is queued: meta() runs now (shapes, dtypes, device checks,
// output allocation) and impl() runs on the stream's worker. The TensorIterator
// borrows its operands, so the job owns copies of them, and the job lives
// until the kernel has run. `label` names the op's overload, for failure
// reports and for the host kernel that serves mixed-dtype calls.
// A TensorIterator records its operands' data pointers, at their device
// addresses, when it is built; the kernel reaches them at their kernel addresses.
// Outside strict mode the addresses are equal, and rewriting them anyway would
// dirty the job's cache lines on the worker, for the host to fetch back.
inline void use_kernel_addresses(at::TensorIteratorBase& iter) {
  if (!strict_mode()) return;
  for (int i = 0; i < iter.ntensors(); ++i) iter.unsafe_replace_operand(i, kernel_address(iter.data_ptr(i)));
}

// A queued TensorIterator kernel's impl(), run by `impl(op)`: an elementwise one over two blocks' worth of
// elements is cut by the iterator's outermost dimension, each block a copy of the iterator narrowed to its range
// (as CUDA's 32-bit split narrows one), for whichever of the device's compute units is free (run_blocks). A
// one-dimensional (fully coalesced) iterator is cut where a vector loop's step starts, so that every element
// takes the code it takes in one call: the same bits.
template <class Op, class Impl>
C10_NOINLINE void run_in_blocks(Op& op, int parts, const Impl& impl) {
  const int dim = op.ndim() - 1;
  const int64_t size = op.shape()[dim], align = dim == 0 ? kVectorLoopStep : 1;
  auto start = [&](int64_t p) { return block_start(size, p, parts, align); };
  run_blocks(parts, parts, [&](int64_t first, int64_t count) {
    for (int64_t p = first; p < first + count; ++p) {
      if (start(p + 1) == start(p)) continue;
      Op block(op);
      block.narrow(dim, start(p), start(p + 1) - start(p));
      impl(block);
    }
  });
}

template <class Op, class Impl>
MYDEV_ALWAYS_INLINE void run_iterator_impl(Op& op, const Impl& impl) {
  if (op.numel() >= 2 * kMinElementwisePerBlock && op.num_reduce_dims() == 0 && op.ndim() > 0 && blocks_split()) {
    run_in_blocks(op, block_count(op.numel(), kMinElementwisePerBlock, op.numel(), kMinElementwisePerBlock), impl);
  } else {
    impl(op);
  }
}

// What a queued TensorIterator kernel keeps of an argument (KernelArgs.h): the
// caller's TensorImpl (unless the storage is leased), since the iterator
// recorded its operands' geometry when it was built; giving each input its own
// TensorImpl measured slower than it saves. (The other kernels keep host
// aliases made at the call: HostOperands.)
template <class T>
const T& held_arg(KernelArgs&, const T& value) {
  return value;
}
// (An argument is read: in-place ops pass self, which they write, apart.)
inline at::Tensor held_arg(KernelArgs& held, const at::Tensor& t) {
  return held.share(t, Touch::kReads);
}

// The device a call's kernel will be launched on: that of its first mydev
// tensor (meta() rejects calls mixing devices).
template <class... Args>
c10::DeviceIndex launch_device(const Args&... args) {
  c10::DeviceIndex device = -1;
  auto visit = [&](const auto& a) {
    using A = std::decay_t<decltype(a)>;
    const at::Tensor* t = nullptr;
    if constexpr (std::is_same_v<A, at::Tensor>) t = &a;
    if constexpr (std::is_same_v<A, HeldOptionalTensor>) t = &a.tensor();
    if constexpr (std::is_same_v<A, std::vector<at::Tensor>>) {
      for (const at::Tensor& e : a) {
        if (device < 0 && e.defined() && e.device().type() == kMyDev) device = e.device().index();
      }
    }
    if (t != nullptr && device < 0 && t->defined() && t->device().type() == kMyDev) device = t->device().index();
  };
  (visit(args), ...);
  return device < 0 ? current_device() : device;
}

// Whether every tensor argument is small enough for a short kernel: calls
// that may run at once (launch_if_idle) are picked before meta() knows the
// output's size.
template <class... Args>
bool short_operands(const Args&... args) {
  auto fits = [](const auto& a) {
    if constexpr (std::is_same_v<std::decay_t<decltype(a)>, at::Tensor>) {
      return !a.defined() || is_short_kernel(a.numel());
    } else {
      return true;
    }
  };
  return (fits(args) && ...);
}

// The elements of the tensors among `args` (a kernel's size outside
// TensorIterator: see queue_functional).
template <class... Args>
int64_t operand_elements(const Args&... args) {
  int64_t n = 0;
  auto visit = [&](const auto& a) {
    using A = std::decay_t<decltype(a)>;
    if constexpr (std::is_same_v<A, at::Tensor>) n += a.defined() ? a.numel() : 0;
    if constexpr (std::is_same_v<A, HeldOptionalTensor>) n += a.tensor().defined() ? a.tensor().numel() : 0;
    if constexpr (std::is_same_v<A, std::vector<at::Tensor>>) {
      for (const at::Tensor& e : a) n += e.defined() ? e.numel() : 0;
    }
  };
  (visit(args), ...);
  return n;
}

// The operands of a kernel outside TensorIterator, as CPU tensors over their
// device bytes (at kernel addresses). Made when the kernel is launched, they
// record each tensor's geometry as it is then, as a TensorIterator records its
// operands', so a caller restriding a tensor afterwards (t_, resize_) changes
// nothing the kernel reads. A queued kernel's are made at the call (`held`: the
// job's KernelArgs keeps the bytes), which spares the job a TensorImpl of its
// own per tensor (KernelArgs::own) and the caller's outputs a second one
// (kernel_handle); a kernel run at the call (`held` null) reads the caller's
// tensors while the caller holds them. Tensors over one device storage share
// one host storage, and a tensor passed twice is one host tensor, as CPU
// kernels' alias and overlap checks expect (HostCall::to_host does the same).
class HostOperands {
 public:
  explicit HostOperands(KernelArgs* held) : held_(held) {}
  HostOperands(const HostOperands&) = delete;
  HostOperands& operator=(const HostOperands&) = delete;
  ~HostOperands() {
    if (held_ == nullptr) recycle();
  }

  // Tensors aliased from now on are ones the kernel only reads (kReads) or
  // may write (kWrites, the default), for its KernelArgs.
  void set_touch(Touch touch) {
    touch_ = touch;
  }

  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kMyDev || t.layout() != c10::kStrided) {
      return held_ != nullptr ? held_->own(t, touch_) : t;
    }
    c10::TensorImpl* const impl = t.unsafeGetTensorImpl();
    for (const auto& entry : tensors_) {
      // (Passed again, perhaps as an output now: its KernelArgs hears of it.)
      if (entry.device == impl) return touched(t, entry.host);
    }
    if (held_ == nullptr) breakdown::count_host_alias();
    c10::StorageImpl* const device_storage = t.storage().unsafeGetStorageImpl();
    const c10::Storage* host_storage = nullptr;
    for (const auto& [device, host] : storages_) {
      if (device == device_storage) host_storage = &host;
    }
    // A storage already kept (keep() hears of the others): an output may share an input's.
    if (host_storage != nullptr && held_ != nullptr) held_->touch(t.storage(), touch_);
    if (host_storage == nullptr && held_ == nullptr) {
      if (auto host = pooled_alias(t)) {
        storages_.emplace_back(device_storage, host->storage());
        tensors_.push_back({impl, std::move(*host), true});
        return tensors_.back().host;
      }
    }
    // A kernel run at the call may pool an alias over a storage of its own.
    bool own_storage = false;
    if (host_storage == nullptr) {
      // The job keeps the bytes: a lease, or a reference (KernelArgs::keep).
      if (held_ != nullptr) {
        if (c10::Storage kept = held_->keep(t.storage(), touch_)) kept_.push_back(std::move(kept));
      }
      storages_.emplace_back(device_storage, host_storage_over(device_storage, nullptr, false));
      host_storage = &storages_.back().second;
      own_storage = held_ == nullptr;
    }
    tensors_.push_back({impl, host_tensor_like(t, *host_storage), own_storage});
    return tensors_.back().host;
  }
  HeldOptionalTensor alias(const HeldOptionalTensor& t) {
    return t.tensor().defined() ? HeldOptionalTensor(alias(t.tensor())) : t;
  }
  std::vector<at::Tensor> alias(const std::vector<at::Tensor>& list) {
    std::vector<at::Tensor> host;
    host.reserve(list.size());
    for (const at::Tensor& t : list) host.push_back(alias(t));
    return host;
  }
  template <class T>
  const T& alias(const T& value) {
    return value;
  }

 private:
  struct Entry {
    c10::TensorImpl* device;
    at::Tensor host;
    bool pooled;
  };
  // A kernel run at the call gives its host aliases back to this thread's pool
  // when it returns, unless something still holds them: making a TensorImpl,
  // its version counter and a StorageImpl, and freeing them, cost a short
  // kernel such as log_softmax on a (4, 16) tensor about as much as its loop.
  // A pooled alias is a TensorImpl with a StorageImpl of its own, both
  // repointed at the next call's bytes and geometry.
  static constexpr size_t kPooledAliases = 8;
  static c10::SmallVector<at::Tensor, kPooledAliases>& pool() {
    static thread_local c10::SmallVector<at::Tensor, kPooledAliases> aliases;
    return aliases;
  }
  // A pooled alias for `t`: preferably one last used with `t`'s dtype and
  // geometry (a loop calling one op gets its aliases back as they were), whose
  // TensorImpl then needs only its storage repointed.
  static std::optional<at::Tensor> pooled_alias(const at::Tensor& t) {
    auto& aliases = pool();
    if (aliases.empty()) return std::nullopt;
    size_t pick = aliases.size() - 1;
    bool same = false;
    for (size_t i = aliases.size(); i-- > 0;) {
      const c10::TensorImpl* impl = aliases[i].unsafeGetTensorImpl();
      if (impl->dtype() == t.dtype() && impl->storage_offset() == t.storage_offset() && impl->sizes() == t.sizes() &&
          impl->strides() == t.strides() && impl->is_conj() == t.is_conj() && impl->is_neg() == t.is_neg()) {
        pick = i;
        same = true;
        break;
      }
    }
    at::Tensor host = std::move(aliases[pick]);
    aliases.erase(aliases.begin() + static_cast<std::ptrdiff_t>(pick));
    c10::TensorImpl* impl = host.unsafeGetTensorImpl();
    c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
    c10::StorageImpl* device_storage = t.storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(
        c10::DataPtr(kernel_address(const_cast<void*>(device_storage->data())), c10::Device(c10::DeviceType::CPU)));
    storage->set_nbytes(device_storage->nbytes());
    if (!same) {
      if (impl->dtype() != t.dtype()) impl->set_storage_and_dtype(impl->storage(), t.dtype());
      impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
      impl->_set_conj(t.is_conj());
      impl->_set_neg(t.is_neg());
    }
    return host;
  }
  void recycle() {
    storages_.clear();
    for (auto& entry : tensors_) {
      if (!entry.pooled) entry.host.reset();
    }
    auto& aliases = pool();
    for (auto& entry : tensors_) {
      if (!entry.pooled) continue;
      c10::TensorImpl* impl = entry.host.unsafeGetTensorImpl();
      // Only an alias nothing else refers to, as the kernel received it.
      if (aliases.size() < kPooledAliases && entry.host.use_count() == 1 && entry.host.weak_use_count() == 1 &&
          impl->autograd_meta() == nullptr && impl->storage().use_count() == 1 &&
          impl->storage().resizable() == false && impl->storage().allocator() == nullptr) {
        aliases.push_back(std::move(entry.host));
      }
    }
  }

  KernelArgs* held_;
  c10::SmallVector<Entry, 4> tensors_;
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> storages_;
  c10::SmallVector<c10::Storage, 2> kept_;
  Touch touch_ = Touch::kWrites;

  const at::Tensor& touched(const at::Tensor& t, const at::Tensor& host) {
    if (held_ != nullptr) held_->touch(t.storage(), touch_);
    return host;
  }
};

template <size_t N, size_t... I>
std::array<at::Tensor, N> first_tensors(const torch::jit::Stack& stack, std::index_sequence<I...>) {
  return {stack[I].toTensor()...};
}

// Kernels outside TensorIterator whose impl() reaches its operands through
// their data pointers, or through ops on them, and its loops through a stub
// called with kCPU or mirrored into the PrivateUse1 slot (mirror_cpu_stub).
// Outside strict mode a device address is the host address of the same bytes,
// so such a kernel run at the call reads the caller's tensors themselves: no
// host aliases, no HostCall. The ops its impl() calls on them (sum's fill_(),
// addmm's copy_(), a softmax's contiguous()) run at once, inside it
// (launch_is_nested), as the CPU runs them. A family file specialises this for
// the kernels it has read, before it instantiates them, deriving from
// OnDeviceTensors; `accepts` adds what else a call must meet (sum: no reduced
// float, whose CPU loop takes a path only for CPU tensors).
template <class Base>
struct RunsOnDeviceTensors : std::false_type {};

struct OnDeviceTensors : std::true_type {
  template <class... Args>
  static bool accepts(const Args&...) {
    return true;
  }
};

// The dtypes a TensorIterator kernel's loop has run (one bit per common
// dtype). A loop dispatches on its dtype and raises "not implemented for
// 'Bool'" for one it lacks, which the CPU raises at the call: so each dtype's
// first call runs at the call, in stream order (launch_inline), raising there,
// and only later calls are queued (as the host kernel confirms a signature).
// Ops sharing a class share its loop (relu is clamp_min).
template <class Base>
inline std::atomic<uint64_t> g_confirmed_dtypes{0};
static_assert(static_cast<int>(at::ScalarType::NumOptions) <= 64, "one bit per dtype");

template <class Base>
MYDEV_ALWAYS_INLINE bool dtype_confirmed(const at::TensorIteratorBase& iter) {
  const uint64_t bit = uint64_t{1} << static_cast<int>(iter.common_dtype());
  return (g_confirmed_dtypes<Base>.load(std::memory_order_relaxed) & bit) != 0;
}

// Runs `op`'s impl() now, after the stream's queued work, and records its dtype.
template <class Base, class Op, class Impl>
C10_NOINLINE void run_first_call(c10::DeviceIndex device, Op& op, Impl impl) {
  launch_inline(device, [&] {
    use_kernel_addresses(op);
    impl();
  });
  g_confirmed_dtypes<Base>.fetch_or(uint64_t{1} << static_cast<int>(op.common_dtype()), std::memory_order_relaxed);
}

// The dtypes of a call's tensor arguments, one byte each by position (0: none
// or undefined): what a kernel outside TensorIterator dispatches on. Its impl()
// raises for a dtype, or a mix of dtypes, it lacks ("expected scalar type
// Float but found Long" from bmm of float and long), which the CPU raises at
// the call and CUDA's host code checks before its launch.
template <class T>
void add_dtype(uint64_t& signature, const T& arg) {
  if constexpr (std::is_same_v<T, std::vector<at::Tensor>>) {
    for (const at::Tensor& t : arg) add_dtype(signature, t);
  }
  if constexpr (std::is_same_v<T, at::Tensor> || std::is_same_v<T, std::optional<at::Tensor>>) {
    const at::Tensor* t = nullptr;
    if constexpr (std::is_same_v<T, at::Tensor>) {
      t = &arg;
    } else if (arg.has_value()) {
      t = &*arg;
    }
    const uint64_t code = (t != nullptr && t->defined()) ? static_cast<uint64_t>(t->scalar_type()) + 1 : 0;
    signature = (signature << 8 | signature >> 56) ^ code;
  }
}
template <class... Args>
uint64_t dtype_signature(const Args&... args) {
  uint64_t signature = 0;
  (add_dtype(signature, args), ...);
  return signature;
}

// The dtype signatures a kernel outside TensorIterator has run at the call
// without raising (g_confirmed_dtypes' counterpart): later calls of one are
// queued. Most calls repeat the last one confirmed, which is checked first.
template <class Base>
struct ConfirmedSignatures {
  static bool contains(uint64_t signature) {
    if (last.load(std::memory_order_relaxed) == signature) return true;
    std::lock_guard<std::mutex> lock(mutex);
    const bool found = std::find(all.begin(), all.end(), signature) != all.end();
    if (found) last.store(signature, std::memory_order_relaxed);
    return found;
  }
  static void add(uint64_t signature) {
    std::lock_guard<std::mutex> lock(mutex);
    if (std::find(all.begin(), all.end(), signature) == all.end()) all.push_back(signature);
    last.store(signature, std::memory_order_relaxed);
  }
  static inline std::atomic<uint64_t> last{~uint64_t{0}};
  static inline std::mutex mutex;
  static inline std::vector<uint64_t> all;
};

// A short TensorIterator kernel on an idle stream runs at the call, over the
// caller's own tensors, as the CPU runs it: no job holding its arguments, no
// TensorImpl of the kernel's own, no task. Empty if the call must be queued
// (the caller then builds the job; if the stream stopped being idle after
// meta() ran here, meta() runs once more there).
template <class Base, size_t N, class... Args>
MYDEV_ALWAYS_INLINE std::optional<std::array<at::Tensor, N>> functional_now(const char* label, const Args&... args) {
  const c10::DeviceIndex device = launch_device(args...);
  if (!short_operands(args...) || !stream_idle(device)) return std::nullopt;
  Functional<Base, N> op;
  op.meta(args...);
  if (!uniform_dtype(op)) return first_tensors<N>(run_host_kernel(label, args...), std::make_index_sequence<N>());
  if (C10_UNLIKELY(!dtype_confirmed<Base>(op))) {
    run_first_call<Base>(device, op, [&] { std::apply([&](const auto&... o) { op.impl(args..., o...); }, op.outputs); });
    return std::move(op.outputs);
  }
  if (!is_short_kernel(op.numel())) return std::nullopt;
  TORCH_INTERNAL_ASSERT(op.outputs[0].device().index() == device, label, ": output on mydev:",
                        op.outputs[0].device().index(), ", inputs on mydev:", device);
  const bool ran = launch_if_idle(device, label, [&]() MYDEV_INLINE_BODY {
    use_kernel_addresses(op);
    std::apply([&](const auto&... o) { op.impl(args..., o...); }, op.outputs);
  });
  if (!ran) return std::nullopt;
  return std::move(op.outputs);
}

// A kernel outside TensorIterator whose meta() has run (`op`, its outputs
// `outputs`): impl() runs now or is queued, on host aliases of the operands and
// outputs (or on the device tensors themselves: RunsOnDeviceTensors).
template <class Base, size_t N, class... Args>
MYDEV_ALWAYS_INLINE void run_impl(const char* label, c10::DeviceIndex device, Base& op,
                                  const std::array<at::Tensor, N>& outputs, const Args&... args) {
  // The elements of its operands and outputs bound such a kernel's work (a
  // softmax, a reduction, nll_loss; a matrix product's is about the 1.5th
  // power of theirs): over a few thousand, the hand-off to the worker costs
  // less than the kernel (kShortKernelElements).
  const bool short_kernel =
      is_short_kernel(operand_elements(args...) +
                      std::apply([](const auto&... o) { return operand_elements(o...); }, outputs));
  // impl() now, over aliases of the caller's own tensors (or those tensors
  // themselves: RunsOnDeviceTensors).
  auto run_here = [&](bool on_device_tensors) MYDEV_INLINE_BODY {
    if (on_device_tensors) {
      std::apply([&](const auto&... o) { op.impl(args..., o...); }, outputs);
      return;
    }
    HostOperands host(nullptr);
    auto host_args = std::make_tuple(host.alias(args)...);
    std::array<at::Tensor, N> host_outputs;
    for (size_t i = 0; i < N; ++i) host_outputs[i] = host.alias(outputs[i]);
    HostCall call(device);
    std::apply([&](const auto&... a) {
      std::apply([&](const auto&... o) { op.impl(a..., o...); }, host_outputs);
    }, host_args);
  };
  // A dtype signature's first call runs at the call, in stream order, so
  // that a dtype impl() lacks raises there.
  const uint64_t signature = dtype_signature(args...);
  if (C10_UNLIKELY(!ConfirmedSignatures<Base>::contains(signature))) {
    launch_inline(device, [&] { run_here(false); });
    ConfirmedSignatures<Base>::add(signature);
    return;
  }
  // On an idle stream a short kernel runs now: no job, no references held,
  // no task (as functional_now).
  if (short_kernel) {
    bool on_device_tensors = false;
    if constexpr (RunsOnDeviceTensors<Base>::value) {
      on_device_tensors = !strict_mode() && RunsOnDeviceTensors<Base>::accepts(args...);
    }
    const bool ran = launch_if_idle(device, label, [&]() MYDEV_INLINE_BODY { run_here(on_device_tensors); });
    if (ran) return;
  }
  // (A few hundred bytes: malloc's per-thread cache serves it faster than
  // Pooled's locked free list, which is for TensorIterator jobs.)
  struct Job {
    Job(c10::DeviceIndex device, const Base& after_meta) : held(device), host(&held), op(after_meta) {}
    KernelArgs held;
    HostOperands host;
    std::optional<std::tuple<std::decay_t<decltype(host.alias(std::declval<const Args&>()))>...>> args;
    std::array<at::Tensor, N> outputs;
    Functional<Base, N> op;  // impl() only: meta() ran on the caller's, and left this its state
  };
  static_assert(sizeof(Job) <= 1024, "larger than malloc's per-thread cache serves: derive Job from Pooled");
  auto job = std::make_unique<Job>(device, op);
  job->host.set_touch(Touch::kReads);
  job->args.emplace(job->host.alias(args)...);
  job->host.set_touch(Touch::kWrites);
  // The outputs are the device tensors meta() made, or the caller's out=; the
  // job keeps their bytes as it keeps its inputs' (a lease, or a reference).
  for (size_t i = 0; i < N; ++i) job->outputs[i] = job->host.alias(outputs[i]);
  const KernelArgs* touches = &job->held;
  launch_async(device, label, [job = std::move(job)] {
    HostCall call(job->held.device());
    std::apply([&](const auto&... a) {
      std::apply([&](const auto&... o) { job->op.impl(a..., o...); }, job->outputs);
    }, *job->args);
  }, short_kernel, touches);
}

// What functional<> and functional_tuple<> share: meta() now, impl() queued,
// the N outputs returned to the caller.
template <class Base, size_t N, class... Args>
MYDEV_ALWAYS_INLINE std::array<at::Tensor, N> queue_functional(const char* label, const Args&... args) {
  if constexpr (kIterator<Base>) {
    if (auto out = functional_now<Base, N>(label, args...)) return std::move(*out);
    struct Job : Pooled<Job> {
      Job(c10::DeviceIndex device, const Args&... a) : held(device), args(held_arg(held, a)...) {}
      KernelArgs held;
      std::tuple<Args...> args;
      Functional<Base, N> op;
    };
    auto job = std::make_unique<Job>(launch_device(args...), args...);
    std::apply([&](const auto&... a) { job->op.meta(a...); }, job->args);
    if (!uniform_dtype(job->op)) return first_tensors<N>(run_host_kernel(label, args...), std::make_index_sequence<N>());
    if (C10_UNLIKELY(!dtype_confirmed<Base>(job->op))) {
      run_first_call<Base>(job->held.device(), job->op, [&] {
        std::apply([&](const auto&... a) {
          std::apply([&](const auto&... o) { job->op.impl(a..., o...); }, job->op.outputs);
        }, job->args);
      });
      return std::move(job->op.outputs);
    }
    const c10::DeviceIndex device = job->op.outputs[0].device().index();
    TORCH_INTERNAL_ASSERT(device == job->held.device(), label, ": output on mydev:", device, ", inputs on mydev:",
                          job->held.device());
    // The caller gets its own TensorImpls (kernel_handle): outputs are the tensors
    // most often dropped while their kernel is still queued. The job's are then
    // pointed at leases, so that dropping them gives the blocks back at once.
    std::array<at::Tensor, N> out;
    for (size_t i = 0; i < N; ++i) {
      out[i] = kernel_handle(job->op.outputs[i]);
      job->held.lease_in_place(job->op.outputs[i]);
    }
    // A kernel over a few thousand elements costs less than handing it to the
    // worker (kShortKernelElements).
    const bool short_kernel = is_short_kernel(job->op.numel());
    const KernelArgs* touches = &job->held;
    launch_async(device, label, [job = std::move(job)] {
      use_kernel_addresses(job->op);
      run_iterator_impl(job->op, [&](Functional<Base, N>& op) {
        std::apply([&](const auto&... a) {
          std::apply([&](const auto&... o) { op.impl(a..., o...); }, op.outputs);
        }, job->args);
      });
    }, short_kernel, touches);
    return out;
  } else {
    // meta() runs on the caller's tensors; impl() on host aliases of them and
    // of the outputs (HostOperands), under a HostCall: kernels outside
    // TensorIterator call other ops (addmm copies self into its output with
    // copy_, nll_loss makes its input contiguous), which on host aliases are
    // CPU ops allocating device memory, not launches behind this kernel.
    Functional<Base, N> op;
    op.meta(args...);
    // (An output a mask leaves out is undefined: native_layer_norm_backward's grad_input when only the
    // weight needs one.)
    const c10::DeviceIndex device = launch_device(args...);
    for (const at::Tensor& o : op.outputs) {
      TORCH_INTERNAL_ASSERT(!o.defined() || o.device().index() == device, label, ": output on mydev:",
                            o.device().index(), ", inputs on mydev:", device);
    }
    run_impl<Base, N>(label, device, op, op.outputs, args...);
    return std::move(op.outputs);
  }
}

// A structured kernel with one output, as a new mydev tensor.
template <class Base, class... Args>
MYDEV_ALWAYS_INLINE at::Tensor functional(const char* label, const Args&... args) {
  return std::move(queue_functional<Base, 1>(label, args...)[0]);  // (the array is a temporary)
}

// A structured kernel with N outputs (nll_loss_forward: output, total_weight),
// returned as a tuple.
template <class Base, size_t N, class... Args>
auto functional_tuple(const char* label, const Args&... args) {
  return std::apply([](auto&&... o) { return std::make_tuple(std::move(o)...); },
                    queue_functional<Base, N>(label, args...));
}

// meta() writing into the caller's out= tensor, with the checks and the resize
// PyTorch's out= wrappers make.
template <class Base>
struct Out final : Base {
  explicit Out(const at::Tensor& out) : out(out) {}
  void set_output_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          c10::TensorOptions options) override {
    resize(sizes, strides, options);
  }
  void set_output_raw_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    resize(sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t) override {
    return out;
  }
  void resize(c10::IntArrayRef sizes, c10::IntArrayRef strides, const c10::TensorOptions& options) {
    TORCH_CHECK(options.dtype() == out.dtype(), "Expected out tensor to have dtype ", options.dtype(), ", but got ",
                out.dtype(), " instead");
    TORCH_CHECK(options.device() == out.device(), "Expected out tensor to have device ", options.device(),
                ", but got ", out.device(), " instead");
    if (at::native::resize_output(out, sizes) && !strides.empty()) out.as_strided_(sizes, strides);
  }
  at::Tensor out;
};

// A structured kernel outside TensorIterator writing into `out` (mm.out):
// meta() at the call, impl() as functional<>'s.
template <class Base, class... Args>
at::Tensor& out_variant(const char* label, at::Tensor& out, const Args&... args) {
  static_assert(!kIterator<Base>, "out_variant: kernels outside TensorIterator only");
  Out<Base> op(out);
  op.meta(args...);
  run_impl<Base, 1>(label, launch_device(args...), op, std::array<at::Tensor, 1>{out}, args...);
  return out;
}

// in_place's counterpart of functional_now: true if the call is done.
template <class Base, class... Args>
MYDEV_ALWAYS_INLINE bool in_place_now(const char* label, at::Tensor& self, const Args&... args) {
  const c10::DeviceIndex device = self.device().index();
  if (!short_operands(self, args...) || !stream_idle(device)) return false;
  InPlace<Base> op(self);
  op.meta(self, args...);
  if (!uniform_dtype(op)) {
    run_host_kernel(label, self, args...);
    return true;
  }
  if (C10_UNLIKELY(!dtype_confirmed<Base>(op))) {
    run_first_call<Base>(device, op, [&] { op.impl(self, args..., self); });
    return true;
  }
  return launch_if_idle(device, label, [&]() MYDEV_INLINE_BODY {
    use_kernel_addresses(op);
    op.impl(self, args..., self);
  });
}

template <class Base, class... Args>
MYDEV_ALWAYS_INLINE at::Tensor& in_place(const char* label, at::Tensor& self, const Args&... args) {
  // impl() runs on the device tensors themselves: only a TensorIterator
  // (use_kernel_addresses) knows to reach them at their kernel addresses.
  static_assert(kIterator<Base>, "in_place: TensorIterator ops only; others go through a HostCall");
  if (in_place_now<Base>(label, self, args...)) return self;
  struct Job : Pooled<Job> {
    Job(c10::DeviceIndex device, const at::Tensor& s, const Args&... a)
        : held(device), self(held.share(s)), args(held_arg(held, a)...), op(s) {}
    KernelArgs held;
    at::Tensor self;
    std::tuple<Args...> args;
    InPlace<Base> op;
  };
  auto job = std::make_unique<Job>(launch_device(self, args...), self, args...);
  job->op.rebind(job->self);
  std::apply([&](const auto&... a) { job->op.meta(job->self, a...); }, job->args);
  const c10::DeviceIndex device = self.device().index();
  if constexpr (kIterator<Base>) {
    if (!uniform_dtype(job->op)) {
      run_host_kernel(label, self, args...);
      return self;
    }
    if (C10_UNLIKELY(!dtype_confirmed<Base>(job->op))) {
      run_first_call<Base>(device, job->op, [&] {
        std::apply([&](const auto&... a) { job->op.impl(job->self, a..., job->self); }, job->args);
      });
      return self;
    }
  }
  const bool short_kernel = is_short_kernel(job->op.numel());
  const KernelArgs* touches = &job->held;
  launch_async(device, label, [job = std::move(job)] {
    use_kernel_addresses(job->op);
    run_iterator_impl(job->op, [&](InPlace<Base>& op) {
      std::apply([&](const auto&... a) { op.impl(job->self, a..., job->self); }, job->args);
    });
  }, short_kernel, touches);
  return self;
}

} // namespace my_device::structured
