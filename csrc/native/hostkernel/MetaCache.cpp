// The Meta kernel's answers by call signature (MetaCache.h).
#include "MetaCache.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DefaultDtype.h>

#include <cmath>

#include "HostCall.h"
#include "Plan.h"
#include "core/TensorImpl.h"

namespace my_device {
namespace {

template <class T>
void put(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void put_ints(std::string& key, c10::IntArrayRef values) {
  put(key, values.size());
  key.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
}

// What value checks can tell apart: NaN, -inf, negative, zero, positive, +inf.
uint8_t value_class(double x) {
  if (std::isnan(x)) return 0;
  if (std::isinf(x)) return x < 0 ? 1 : 5;
  return x < 0 ? 2 : x == 0 ? 3 : 4;
}

at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kMyDev) return t;
  at::Tensor m = at::detail::empty_strided_meta(t.sizes(), t.strides(), t.scalar_type(), std::nullopt,
                                                std::nullopt, std::nullopt);
  m.unsafeGetTensorImpl()->_set_conj(t.is_conj());
  m.unsafeGetTensorImpl()->_set_neg(t.is_neg());
  return m;
}

// A host tensor's values are seen by both kernels: a CPU boolean mask shapes
// an index's output, a CPU scalar tensor is checked against the dtype. So
// they are part of the signature; a host tensor too large to key on makes
// the call unkeyable, and so never queued.
constexpr int64_t kMaxKeyedHostElements = 64;

bool put_host_values(std::string& key, std::string& values, const at::Tensor& t) {
  if (t.device().type() != c10::DeviceType::CPU) return true;
  if (t.unsafeGetTensorImpl()->is_wrapped_number() && t.is_floating_point()) {
    // A Python float, which may change at every step (a learning rate): by
    // class in the key, as floating Scalars are.
    const double x = t.item<double>();
    put(key, value_class(x));
    put(values, x);
    return true;
  }
  if (t.layout() != c10::kStrided || t.numel() > kMaxKeyedHostElements) return false;
  const at::Tensor c = t.is_contiguous() ? t : t.contiguous();
  if (c.numel() > 0) key.append(static_cast<const char*>(c.const_data_ptr()), c.nbytes());
  return true;
}

} // namespace

bool CallKey::add(const c10::IValue& v, bool exact) {
  std::string& key = shape_;
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    put(key, 'T');
    put(key, t.defined());
    if (!t.defined()) return true;
    put(key, t.device().type());
    put(key, t.scalar_type());  // (not the storage offset: to_meta does not pass it on)
    put(key, static_cast<uint8_t>(t.is_conj() | t.is_neg() << 1 |
                                  t.unsafeGetTensorImpl()->is_wrapped_number() << 2 |
                                  (t.layout() != c10::kStrided) << 3));
    put_ints(key, t.sizes());
    put_ints(key, t.strides());
    return put_host_values(key, values_, t);
  }
  // (a generator's draws do not change shapes)
  if (v.isNone() || v.isGenerator()) return put(key, 'N'), true;
  if (v.isBool()) return put(key, 'b'), put(key, v.toBool()), true;
  if (v.isInt()) return put(key, 'i'), put(key, v.toInt()), true;
  if (v.isDouble()) {
    put(key, 'd');
    if (exact) return put(key, v.toDouble()), true;
    put(key, value_class(v.toDouble()));
    put(values_, v.toDouble());
    return true;
  }
  if (v.isComplexDouble()) {
    put(key, 'c');
    put(values_, v.toComplexDouble());
    return true;
  }
  if (v.isString()) {
    const auto& str = v.toStringRef();
    put(key, 's');
    put(key, str.size());
    key.append(str);
    return true;
  }
  if (v.isDevice()) return put(key, 'D'), put(key, v.toDevice().type()), put(key, v.toDevice().index()), true;
  if (v.isIntList()) return put(key, 'I'), put_ints(key, v.toIntVector()), true;
  if (v.isList()) {
    const auto list = v.toListRef();
    put(key, 'L');
    put(key, list.size());
    for (const c10::IValue& e : list) {
      if (!add(e, exact)) return false;
    }
    return true;
  }
  return false;
}

void CallKey::add_output(const c10::IValue& v) {
  put(shape_, 'O');
  const bool defined = v.isTensor() && v.toTensor().defined();
  put(shape_, defined ? v.toTensor().scalar_type() : at::ScalarType::Undefined);
  if (!defined) return;
  const at::Tensor& t = v.toTensor();
  put(shape_, t.device().type());
  put_ints(shape_, t.sizes());
  put_ints(shape_, t.strides());
}

void CallKey::add_settings() {
  put(shape_, c10::typeMetaToScalarType(c10::get_default_dtype()));
  // (A few CPU kernels read grad mode: mkldnn_rnn_layer returns a workspace
  // only with it on. A queued call runs with the caller's: QueuedCall.)
  put(shape_, at::GradMode::is_enabled());
}

std::optional<Answer> run_meta(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  torch::jit::Stack meta;
  meta.reserve(args.size());
  for (const c10::IValue& v : args) meta.push_back(map_tensors(v, to_meta));
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  Specs specs;
  for (const c10::IValue& r : meta) {
    const at::Tensor& m = r.toTensor();
    if (!m.defined() || c10::isQIntType(m.scalar_type())) return Answer();
    specs.push_back({m.sizes().vec(), m.strides().vec(), m.scalar_type()});
  }
  return Answer(std::move(specs));
}

namespace {

// The key of a call of a kernel of its own (see known_outputs); false if the
// call has an argument a key cannot describe.
bool own_kernel_key(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, CallKey& key) {
  const Plan& plan = plan_for(op);
  key.clear();
  key.add_settings();
  bool cacheable = true;
  for (const c10::IValue& v : args) cacheable = cacheable && key.add(v, plan.exact_key);
  return cacheable;
}

} // namespace

std::optional<Specs> known_outputs(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  thread_local CallKey key;
  if (!own_kernel_key(op, args, key)) return std::nullopt;
  const auto hit = plan_for(op).meta_cache.find(key.shape());
  if (!hit || !hit->answer) return std::nullopt;
  return *hit->answer;
}

void remember_outputs(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                      const std::vector<at::Tensor>& outputs) {
  CallKey key;
  if (!own_kernel_key(op, args, key)) return;
  Specs specs;
  for (const at::Tensor& t : outputs) {
    if (!t.defined() || t.layout() != c10::kStrided || t.storage_offset() != 0 || !t.is_non_overlapping_and_dense()) {
      return;
    }
    specs.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  }
  plan_for(op).meta_cache.insert(key.shape(), Answer(std::move(specs)));
}

} // namespace my_device
