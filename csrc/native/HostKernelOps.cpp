// Which aten ops run as host kernels on mydev, grouped by op family. Every
// overload of a listed op that has a CPU kernel is registered (functional,
// in-place and out=). Ops PyTorch decomposes (CompositeImplicitAutograd or
// CompositeExplicitAutograd with no CPU kernel of their own, e.g. linear,
// matmul, embedding, dropout, softmax, stack, transpose) need no entry: they
// reach these kernels through their decomposition.
// Ops not listed anywhere in csrc/native go through the copying fallback.
#include "HostKernel.h"

namespace my_device {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Pointwise binary arithmetic.
  register_host_kernels(m, {"add", "sub", "mul", "div", "remainder", "fmod", "pow", "maximum", "minimum",
                            "fmax", "fmin", "atan2", "hypot", "copysign", "floor_divide", "lerp", "addcmul",
                            "addcdiv", "xlogy", "rsub", "heaviside", "nextafter", "clamp", "clamp_min",
                            "clamp_max", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
                            "bitwise_left_shift", "bitwise_right_shift"});
  // Comparisons and logic.
  register_host_kernels(m, {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
                            "logical_not", "isnan", "isinf", "isposinf", "isneginf", "signbit", "equal",
                            "isin"});
  // Pointwise unary math.
  register_host_kernels(m, {"abs", "neg", "sign", "sgn", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log2",
                            "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                            "asinh", "acosh", "atanh", "sigmoid", "logit", "erf", "erfc", "erfinv", "floor",
                            "ceil", "round", "trunc", "frac", "reciprocal", "nan_to_num", "lgamma", "digamma",
                            "polygamma", "i0", "sinc", "deg2rad", "rad2deg", "angle", "conj_physical"});
  // Reductions, scans and sorting.
  register_host_kernels(m, {"sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "std",
                            "var", "std_mean", "var_mean", "norm", "linalg_vector_norm", "logsumexp", "cumsum",
                            "cumprod", "all", "any", "aminmax", "nansum", "count_nonzero", "median",
                            "nanmedian", "mode", "sort", "topk", "kthvalue", "cummax", "cummin",
                            "logcumsumexp", "_is_all_true", "_is_any_true"});
  // Matrix products.
  register_host_kernels(m, {"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "addr",
                            "_addmm_activation"});
  // Activations and their backward kernels.
  register_host_kernels(m, {"relu", "gelu", "gelu_backward", "silu", "silu_backward", "hardtanh",
                            "hardtanh_backward", "threshold", "threshold_backward", "leaky_relu",
                            "leaky_relu_backward", "elu", "elu_backward", "softplus", "softplus_backward",
                            "hardsigmoid", "hardsigmoid_backward", "hardswish", "hardswish_backward", "mish",
                            "mish_backward", "sigmoid_backward", "tanh_backward", "log_sigmoid_forward",
                            "log_sigmoid_backward", "glu", "glu_backward", "_prelu_kernel",
                            "_prelu_kernel_backward"});
  // Softmax and losses.
  register_host_kernels(m, {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
                            "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
                            "mse_loss", "mse_loss_backward", "binary_cross_entropy",
                            "binary_cross_entropy_backward", "smooth_l1_loss", "smooth_l1_loss_backward",
                            "huber_loss", "huber_loss_backward"});
  // Indexing, selection and joining.
  register_host_kernels(m, {"where", "cat", "index", "index_put", "_index_put_impl", "index_select",
                            "index_add", "index_fill", "index_copy", "index_reduce", "gather", "scatter",
                            "scatter_add", "scatter_reduce", "masked_fill", "masked_select", "masked_scatter",
                            "take", "put", "nonzero", "embedding_dense_backward", "embedding_renorm", "flip",
                            "roll", "tril", "triu", "_unique2", "unique_consecutive", "unique_dim", "bincount",
                            "histc", "searchsorted", "bucketize", "linalg_cross", "repeat_interleave"});
  // Filling and creation.
  register_host_kernels(m, {"fill", "zero", "arange", "linspace", "logspace", "eye", "tril_indices",
                            "triu_indices", "randperm"});
  // Random sampling (drawn from the mydev generator; native_dropout is in Random.cpp).
  register_host_kernels(m, {"bernoulli", "native_dropout_backward", "uniform", "normal",
                            "random", "exponential", "geometric", "cauchy", "log_normal", "multinomial"});
  // Normalisation.
  register_host_kernels(m, {"native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
                            "native_batch_norm_backward", "_native_batch_norm_legit",
                            "_native_batch_norm_legit_no_training", "native_group_norm",
                            "native_group_norm_backward", "batch_norm_update_stats"});
  // Pooling, resampling and padding.
  register_host_kernels(m, {"max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d",
                            "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
                            "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "upsample_nearest2d",
                            "upsample_nearest2d_backward", "upsample_bilinear2d", "upsample_bilinear2d_backward",
                            "im2col", "col2im", "reflection_pad2d", "replication_pad2d", "constant_pad_nd"});
  // Fused optimizer steps and AMP's gradient unscaling.
  register_host_kernels(m, {"_fused_adam", "_fused_adamw", "_fused_sgd", "_amp_foreach_non_finite_check_and_unscale",
                            "_amp_update_scale"});
}

} // namespace my_device
