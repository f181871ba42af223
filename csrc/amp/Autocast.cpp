// torch.autocast("mydev"): without a kernel for the AutocastPrivateUse1 key the
// first op under autocast fails ("Could not run 'aten::t' ... 'Autocastmydev'").
// Falling through keeps every op at its input dtype; per-op cast policies
// (lower_precision_fp / fp32 lists, as CUDA's) are registered on top of this.
#include <torch/library.h>

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}
