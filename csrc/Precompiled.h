// The torch headers most of csrc's translation units parse, compiled once per build into a
// precompiled header (setup.py, precompiled_header) that every unit is given with -include.
// Parsing these headers is most of a unit's compile time; a cold build of the extension on
// two cores takes about half as long with them precompiled. Nothing may depend on this file
// for its declarations: each source still includes what it uses, so the build is correct
// without the precompiled header (a compiler that rejects it parses the headers instead).
#pragma once
#include <ATen/ATen.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
