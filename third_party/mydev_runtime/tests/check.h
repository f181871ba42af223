// The runtime tests' checks. No framework: CHECK stops at the first failure
// with file:line and the expression; each test binary prints g_passed at the end.
#ifndef MYDEV_RUNTIME_TESTS_CHECK_H
#define MYDEV_RUNTIME_TESTS_CHECK_H

#include "mydev_runtime.h"

#include <cstdio>
#include <cstdlib>

inline int g_passed = 0;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (cond) {                                                              \
      ++g_passed;                                                            \
    } else {                                                                 \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

// Like CHECK, but names both errors when they differ.
#define CHECK_ERR(expr, expected)                                                   \
  do {                                                                              \
    mydevError_t got_ = (expr);                                                     \
    if (got_ == (expected)) {                                                       \
      ++g_passed;                                                                   \
    } else {                                                                        \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s returned %s, expected %s\n",    \
                   __FILE__, __LINE__, #expr, mydevGetErrorName(got_),              \
                   mydevGetErrorName(expected));                                    \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

#define CHECK_OK(expr) CHECK_ERR(expr, mydevSuccess)

#endif  // MYDEV_RUNTIME_TESTS_CHECK_H
