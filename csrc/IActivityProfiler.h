// Forwards to Kineto's header. torch/csrc/profiler/standalone/privateuse1_profiler.h
// includes <IActivityProfiler.h> as if torch/include/kineto were on the include
// path, which it is when PyTorch itself builds but not for an extension
// (torch.utils.cpp_extension adds torch/include only). Adding that directory in
// setup.py would change every file's command line (and so miss the compiler
// cache for all of them); csrc/ is on the path already, so this file answers.
// Used by profiler/ActivityProfiler.cpp only.
#pragma once
#include <kineto/IActivityProfiler.h>
