#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace my_device {

// native_dropout of mydev, eager (Random.cpp) and traced (csrc/lazy): a keep
// mask drawn by bernoulli from the device's generator, then the scaled input.
// One definition, so that both draw the same numbers from the same seed.
std::tuple<at::Tensor, at::Tensor> native_dropout_by_bernoulli(const at::Tensor& input, double p,
                                                               std::optional<bool> train);

} // namespace my_device
