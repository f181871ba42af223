#include "Elementwise.h"

#include <ATen/TensorIterator.h>
#include <ATen/ops/as_strided.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <limits>
#include <sstream>

namespace my_device::compiler {

namespace {

// Elements per interpreted instruction: large enough that the switch is
// noise, small enough that the registers a kernel uses stay in L1/L2.
constexpr int kChunk = 256;

inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

constexpr float kSqrt1_2 = 0.70710678118654752440f;
constexpr float kBeta = 0.79788456080286535588f;  // sqrt(2/pi)
constexpr float kKappa = 0.044715f;

inline float gelu_grad(float x) {
  const float cdf = 0.5f * (1.0f + std::erf(x * kSqrt1_2));
  const float pdf = std::exp(-0.5f * x * x) * 0.39894228040143267794f;
  return cdf + x * pdf;
}

inline float gelu_tanh_grad(float x) {
  const float inner = kBeta * (x + kKappa * x * x * x);
  const float t = std::tanh(inner);
  const float left = 0.5f * x;
  const float right = 1.0f + t;
  const float left_derivative = 0.5f * right;
  const float right_derivative = left * (1.0f - t * t) * kBeta * (1.0f + 3.0f * kKappa * x * x);
  return left_derivative + right_derivative;
}

// Each case is one loop over the chunk's elements (rounded up to a multiple
// of 8, the lanes beyond them being scratch), which the compiler vectorizes;
// on x86 a second copy is built for AVX2 and picked at load time when the CPU
// has it (the extension itself targets baseline x86-64). Transcendental
// functions are libm calls the compiler cannot vectorize: with AVX2 they are
// SLEEF's vector functions instead, the ones ATen's own CPU kernels use.
#define MYDEV_UNARY(EXPR)                          \
  for (int i = 0; i < m; ++i) {                    \
    const float x = a[i];                          \
    d[i] = (EXPR);                                 \
  }                                                \
  break;
#define MYDEV_BINARY(EXPR)                         \
  for (int i = 0; i < m; ++i) {                    \
    const float x = a[i], y = b[i];                \
    d[i] = (EXPR);                                 \
  }                                                \
  break;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// SLEEF's 8-lane AVX2 functions, exported by libtorch_cpu (ATen's
// Vectorized<float> calls them): declared and called only in AVX2 code.
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>
extern "C" {
__m256 Sleef_tanhf8_u10avx2(__m256);
__m256 Sleef_expf8_u10avx2(__m256);
__m256 Sleef_logf8_u10avx2(__m256);
__m256 Sleef_erff8_u10avx2(__m256);
__m256 Sleef_sinf8_u10avx2(__m256);
__m256 Sleef_cosf8_u10avx2(__m256);
__m256 Sleef_log1pf8_u10avx2(__m256);
__m256 Sleef_expm1f8_u10avx2(__m256);
}
namespace vector_math {
// `m` is a multiple of 8.
#define MYDEV_SLEEF_MAP(NAME, BODY)                                      \
  void NAME(float* d, const float* a, int m) {                          \
    for (int i = 0; i < m; i += 8) {                                     \
      const __m256 x = _mm256_loadu_ps(a + i);                           \
      _mm256_storeu_ps(d + i, (BODY));                                   \
    }                                                                    \
  }
MYDEV_SLEEF_MAP(tanh, Sleef_tanhf8_u10avx2(x))
MYDEV_SLEEF_MAP(exp, Sleef_expf8_u10avx2(x))
MYDEV_SLEEF_MAP(log, Sleef_logf8_u10avx2(x))
MYDEV_SLEEF_MAP(erf, Sleef_erff8_u10avx2(x))
MYDEV_SLEEF_MAP(sin, Sleef_sinf8_u10avx2(x))
MYDEV_SLEEF_MAP(cos, Sleef_cosf8_u10avx2(x))
MYDEV_SLEEF_MAP(log1p, Sleef_log1pf8_u10avx2(x))
MYDEV_SLEEF_MAP(expm1, Sleef_expm1f8_u10avx2(x))
MYDEV_SLEEF_MAP(sigmoid, _mm256_div_ps(_mm256_set1_ps(1.0f),
                                       _mm256_add_ps(_mm256_set1_ps(1.0f),
                                                     Sleef_expf8_u10avx2(_mm256_sub_ps(_mm256_setzero_ps(), x)))))
MYDEV_SLEEF_MAP(gelu, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x),
                                    _mm256_add_ps(_mm256_set1_ps(1.0f),
                                                  Sleef_erff8_u10avx2(_mm256_mul_ps(x, _mm256_set1_ps(kSqrt1_2))))))
MYDEV_SLEEF_MAP(gelu_tanh,
                _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x),
                              _mm256_add_ps(_mm256_set1_ps(1.0f),
                                            Sleef_tanhf8_u10avx2(_mm256_mul_ps(
                                                _mm256_set1_ps(kBeta),
                                                _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(kKappa),
                                                                               _mm256_mul_ps(x, _mm256_mul_ps(x, x)))))))))
#undef MYDEV_SLEEF_MAP
} // namespace vector_math
#pragma GCC pop_options
// MYDEV_COMPILER_VECTOR_MATH=0 keeps libm on AVX2 machines too (the path
// other machines take, which the tests run that way).
bool vector_math_wanted() {
  const char* env = std::getenv("MYDEV_COMPILER_VECTOR_MATH");
  return env == nullptr || std::string(env) != "0";
}
const bool kVectorMath = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && vector_math_wanted();
#define MYDEV_VECTOR_MATH(NAME)     \
  if (kVectorMath) {                \
    vector_math::NAME(d, a, m);     \
    break;                          \
  }
#else
#define MYDEV_VECTOR_MATH(NAME)
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MYDEV_VECTOR_CLONES __attribute__((target_clones("avx2", "default"), optimize("O3")))
#else
#define MYDEV_VECTOR_CLONES
#endif

// `regs[r]` points at register r's kChunk floats: scratch, or for a full
// chunk of a contiguous Float operand, the operand's memory itself. Registers
// are written once (SSA), so a destination never aliases its sources.
MYDEV_VECTOR_CLONES void execute(const Instr& in, float* const* regs, int n) {
  const int m = (n + 7) & ~7;
  float* __restrict d = regs[in.dst];
  const float* __restrict a = regs[in.a];
  const float* __restrict b = regs[in.b];
  const float* __restrict c = regs[in.c];
  const float k = in.imm;
  switch (in.op) {
    case Opcode::Load:
      break;  // done by the caller
    case Opcode::Const:
      for (int i = 0; i < m; ++i) d[i] = k;
      break;
    case Opcode::Add: MYDEV_BINARY(x + y)
    case Opcode::Sub: MYDEV_BINARY(x - y)
    case Opcode::Mul: MYDEV_BINARY(x * y)
    case Opcode::Div: MYDEV_BINARY(x / y)
    // NaN-propagating, as torch.maximum/minimum and clamp are.
    case Opcode::Max: MYDEV_BINARY((x != x || y != y) ? x + y : (x > y ? x : y))
    case Opcode::Min: MYDEV_BINARY((x != x || y != y) ? x + y : (x < y ? x : y))
    case Opcode::Pow: MYDEV_BINARY(std::pow(x, y))
    case Opcode::Gt: MYDEV_BINARY(x > y ? 1.0f : 0.0f)
    case Opcode::Ge: MYDEV_BINARY(x >= y ? 1.0f : 0.0f)
    case Opcode::Lt: MYDEV_BINARY(x < y ? 1.0f : 0.0f)
    case Opcode::Le: MYDEV_BINARY(x <= y ? 1.0f : 0.0f)
    case Opcode::Eq: MYDEV_BINARY(x == y ? 1.0f : 0.0f)
    case Opcode::Ne: MYDEV_BINARY(x != y ? 1.0f : 0.0f)
    case Opcode::Where:
      for (int i = 0; i < m; ++i) d[i] = a[i] != 0.0f ? b[i] : c[i];
      break;
    case Opcode::Neg: MYDEV_UNARY(-x)
    case Opcode::Abs: MYDEV_UNARY(std::fabs(x))
    case Opcode::Relu: MYDEV_UNARY(x != x ? x : (x > 0.0f ? x : 0.0f))
    case Opcode::Tanh: MYDEV_VECTOR_MATH(tanh) MYDEV_UNARY(std::tanh(x))
    case Opcode::Sigmoid: MYDEV_VECTOR_MATH(sigmoid) MYDEV_UNARY(sigmoid(x))
    case Opcode::Exp: MYDEV_VECTOR_MATH(exp) MYDEV_UNARY(std::exp(x))
    case Opcode::Log: MYDEV_VECTOR_MATH(log) MYDEV_UNARY(std::log(x))
    case Opcode::Sqrt: MYDEV_UNARY(std::sqrt(x))
    case Opcode::Rsqrt: MYDEV_UNARY(1.0f / std::sqrt(x))
    case Opcode::Reciprocal: MYDEV_UNARY(1.0f / x)
    case Opcode::Erf: MYDEV_VECTOR_MATH(erf) MYDEV_UNARY(std::erf(x))
    case Opcode::Sin: MYDEV_VECTOR_MATH(sin) MYDEV_UNARY(std::sin(x))
    case Opcode::Cos: MYDEV_VECTOR_MATH(cos) MYDEV_UNARY(std::cos(x))
    case Opcode::Log1p: MYDEV_VECTOR_MATH(log1p) MYDEV_UNARY(std::log1p(x))
    case Opcode::Expm1: MYDEV_VECTOR_MATH(expm1) MYDEV_UNARY(std::expm1(x))
    case Opcode::Sign: MYDEV_UNARY(x != x ? x : static_cast<float>((x > 0.0f) - (x < 0.0f)))
    case Opcode::Not: MYDEV_UNARY(x == 0.0f ? 1.0f : 0.0f)
    case Opcode::Gelu: MYDEV_VECTOR_MATH(gelu) MYDEV_UNARY(0.5f * x * (1.0f + std::erf(x * kSqrt1_2)))
    case Opcode::GeluTanh: MYDEV_VECTOR_MATH(gelu_tanh) MYDEV_UNARY(0.5f * x * (1.0f + std::tanh(kBeta * (x + kKappa * x * x * x))))
    case Opcode::GeluBackward: MYDEV_BINARY(x * gelu_grad(y))
    case Opcode::GeluTanhBackward: MYDEV_BINARY(x * gelu_tanh_grad(y))
    case Opcode::TanhBackward: MYDEV_BINARY(x * (1.0f - y * y))
    case Opcode::SigmoidBackward: MYDEV_BINARY(x * (1.0f - y) * y)
    case Opcode::ThresholdBackward: MYDEV_BINARY(y <= k ? 0.0f : x)
  }
}
#undef MYDEV_UNARY
#undef MYDEV_BINARY
#undef MYDEV_VECTOR_MATH

void load(float* dst, const char* p, int64_t stride, int n, c10::ScalarType t) {
  if (t == c10::ScalarType::Float) {
    if (stride == sizeof(float)) {
      std::copy_n(reinterpret_cast<const float*>(p), n, dst);
    } else if (stride == 0) {
      std::fill_n(dst, n, *reinterpret_cast<const float*>(p));
    } else {
      for (int i = 0; i < n; ++i) dst[i] = *reinterpret_cast<const float*>(p + i * stride);
    }
  } else {  // Bool
    for (int i = 0; i < n; ++i) dst[i] = *reinterpret_cast<const bool*>(p + i * stride) ? 1.0f : 0.0f;
  }
}

void store(char* p, int64_t stride, const float* src, int n, c10::ScalarType t) {
  if (t == c10::ScalarType::Float) {
    if (stride == sizeof(float)) {
      std::copy_n(src, n, reinterpret_cast<float*>(p));
    } else {
      for (int i = 0; i < n; ++i) *reinterpret_cast<float*>(p + i * stride) = src[i];
    }
  } else {
    for (int i = 0; i < n; ++i) *reinterpret_cast<bool*>(p + i * stride) = src[i] != 0.0f;
  }
}

float reduce_identity(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::Max:
      return -std::numeric_limits<float>::infinity();
    case ReduceKind::Min:
      return std::numeric_limits<float>::infinity();
    default:
      return 0.0f;
  }
}

// Folds n values into `acc`, in double for sums, NaN-propagating for max/min.
void fold(double& acc, const float* v, int n, ReduceKind kind) {
  if (kind == ReduceKind::Sum || kind == ReduceKind::Mean) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += v[i];
    acc += s;
    return;
  }
  for (int i = 0; i < n; ++i) {
    const double x = v[i];
    if (std::isnan(acc)) return;
    if (std::isnan(x) || (kind == ReduceKind::Max ? x > acc : x < acc)) acc = x;
  }
}


// Whether the kernel can run as one flat pass: every operand dense and of the
// first output's shape, few enough elements that TensorIterator would not
// split the work across threads, and no output sharing memory with another
// operand (which TensorIterator would check).
bool flat(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs) {
  if (outputs.empty()) return false;
  const at::Tensor& first = outputs[0];
  const int64_t n = first.numel();
  if (n == 0 || n >= kFlatMaxElements) return false;
  for (const auto* list : {&outputs, &inputs}) {
    for (const at::Tensor& t : *list) {
      if (t.sizes() != first.sizes() || !t.is_contiguous()) return false;
    }
  }
  auto range = [](const at::Tensor& t) {
    const char* p = static_cast<const char*>(t.const_data_ptr());
    return std::make_pair(p, p + t.numel() * static_cast<int64_t>(t.element_size()));
  };
  for (size_t o = 0; o < outputs.size(); ++o) {
    const auto [lo, hi] = range(outputs[o]);
    for (const auto* list : {&outputs, &inputs}) {
      for (size_t k = 0; k < list->size(); ++k) {
        if (list == &outputs && k == o) continue;
        const auto [l2, h2] = range((*list)[k]);
        if (lo < h2 && l2 < hi) return false;
      }
    }
  }
  return true;
}

} // namespace

void ElementwiseKernel::run(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs) const {
  TORCH_CHECK(num_registers <= kMaxRegisters, "mydev fused kernel: too many registers (the compiler splits such groups)");
  const bool reducing = reduce != ReduceKind::None;
  const size_t n_stored = stores.size();
  const int n_out = static_cast<int>(n_stored) + (reducing ? 1 : 0);
  const int n_in = static_cast<int>(inputs.size());
  std::vector<c10::ScalarType> types;
  for (int i = 0; i < n_out; ++i) types.push_back(outputs[i].scalar_type());
  for (const at::Tensor& t : inputs) types.push_back(t.scalar_type());
  // Loads come first in `code`, in input order (see Fusion.cpp).
  // Registers computed by math (not loads) and stored to exactly one output
  // can be computed in the output's memory directly.
  std::vector<int> computed_by(num_registers, -1);
  for (size_t i = 0; i < code.size(); ++i) computed_by[code[i].dst] = code[i].op == Opcode::Load ? -1 : 1;
  std::vector<bool> direct(n_stored, false);
  for (size_t o = 0; o < n_stored; ++o) {
    direct[o] = computed_by[stores[o]] == 1 && std::count(stores.begin(), stores.end(), stores[o]) == 1 &&
                types[o] == c10::ScalarType::Float;
  }
  auto loop = [&](char** data, const int64_t* strides, int64_t size0, int64_t size1) {
    alignas(64) float scratch[kMaxRegisters * kChunk];
    float* regs[kMaxRegisters];
    const int ntensors = n_out + n_in;
    for (int64_t outer = 0; outer < size1; ++outer) {
      double acc = reduce_identity(reduce);
      const int64_t out_stride = reducing ? strides[n_out - 1] : 0;
      for (int64_t start = 0; start < size0; start += kChunk) {
        const int n = static_cast<int>(std::min<int64_t>(kChunk, size0 - start));
        const bool full = n == kChunk;
        for (int r = 0; r < num_registers; ++r) regs[r] = scratch + r * kChunk;
        for (size_t o = 0; o < n_stored; ++o) {
          if (full && direct[o] && strides[o] == sizeof(float)) {
            regs[stores[o]] = reinterpret_cast<float*>(data[o] + start * strides[o]);
          }
        }
        for (const Instr& in : code) {
          if (in.op == Opcode::Load) {
            const int k = n_out + in.a;
            char* p = data[k] + start * strides[k];
            if (full && strides[k] == sizeof(float) && types[k] == c10::ScalarType::Float) {
              regs[in.dst] = reinterpret_cast<float*>(p);
            } else {
              load(regs[in.dst], p, strides[k], n, types[k]);
            }
          } else {
            execute(in, regs, n);
          }
        }
        for (size_t o = 0; o < n_stored; ++o) {
          char* p = data[o] + start * strides[o];
          if (reinterpret_cast<char*>(regs[stores[o]]) != p) store(p, strides[o], regs[stores[o]], n, types[o]);
        }
        if (reducing) {
          const float* v = regs[reduce_register];
          char* p = data[n_out - 1] + start * out_stride;
          if (out_stride == 0) {
            fold(acc, v, n, reduce);
          } else {
            for (int i = 0; i < n; ++i) {
              double e = *reinterpret_cast<float*>(p + i * out_stride);
              fold(e, v + i, 1, reduce);
              *reinterpret_cast<float*>(p + i * out_stride) = static_cast<float>(e);
            }
          }
        }
      }
      if (reducing && out_stride == 0 && size0 > 0) {
        float* p = reinterpret_cast<float*>(data[n_out - 1]);
        double e = *p;
        if (reduce == ReduceKind::Sum || reduce == ReduceKind::Mean) {
          e += acc;
        } else {
          float a = static_cast<float>(acc);
          fold(e, &a, 1, reduce);
        }
        *p = static_cast<float>(e);
      }
      for (int k = 0; k < ntensors; ++k) data[k] += strides[ntensors + k];
    }
  };
  if (!reducing && flat(outputs, inputs)) {
    // Small dense operands of one shape: one pass over their memory, without
    // building a TensorIterator (which costs more than the arithmetic here).
    const int ntensors = n_out + n_in;
    std::vector<char*> data(ntensors);
    std::vector<int64_t> strides(2 * ntensors, 0);
    for (int k = 0; k < ntensors; ++k) {
      const at::Tensor& t = k < n_out ? outputs[k] : inputs[k - n_out];
      data[k] = static_cast<char*>(const_cast<void*>(t.const_data_ptr()));
      strides[k] = static_cast<int64_t>(t.element_size());
    }
    loop(data.data(), strides.data(), outputs[0].numel(), 1);
    return;
  }
  at::TensorIteratorConfig config;
  config.check_all_same_dtype(false).resize_outputs(false).set_check_mem_overlap(!reducing);
  at::Tensor reduced;  // the reduction output seen over the whole iteration shape (stride 0 on reduced dims)
  for (size_t i = 0; i < n_stored; ++i) config.add_output(outputs[i]);
  if (reducing) {
    const at::Tensor& out = outputs[n_stored];
    out.fill_(reduce_identity(reduce));
    std::vector<int64_t> strides(reduce_shape.size(), 0);
    size_t od = 0;
    for (size_t d = 0; d < reduce_shape.size(); ++d) {
      const bool reduced_dim = std::find(reduce_dims.begin(), reduce_dims.end(), d) != reduce_dims.end();
      if (reduced_dim) {
        if (keepdim) ++od;
      } else {
        strides[d] = out.stride(od++);
      }
    }
    reduced = at::as_strided(out, reduce_shape, strides, out.storage_offset());
    config.add_output(reduced).is_reduction(true);
  }
  for (const at::Tensor& t : inputs) config.add_const_input(t);
  at::TensorIterator iter = config.build();
  if (reducing) {
    // One thread: reduced outputs are accumulated in place.
    iter.serial_for_each(loop, {0, iter.numel()});
    if (reduce == ReduceKind::Mean) outputs[n_stored].div_(static_cast<double>(reduce_count));
  } else {
    iter.for_each(loop);
  }
}

bool vector_math_enabled() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  return kVectorMath;
#else
  return false;
#endif
}

const char* opcode_name(Opcode op) {
  switch (op) {
#define MYDEV_OPCODE_NAME(name) \
  case Opcode::name:            \
    return #name;
    MYDEV_OPCODE_NAME(Load) MYDEV_OPCODE_NAME(Const) MYDEV_OPCODE_NAME(Add) MYDEV_OPCODE_NAME(Sub)
    MYDEV_OPCODE_NAME(Mul) MYDEV_OPCODE_NAME(Div) MYDEV_OPCODE_NAME(Max) MYDEV_OPCODE_NAME(Min)
    MYDEV_OPCODE_NAME(Pow) MYDEV_OPCODE_NAME(Gt) MYDEV_OPCODE_NAME(Ge) MYDEV_OPCODE_NAME(Lt)
    MYDEV_OPCODE_NAME(Le) MYDEV_OPCODE_NAME(Eq) MYDEV_OPCODE_NAME(Ne) MYDEV_OPCODE_NAME(Where)
    MYDEV_OPCODE_NAME(Neg) MYDEV_OPCODE_NAME(Abs) MYDEV_OPCODE_NAME(Relu) MYDEV_OPCODE_NAME(Tanh)
    MYDEV_OPCODE_NAME(Sigmoid) MYDEV_OPCODE_NAME(Exp) MYDEV_OPCODE_NAME(Log) MYDEV_OPCODE_NAME(Sqrt)
    MYDEV_OPCODE_NAME(Rsqrt) MYDEV_OPCODE_NAME(Reciprocal) MYDEV_OPCODE_NAME(Erf) MYDEV_OPCODE_NAME(Sin)
    MYDEV_OPCODE_NAME(Cos) MYDEV_OPCODE_NAME(Log1p) MYDEV_OPCODE_NAME(Expm1) MYDEV_OPCODE_NAME(Sign)
    MYDEV_OPCODE_NAME(Gelu) MYDEV_OPCODE_NAME(GeluTanh) MYDEV_OPCODE_NAME(GeluBackward)
    MYDEV_OPCODE_NAME(GeluTanhBackward) MYDEV_OPCODE_NAME(TanhBackward) MYDEV_OPCODE_NAME(SigmoidBackward)
    MYDEV_OPCODE_NAME(ThresholdBackward) MYDEV_OPCODE_NAME(Not)
#undef MYDEV_OPCODE_NAME
  }
  return "?";
}

std::string ElementwiseKernel::str() const {
  std::ostringstream s;
  for (const Instr& in : code) {
    s << "    r" << in.dst << " = " << opcode_name(in.op);
    if (in.op == Opcode::Load) {
      s << " in" << in.a;
    } else if (in.op == Opcode::Const) {
      s << " " << in.imm;
    } else {
      s << " r" << in.a << " r" << in.b << " r" << in.c;
      if (in.op == Opcode::ThresholdBackward) s << " " << in.imm;
    }
    s << "\n";
  }
  for (size_t o = 0; o < stores.size(); ++o) s << "    out" << o << " = r" << stores[o] << "\n";
  if (reduce != ReduceKind::None) {
    static const char* names[] = {"none", "sum", "mean", "max", "min"};
    s << "    out" << stores.size() << " = " << names[static_cast<int>(reduce)] << "(r" << reduce_register
      << ") over dims [";
    for (size_t i = 0; i < reduce_dims.size(); ++i) s << (i ? "," : "") << reduce_dims[i];
    s << "]\n";
  }
  return s.str();
}

} // namespace my_device::compiler
