#pragma once
// ATen's DispatchStub as the torch wheel's libtorch_cpu was built: with its
// CPU-capability kernels. The header declares the matching members (and the
// matching signature of DispatchStubImpl::get_call_ptr, which a call of a stub
// links against) only when these are defined, so include it from here.
#if defined(__x86_64__)
#define HAVE_AVX2_CPU_DEFINITION
#define HAVE_AVX512_CPU_DEFINITION
#endif

#include <ATen/native/DispatchStub.h>
