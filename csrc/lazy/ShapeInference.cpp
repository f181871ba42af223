// Shape functions of mydev's generated Lazy kernels that torch does not export (ShapeInference.h).
#include "ShapeInference.h"

namespace torch::lazy {

// copy(self, src): src's values broadcast into a tensor like self (x[i] = v, functionalized).
std::vector<torch::lazy::Shape> compute_shape_copy(const at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  return {torch::lazy::Shape(self.scalar_type(), self.sizes().vec())};
}

// as_strided_scatter(self, src, ...): self with src written into a strided window of it.
std::vector<torch::lazy::Shape> compute_shape_as_strided_scatter(const at::Tensor& self, const at::Tensor& src,
                                                                 at::IntArrayRef size, at::IntArrayRef stride,
                                                                 std::optional<int64_t> storage_offset) {
  return {torch::lazy::Shape(self.scalar_type(), self.sizes().vec())};
}

} // namespace torch::lazy
