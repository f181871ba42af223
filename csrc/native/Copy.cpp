// Copies between the host and devices. Bytes cross a device boundary only
// through runtime copies of dense, identically laid-out ranges; dtype
// conversion and restriding happen on one side of the boundary (on the host,
// or in a host kernel on the device), as a real device would do them.
// First: it sets up DispatchStub's declarations as the wheel's (copy_stub).
#include "StructuredKernel.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/Copy.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstring>
#include <type_traits>

#include "hostkernel/HostKernel.h"
#include "core/Event.h"
#include "core/KernelArgs.h"

namespace my_device {
namespace {

bool is_device(const at::Tensor& t) {
  return t.device().type() == kMyDev;
}

mydevMemcpyKind kind_of(const at::Tensor& src, const at::Tensor& dst) {
  if (is_device(src) && is_device(dst)) return mydevMemcpyDeviceToDevice;
  return is_device(dst) ? mydevMemcpyHostToDevice : mydevMemcpyDeviceToHost;
}

// One runtime copy can move src into dst when both are dense with the same
// layout and the same element interpretation.
bool bytewise_copyable(const at::Tensor& src, const at::Tensor& dst) {
  return src.dtype() == dst.dtype() && src.sizes() == dst.sizes() && src.strides() == dst.strides() &&
         src.is_non_overlapping_and_dense() && src.is_conj() == dst.is_conj() && src.is_neg() == dst.is_neg();
}

bool is_pinned_host(const at::Tensor& t) {
  if (is_device(t)) return false;
  mydevPointerAttributes attr{};
  return mydevPointerGetAttributes(&attr, t.const_data_ptr()) == mydevSuccess && attr.type == mydevMemoryTypeHost;
}

// Work queued from now on `waiting`'s current stream starts after the work
// queued so far on `waited`'s. A copy between devices runs on the destination's
// stream between two such barriers, as CUDA's does: after what the source's
// stream has queued (it may still be writing the source), and before what that
// stream queues next (which may overwrite it).
void barrier(c10::DeviceIndex waited, c10::DeviceIndex waiting) {
  const Event event;
  {
    RuntimeDeviceGuard on_device(waited);
    MYDEV_CHECK(event.record(current_stream_handle(waited)));
  }
  RuntimeDeviceGuard on_device(waiting);
  MYDEV_CHECK(mydevStreamWaitEvent(current_stream_handle(waiting), event.get()));
}

// One runtime copy of the dense bytes of src into dst. Device-to-device copies,
// and copies whose host side is pinned when the caller allows non_blocking, are
// queued on the current stream of the device side (both tensors are kept alive
// until the copy ran); the rest are synchronous, as CUDA's pageable copies are.
void runtime_copy(const at::Tensor& src, const at::Tensor& dst, bool non_blocking = false) {
  const size_t nbytes = static_cast<size_t>(src.numel()) * src.element_size();
  const mydevMemcpyKind kind = kind_of(src, dst);
  const bool async = kind == mydevMemcpyDeviceToDevice ||
                     (non_blocking && (is_pinned_host(src) || is_pinned_host(dst)));
  if (!async) {
    if (!in_kernel()) warn_or_error_on_sync();
    MYDEV_CHECK(mydevMemcpy(dst.data_ptr(), src.const_data_ptr(), nbytes, kind));
    if (kind == mydevMemcpyDeviceToHost) raise_kernel_failure_after_host_read(src.device().index());
    return;
  }
  const c10::DeviceIndex device = (is_device(dst) ? dst : src).device().index();
  const bool across = kind == mydevMemcpyDeviceToDevice && src.device() != dst.device();
  if (across) barrier(src.device().index(), device);
  RuntimeDeviceGuard on_device(device);
  MYDEV_CHECK(mydevMemcpyAsync(dst.data_ptr(), src.const_data_ptr(), nbytes, kind, current_stream_handle(device)));
  if (across) barrier(device, src.device().index());
  // Streams run in order, so this no-op kernel finishes after the copy and
  // releases what it holds only then: the storages (not the caller's
  // TensorImpls, see kernel_handle) that the copy cannot lease (KernelArgs.h).
  KernelArgs held(device);
  c10::Storage s = held.keep(src.storage());
  c10::Storage d = held.keep(dst.storage());
  if (s || d) launch_async(device, "copy keep-alive", [s = std::move(s), d = std::move(d)] {});
}

// Whether the CPU's copy_ could raise or warn for these operands: shapes that
// do not broadcast, a written-to tensor whose elements overlap, operands that
// partly overlap, or a complex source into a real destination (a warning).
// Those copies run at the call, so the CPU's error or warning comes there.
// (Internal overlap is what the CPU's check raises for: MemOverlap::Yes. Any
// strided view, `x[:, 1:5] = y` or a padding's interior, is TooHard, which it
// lets through; counting those ran every such copy at the call.)
bool copy_may_complain(const at::Tensor& src, const at::Tensor& dst) {
  return !at::is_expandable_to(src.sizes(), dst.sizes()) ||
         at::has_internal_overlap(dst) == at::MemOverlap::Yes ||
         at::get_overlap_status(src, dst) == at::MemOverlapStatus::Partial ||
         (src.is_complex() && !dst.is_complex());
}

// Whether a copy between two tensors of one device can be the CPU's copy loop
// over an iterator of the device tensors themselves (at their kernel
// addresses), as the CPU's copy_ runs it. Not for conjugate or negative bits,
// which the CPU's copy_ resolves with further ops after the loop, nor for
// quantized tensors. Nor for the large transposed matrix that the CPU's copy_
// moves in blocks instead of through its loop (its copy_transpose_valid): the
// loop alone would be slower than the CPU it is measured against.
bool copyable_by_iterator(const at::Tensor& src, const at::Tensor& dst) {
  if (src.is_conj() || dst.is_conj() || src.is_neg() || dst.is_neg() || src.is_quantized() || dst.is_quantized()) {
    return false;
  }
  // In strict mode the loop may reach its operands only through the
  // iterator's pointers (use_kernel_addresses). The CPU's conversion between
  // float and half or bfloat16 reads the tensors' own data pointers instead
  // (its reduced_float_copy_kernel): device addresses, which fault there.
  const auto reduced = [](at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; };
  const at::ScalarType from = src.scalar_type();
  const at::ScalarType to = dst.scalar_type();
  if (strict_mode() && ((reduced(from) && to == at::kFloat) || (from == at::kFloat && reduced(to)))) return false;
  constexpr int64_t kCpuTransposeMinElements = 60 * 60;
  const bool cpu_transposes = dst.is_contiguous() && src.dim() == 2 && src.stride(0) == 1 &&
                              src.stride(1) == src.size(0) && from == to &&
                              src.sizes().equals(dst.sizes()) && dst.numel() >= kCpuTransposeMinElements;
  return !cpu_transposes;
}

// The iterator the CPU's copy_ builds, over device tensors.
at::TensorIterator copy_iterator(const at::Tensor& src, const at::Tensor& dst) {
  return at::TensorIteratorConfig()
      .add_output(dst)
      .add_const_input(src)
      .resize_outputs(false)
      .check_all_same_dtype(false)
      .check_all_same_device(false)
      .build();
}

void run_copy_loop(at::TensorIterator& iter) {
  structured::use_kernel_addresses(iter);
  at::native::copy_stub(c10::DeviceType::CPU, iter, /*non_blocking=*/false);
}

// A copy run at the call with the copy loop: a short copy on an idle stream
// (clone, contiguous()), any copy under MYDEV_LAUNCH_BLOCKING (where a queued
// one would run at the call too, after building a job), and any copy launched
// from inside a kernel run at the call (addmm copying its bias into its
// output), which must be done when it returns (launch_is_nested). False if it
// did not run.
bool copy_at_call(const at::Tensor& src, const at::Tensor& dst) {
  const c10::DeviceIndex device = dst.device().index();
  if (!copyable_by_iterator(src, dst) || !stream_idle(device)) return false;
  at::TensorIterator iter = copy_iterator(src, dst);
  return launch_if_idle(device, "aten::copy_", [&]() MYDEV_INLINE_BODY { run_copy_loop(iter); });
}

// The copy loop queued: the iterator is built now, over the job's own handles
// of the two tensors (it borrows its operands), and runs on the worker. No host
// aliases and no dispatch of the CPU's copy_ there, which is the worker's time
// in the copy of a transposed attention head (bench_launch's top 20).
void queue_copy_loop(const at::Tensor& src, const at::Tensor& dst) {
  const c10::DeviceIndex device = dst.device().index();
  struct Job : Pooled<Job> {
    Job(c10::DeviceIndex device, const at::Tensor& s, const at::Tensor& d)
        : held(device), src(held.share(s, Touch::kReads)), dst(held.share(d)), iter(copy_iterator(src, dst)) {}
    KernelArgs held;
    at::Tensor src;
    at::Tensor dst;
    at::TensorIterator iter;
  };
  auto job = std::make_unique<Job>(device, src, dst);
  const KernelArgs* touches = &job->held;
  launch_async(device, "aten::copy_", [job = std::move(job)] { run_copy_loop(job->iter); }, false, touches);
}

// dst.copy_(src) with both tensors on the same mydev device. A dense copy is
// the runtime's memcpy. A copy that converts or restrides is a kernel like any
// other: a short one on an idle stream, or any under MYDEV_LAUNCH_BLOCKING,
// runs at the call (copy_at_call); the others are queued: the copy loop
// (queue_copy_loop), or else the CPU's copy_ over host aliases of the two.
// From inside a kernel run at the call, every copy runs at once.
void copy_on_device(const at::Tensor& src, const at::Tensor& dst) {
  const c10::DeviceIndex device = dst.device().index();
  const bool nested = launch_is_nested(device, current_stream_handle(device));
  // (Shown as a memcpy by the profiler, as CUDA's. Not from inside a kernel:
  // the runtime would queue it behind that kernel.)
  if (!nested && bytewise_copyable(src, dst) && src.storage().data() != dst.storage().data()) {
    runtime_copy(src, dst);
    return;
  }
  const bool may_complain = copy_may_complain(src, dst);
  if (!may_complain && (nested || is_short_kernel(dst.numel()) || launches_block()) && copy_at_call(src, dst)) {
    return;
  }
  if (nested || may_complain) {
    run_on_host(device, [&](HostCall& call) {
      call.to_host(dst).copy_(call.to_host(src));
      return true;
    });
    return;
  }
  if (copyable_by_iterator(src, dst)) {
    queue_copy_loop(src, dst);
    return;
  }
  KernelArgs held(device);
  launch_async(device, "aten::copy_", [src = held.own(src, Touch::kReads), dst = held.own(dst)] {
    HostCall call(dst.device().index());
    call.to_host(dst).copy_(call.to_host(src));
  }, false, &held);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(dst.defined(), "dst is undefined");
  if (self.numel() == 0) {
    // Nothing to move, but the shapes must still broadcast, as the CPU's copy_ checks.
    const auto shape = at::infer_size_dimvector(dst.sizes(), self.sizes());
    TORCH_CHECK(c10::IntArrayRef(shape) == dst.sizes(), "output with shape ", dst.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
    return dst;
  }
  // A source with no storage (a lazy tensor copied into mydev): its backend
  // produces its value on the CPU, which is then copied in as any host tensor.
  const at::Tensor src = self.has_storage() ? self : self.cpu();
  if (is_device(src) && is_device(dst) && src.device() == dst.device()) {
    copy_on_device(src, dst);
    return dst;
  }
  // Crossing a boundary: make src dense, in dst's dtype and shape, on its own
  // side; move it in one runtime copy; restride on dst's side if needed.
  at::Tensor staged = src.expand(dst.sizes());
  if (!bytewise_copyable(staged, dst)) {
    staged = staged.to(dst.scalar_type()).resolve_conj().resolve_neg().contiguous();
  }
  if (bytewise_copyable(staged, dst)) {
    runtime_copy(staged, dst, non_blocking);
    return dst;
  }
  at::Tensor landing = at::empty(staged.sizes(), staged.options().device(dst.device()));
  runtime_copy(staged, landing);
  dst.copy_(landing);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

// .item(): the element's bytes come to a buffer on the stack and become the
// Scalar here, as the CPU kernel makes it from its tensor's memory. (It used to
// land in a CPU tensor and dispatch _local_scalar_dense on that: an allocation
// and a second dispatch, most of this op's host time; an optimizer step calls
// it a dozen times.) The dtypes are those the CPU kernel reads; any other
// raises as the CPU kernel does, naming this one.
at::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() > 0, "_local_scalar_dense: Empty tensor not supported");
  const at::ScalarType dtype = self.scalar_type();
  auto read = [&](const void* bytes) {
    at::Scalar value;
    AT_DISPATCH_V2(dtype, "_local_scalar_dense_mydev", AT_WRAP([&] {
      if constexpr (std::is_same_v<scalar_t, bool>) {
        // Any non-zero byte reads as true, as on the CPU (not a bool load of a
        // byte that may be neither 0 nor 1).
        value = at::Scalar(*static_cast<const uint8_t*>(bytes) != 0);
      } else {
        scalar_t element;
        std::memcpy(&element, bytes, sizeof(element));
        value = at::Scalar(element);
      }
    }), AT_EXPAND(AT_ALL_TYPES), AT_EXPAND(AT_COMPLEX_TYPES), at::kComplexHalf, at::kHalf, at::kBool,
        at::kBFloat16, AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES), AT_EXPAND(AT_FLOAT8_TYPES));
    return value;
  };
  alignas(16) unsigned char bytes[16] = {};  // complex<double>, the widest element read
  const size_t size = self.element_size();
  TORCH_INTERNAL_ASSERT(size <= sizeof(bytes), "_local_scalar_dense: element of ", size, " bytes");
  if (!in_kernel()) warn_or_error_on_sync();
  MYDEV_CHECK(mydevMemcpy(bytes, self.const_data_ptr(), size, mydevMemcpyDeviceToHost));
  raise_kernel_failure_after_host_read(self.device().index());
  at::Scalar value = read(bytes);
  // PyTorch's Conjugate and Negative fallbacks resolve those bits before this
  // kernel; a call redispatched below them keeps its bits, applied here.
  if (self.is_conj()) value = value.conj();
  if (self.is_neg()) value = -value;
  return value;
}

// The functional copy(self, src) into a tensor of another backend: dispatch
// picked mydev only because PrivateUse1 outranks every other backend key (a
// mydev source into a lazy destination, under functionalization); the
// destination's backend owns the result, so it gets the call.
void copy_functional(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto& args = *stack;
  const at::Tensor& self = args[args.size() - 3].toTensor();
  c10::DispatchKeySet keys = ks;
  if (self.device().type() != kMyDev) {
    keys = keys.remove_backend(c10::BackendComponent::PrivateUse1Bit) | self.key_set();
    keys = keys.remove_backend(c10::BackendComponent::PrivateUse1Bit);
  } else {
    keys = c10::DispatchKeySet(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
  }
  op.redispatchBoxed(keys, stack);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("copy", torch::CppFunction::makeFromBoxedFunction<&copy_functional>());
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
}

// copy_ sends every copy touching mydev to _copy_from. For a conjugated or
// negated source, the Conjugate/Negative keys' fallback would first materialise
// it with clone(), which is itself a copy_ into mydev: endless recursion. The
// kernels above take conj and neg bits as they are (HostCall keeps them, and
// the host side resolves them), so those keys pass these ops straight through.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

} // namespace
} // namespace my_device
