// Prepended to every kernel Inductor generates for mydev (kernels.py, and the
// C++ wrapper's header in cpp_wrapper.py).
//
// Why: on AVX2, at::vec moves a float lane mask to and from bool memory
// through its generic path (VecMask::store(bool*) and VecMask::from(bool*)
// convert lane by lane through stack buffers). A compiled relu stores its
// backward mask that way, and on this project's machines the store took
// 1.1 ms for 128K elements against 28 us here; the load 190 against 30 us.
// Generated CPU kernels pay the same cost; mydev's kernels need not. Explicit
// specializations of two members of VecMask<float, 1>: if at::vec gains its
// own, this stops compiling and test_inductor.py says so.
#pragma once
#include <torch/csrc/inductor/cpp_prefix.h>

#if defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
#include <cstring>

namespace at::vec {
inline namespace CPU_CAPABILITY {

// Each float lane of a mask is all ones or all zeros: pack them to 0/1 bytes.
template <>
inline void VecMask<float, 1>::store(bool* b, int count) {
  const __m256i lanes = _mm256_castps_si256(VectorizedN<float, 1>(*this)[0]);
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
  const __m128i bytes = _mm_and_si128(_mm_packs_epi16(words, words), _mm_set1_epi8(1));
  if (count >= 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(b), bytes);
  } else if (count > 0) {
    alignas(16) char staged[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(staged), bytes);
    std::memcpy(b, staged, count);
  }
}

inline VecMask<float, 1> mydev_mask_from_bytes(const bool* b, int count) {
  __m128i bytes;
  if (count >= 8) {
    bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b));
  } else {
    alignas(16) char staged[16] = {};
    if (count > 0) std::memcpy(staged, b, count);
    bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(staged));
  }
  const __m256i lanes = _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(bytes), _mm256_setzero_si256());
  return VectorizedN<float, 1>(Vectorized<float>(_mm256_castsi256_ps(lanes)));
}

template <>
template <>
inline VecMask<float, 1> VecMask<float, 1>::from<bool>(bool* b, int count) {
  return mydev_mask_from_bytes(b, count);
}

template <>
template <>
inline VecMask<float, 1> VecMask<float, 1>::from<const bool>(const bool* b, int count) {
  return mydev_mask_from_bytes(b, count);
}

template <>
template <>
inline VecMask<float, 1> VecMask<float, 1>::from<bool>(bool* b) {
  return mydev_mask_from_bytes(b, 8);
}

template <>
template <>
inline VecMask<float, 1> VecMask<float, 1>::from<const bool>(const bool* b) {
  return mydev_mask_from_bytes(b, 8);
}

} // namespace CPU_CAPABILITY
} // namespace at::vec
#endif
