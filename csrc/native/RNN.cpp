// The fused RNN cells: _thnn_fused_lstm_cell, _thnn_fused_gru_cell and their
// backward ops, queued on the stream; and nn.LSTM on the CPU's oneDNN path (at
// the end of the file).
//
// Why mydev needs them: ATen's LSTM and GRU cells (aten/src/ATen/native/RNN.cpp)
// take the fused-cell path for CUDA, XPU and PrivateUse1 inputs: the two gate
// matrix products, then one op for the gates' pointwise math. PyTorch ships those
// ops for CUDA only, so neither a host kernel (there is no CPU kernel to run) nor
// the copying fallback can serve them, and nn.LSTM, nn.GRU, LSTMCell and GRUCell
// fail on mydev. Every output's shape follows from the inputs', so the kernels
// are queued (launch_async): the checks run at the call, the math on the worker,
// written with aten ops on the CPU tensors over the device bytes.
//
// Workspaces (saved by autograd for the backward op, read by nothing else):
//  LSTM [B, 4H]: the activated gates i, f, g, o;
//  GRU  [B, 5H]: r, z, n, hx, and the hidden part of the new gate (with its bias).
// Their derivative formulas are PyTorch's (derivatives.yaml); when a double
// backward is recorded, PyTorch calls the differentiable composite backward
// (_thnn_differentiable_*_cell_backward) instead, which needs no kernel here.
#include "CpuDispatchStub.h"  // (first: see the header)

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/RNN.h>
#include <ATen/ops/lstm_native.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "Factory.h"
#include "hostkernel/HostKernel.h"
#include "core/KernelArgs.h"
#include "core/Launch.h"

namespace my_device {
namespace {

bool has(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined();
}

// The checks of ATen's fused-cell kernels: 2-d gates of equal shape, a [B, H]
// state with n_gates * H == gates.size(1), 1-d biases of the gates' width, one
// dtype and one device.
void check_cell(const char* op, const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                const at::Tensor& state, const std::optional<at::Tensor>& input_bias,
                const std::optional<at::Tensor>& hidden_bias, int64_t n_gates) {
  TORCH_CHECK(input_gates.dim() == 2, op, ": input_gates must be 2-d, got ", input_gates.dim(), " dims");
  TORCH_CHECK(input_gates.sizes() == hidden_gates.sizes(), op, ": input_gates has shape ", input_gates.sizes(),
              " but hidden_gates has shape ", hidden_gates.sizes());
  TORCH_CHECK(state.dim() == 2 && state.size(0) == input_gates.size(0) &&
                  state.size(1) * n_gates == input_gates.size(1),
              op, ": the state must have shape [", input_gates.size(0), ", ", input_gates.size(1) / n_gates,
              "] for gates of shape ", input_gates.sizes(), ", got ", state.sizes());
  TORCH_CHECK(has(input_bias) == has(hidden_bias), op, ": input_bias and hidden_bias must both be given or both be None");
  const at::Tensor* tensors[] = {&hidden_gates, &state, has(input_bias) ? &*input_bias : nullptr,
                                 has(hidden_bias) ? &*hidden_bias : nullptr};
  for (const at::Tensor* t : tensors) {
    if (t == nullptr) continue;
    TORCH_CHECK(t->device() == input_gates.device(), op, ": expected all inputs to be on the same device, got ",
                input_gates.device(), " and ", t->device());
    TORCH_CHECK(t->scalar_type() == input_gates.scalar_type(), op,
                ": expected all inputs to have the same dtype, got ", input_gates.scalar_type(), " and ",
                t->scalar_type());
  }
  if (has(input_bias)) {
    for (const at::Tensor* bias : {&*input_bias, &*hidden_bias}) {
      TORCH_CHECK(bias->dim() == 1 && bias->size(0) == input_gates.size(1), op, ": the biases must have shape [",
                  input_gates.size(1), "], got ", bias->sizes());
    }
  }
}

std::optional<at::Tensor> own_optional(KernelArgs& held, const std::optional<at::Tensor>& t) {
  return has(t) ? std::optional<at::Tensor>(held.own(*t)) : std::nullopt;
}

at::Tensor like(const at::Tensor& t, c10::IntArrayRef sizes) {
  return empty_device(sizes, {}, t.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor& input_gates,
                                                               const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                               const std::optional<at::Tensor>& input_bias,
                                                               const std::optional<at::Tensor>& hidden_bias) {
  constexpr char kOp[] = "_thnn_fused_lstm_cell";
  check_cell(kOp, input_gates, hidden_gates, cx, input_bias, hidden_bias, 4);
  at::Tensor hy = like(cx, cx.sizes());
  at::Tensor cy = like(cx, cx.sizes());
  at::Tensor workspace = like(input_gates, input_gates.sizes());
  const c10::DeviceIndex device = input_gates.device().index();
  KernelArgs held(device);
  launch_async(device, "aten::_thnn_fused_lstm_cell",
               [ig = held.own(input_gates), hg = held.own(hidden_gates), cx = held.own(cx),
                ib = own_optional(held, input_bias), hb = own_optional(held, hidden_bias), hy = held.own(hy),
                cy = held.own(cy), ws = held.own(workspace)] {
                 HostCall call(ws.device().index());
                 at::Tensor gates = ib ? (call.to_host(ig) + *call.to_host(ib)) + (call.to_host(hg) + *call.to_host(hb))
                                       : call.to_host(ig) + call.to_host(hg);
                 const auto pre = gates.chunk(4, 1);
                 auto act = call.to_host(ws).chunk(4, 1);  // i, f, g, o
                 at::sigmoid_out(act[0], pre[0]);
                 at::sigmoid_out(act[1], pre[1]);
                 at::tanh_out(act[2], pre[2]);
                 at::sigmoid_out(act[3], pre[3]);
                 at::Tensor h_cy = call.to_host(cy);
                 at::mul_out(h_cy, act[1], call.to_host(cx));
                 h_cy.addcmul_(act[0], act[2]);
                 at::Tensor h_hy = call.to_host(hy);
                 at::tanh_out(h_hy, h_cy);
                 h_hy.mul_(act[3]);
               });
  return {hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward_impl(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  constexpr char kOp[] = "_thnn_fused_lstm_cell_backward_impl";
  if (!has(grad_hy) && !has(grad_cy)) return {};  // as ATen's: nothing flows back
  TORCH_CHECK(workspace.dim() == 2 && cx.dim() == 2 && workspace.size(0) == cx.size(0) &&
                  workspace.size(1) == 4 * cx.size(1) && cy.sizes() == cx.sizes(),
              kOp, ": workspace ", workspace.sizes(), ", cx ", cx.sizes(), " and cy ", cy.sizes(),
              " do not belong to one LSTM cell");
  for (const auto* g : {&grad_hy, &grad_cy}) {
    if (!has(*g)) continue;
    TORCH_CHECK((*g)->sizes() == cx.sizes() && (*g)->device() == cx.device() &&
                    (*g)->scalar_type() == cx.scalar_type(),
                kOp, ": a gradient of shape ", (*g)->sizes(), " (", (*g)->scalar_type(), ", ", (*g)->device(),
                ") does not match the cell state ", cx.sizes(), " (", cx.scalar_type(), ", ", cx.device(), ")");
  }
  at::Tensor grad_gates = like(workspace, workspace.sizes());
  at::Tensor grad_cx = like(cx, cx.sizes());
  at::Tensor grad_bias = has_bias ? like(workspace, {workspace.size(1)}) : at::Tensor();
  const c10::DeviceIndex device = cx.device().index();
  KernelArgs held(device);
  launch_async(device, "aten::_thnn_fused_lstm_cell_backward_impl",
               [ghy = own_optional(held, grad_hy), gcy = own_optional(held, grad_cy), cx = held.own(cx),
                cy = held.own(cy), ws = held.own(workspace), gg = held.own(grad_gates), gcx = held.own(grad_cx),
                gb = grad_bias.defined() ? held.own(grad_bias) : at::Tensor()] {
                 HostCall call(ws.device().index());
                 const auto act = call.to_host(ws).chunk(4, 1);
                 const at::Tensor &i = act[0], &f = act[1], &g = act[2], &o = act[3];
                 const at::Tensor tanh_cy = at::tanh(call.to_host(cy));
                 // d loss / d cy, through hy and directly.
                 at::Tensor h_gcx = call.to_host(gcx);
                 if (ghy) {
                   const at::Tensor h_ghy = *call.to_host(ghy);
                   at::mul_out(h_gcx, h_ghy, o);
                   h_gcx.mul_(1 - tanh_cy * tanh_cy);
                   if (gcy) h_gcx.add_(*call.to_host(gcy));
                 } else {
                   h_gcx.copy_(*call.to_host(gcy));
                 }
                 auto grad = call.to_host(gg).chunk(4, 1);
                 at::mul_out(grad[0], h_gcx, g).mul_(i * (1 - i));
                 at::mul_out(grad[1], h_gcx, call.to_host(cx)).mul_(f * (1 - f));
                 at::mul_out(grad[2], h_gcx, i).mul_(1 - g * g);
                 if (ghy) {
                   at::mul_out(grad[3], *call.to_host(ghy), tanh_cy).mul_(o * (1 - o));
                 } else {
                   grad[3].zero_();
                 }
                 if (gb.defined()) {
                   at::Tensor h_gb = call.to_host(gb);
                   at::sum_out(h_gb, call.to_host(gg), {0});
                 }
                 h_gcx.mul_(f);  // d loss / d cx
               });
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  constexpr char kOp[] = "_thnn_fused_gru_cell";
  check_cell(kOp, input_gates, hidden_gates, hx, input_bias, hidden_bias, 3);
  at::Tensor hy = like(hx, hx.sizes());
  at::Tensor workspace = like(hx, {hx.size(0), 5 * hx.size(1)});
  const c10::DeviceIndex device = input_gates.device().index();
  KernelArgs held(device);
  launch_async(device, "aten::_thnn_fused_gru_cell",
               [ig = held.own(input_gates), hg = held.own(hidden_gates), hx = held.own(hx),
                ib = own_optional(held, input_bias), hb = own_optional(held, hidden_bias), hy = held.own(hy),
                ws = held.own(workspace)] {
                 HostCall call(ws.device().index());
                 const at::Tensor in = ib ? call.to_host(ig) + *call.to_host(ib) : call.to_host(ig);
                 const at::Tensor hid = hb ? call.to_host(hg) + *call.to_host(hb) : call.to_host(hg);
                 const auto in_c = in.chunk(3, 1);
                 const auto hid_c = hid.chunk(3, 1);
                 auto w = call.to_host(ws).chunk(5, 1);  // r, z, n, hx, hn
                 const at::Tensor h_hx = call.to_host(hx);
                 at::sigmoid_out(w[0], in_c[0] + hid_c[0]);
                 at::sigmoid_out(w[1], in_c[1] + hid_c[1]);
                 w[4].copy_(hid_c[2]);
                 at::tanh_out(w[2], in_c[2] + w[0] * w[4]);
                 w[3].copy_(h_hx);
                 at::Tensor h_hy = call.to_host(hy);
                 at::sub_out(h_hy, h_hx, w[2]);
                 h_hy.mul_(w[1]).add_(w[2]);  // n + z * (hx - n)
               });
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  constexpr char kOp[] = "_thnn_fused_gru_cell_backward";
  TORCH_CHECK(grad_hy.dim() == 2 && workspace.dim() == 2 && workspace.size(0) == grad_hy.size(0) &&
                  workspace.size(1) == 5 * grad_hy.size(1),
              kOp, ": workspace ", workspace.sizes(), " does not belong to a GRU cell with output ", grad_hy.sizes());
  TORCH_CHECK(grad_hy.device() == workspace.device() && grad_hy.scalar_type() == workspace.scalar_type(), kOp,
              ": grad_hy (", grad_hy.scalar_type(), ", ", grad_hy.device(), ") and workspace (",
              workspace.scalar_type(), ", ", workspace.device(), ") must have the same dtype and device");
  const int64_t batch = grad_hy.size(0), hidden = grad_hy.size(1);
  at::Tensor grad_input_gates = like(grad_hy, {batch, 3 * hidden});
  at::Tensor grad_hidden_gates = like(grad_hy, {batch, 3 * hidden});
  at::Tensor grad_hx = like(grad_hy, grad_hy.sizes());
  at::Tensor grad_input_bias = has_bias ? like(grad_hy, {3 * hidden}) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? like(grad_hy, {3 * hidden}) : at::Tensor();
  const c10::DeviceIndex device = grad_hy.device().index();
  KernelArgs held(device);
  auto own = [&](const at::Tensor& t) { return t.defined() ? held.own(t) : t; };
  launch_async(device, "aten::_thnn_fused_gru_cell_backward",
               [ghy = held.own(grad_hy), ws = held.own(workspace), gig = held.own(grad_input_gates),
                ghg = held.own(grad_hidden_gates), ghx = held.own(grad_hx), gib = own(grad_input_bias),
                ghb = own(grad_hidden_bias)] {
                 HostCall call(ws.device().index());
                 const auto w = call.to_host(ws).chunk(5, 1);
                 const at::Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
                 const at::Tensor g = call.to_host(ghy);
                 auto gi = call.to_host(gig).chunk(3, 1);
                 auto gh = call.to_host(ghg).chunk(3, 1);
                 at::mul_out(gi[2], g, 1 - z).mul_(1 - n * n);       // d / d(new gate's input)
                 at::mul_out(gi[1], g, hx - n).mul_(z * (1 - z));    // d / d(update gate's input)
                 at::mul_out(gi[0], gi[2], hn).mul_(r * (1 - r));    // d / d(reset gate's input)
                 gh[0].copy_(gi[0]);
                 gh[1].copy_(gi[1]);
                 at::mul_out(gh[2], gi[2], r);
                 at::Tensor h_ghx = call.to_host(ghx);
                 at::mul_out(h_ghx, g, z);
                 if (gib.defined()) {
                   at::Tensor h_gib = call.to_host(gib), h_ghb = call.to_host(ghb);
                   at::sum_out(h_gib, call.to_host(gig), {0});
                   at::sum_out(h_ghb, call.to_host(ghg), {0});
                 }
               });
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias};
}

// nn.LSTM takes the CPU's oneDNN path where the CPU takes it. ATen's lstm (a
// CompositeImplicitAutograd kernel) chooses oneDNN only when every tensor is a
// CPU tensor (use_mkldnn in ATen's RNN.cpp), so on mydev it ran one fused cell
// per time step: other results than the CPU's (3e-8 on a small LSTM) at 1.6x
// its time. This kernel, registered for AutogradPrivateUse1 in the
// composite's place, asks the CPU's question of mydev tensors and, where the
// CPU would take oneDNN, calls the CPU's own entry, lstm_mkldnn_stub: its ops
// (mkldnn_rnn_layer per layer and direction, cat, dropout, stack) reach mydev's
// kernels through the dispatcher, with autograd recording them as on the CPU.
// Packed sequences of equal lengths go there too, as on the CPU (lstm.data).
bool mkldnn_supports(const char* op) {
  const auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
  if (!handle) return false;
  return handle->typed<bool()>().call();
}

bool cpu_would_take_onednn(const at::Tensor& input, at::TensorList hx, at::TensorList params) {
  static const bool bf16 = mkldnn_supports("mkldnn::_is_mkldnn_bf16_supported");
  static const bool fp16 = mkldnn_supports("mkldnn::_is_mkldnn_fp16_supported");
  if (!at::hasMKLDNN() || !at::globalContext().userEnabledMkldnn() || input.numel() == 0 ||
      input.device().type() != kMyDev || hx.size() != 2 || hx[0].sym_size(2) != hx[1].sym_size(2)) {
    return false;  // (an LSTM with projections: ATen's cells on the CPU too)
  }
  for (at::TensorList list : {hx, params}) {
    for (const at::Tensor& t : list) {
      if (t.device().type() != kMyDev || t.layout() != c10::kStrided) return false;
    }
  }
  switch (input.scalar_type()) {
    case at::kFloat:
      return true;
    case at::kBFloat16:
      return bf16;
    case at::kHalf:
      return fp16 && !at::GradMode::is_enabled();
    default:
      return false;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm(const at::Tensor& input, at::TensorList hx, at::TensorList params,
                                                    bool has_biases, int64_t num_layers, double dropout, bool train,
                                                    bool bidirectional, bool batch_first) {
  if (!cpu_would_take_onednn(input, hx, params)) {
    return at::native::lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
  }
  at::Tensor output, hy, cy;
  at::native::lstm_mkldnn_stub(c10::DeviceType::CPU, output, hy, cy, input, hx, params, has_biases, num_layers,
                               dropout, train, bidirectional, batch_first);
  return {output, hy, cy};
}

// A packed sequence whose sequences all have one length is a padded batch with no
// padding: the CPU runs it through oneDNN as that batch, and so does mydev.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_packed(const at::Tensor& data, const at::Tensor& batch_sizes,
                                                           at::TensorList hx, at::TensorList params, bool has_biases,
                                                           int64_t num_layers, double dropout, bool train,
                                                           bool bidirectional) {
  const bool one_length = batch_sizes.device().is_cpu() && batch_sizes.scalar_type() == at::kLong &&
                          batch_sizes.dim() == 1 && batch_sizes.numel() > 0 && data.dim() == 2 &&
                          batch_sizes.is_contiguous() && [&] {
                            const int64_t* sizes = batch_sizes.const_data_ptr<int64_t>();
                            const int64_t n = batch_sizes.numel();
                            return sizes[0] * n == data.size(0) && std::all_of(sizes, sizes + n, [&](int64_t b) {
                                     return b == sizes[0];
                                   });
                          }();
  if (!one_length || !cpu_would_take_onednn(data, hx, params)) {
    return at::native::lstm(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional);
  }
  const int64_t steps = batch_sizes.numel();
  at::Tensor output, hy, cy;
  at::native::lstm_mkldnn_stub(c10::DeviceType::CPU, output, hy, cy, data.view({steps, -1, data.size(1)}), hx, params,
                               has_biases, num_layers, dropout, train, bidirectional, /*batch_first=*/false);
  return {output.flatten(0, 1), hy, cy};
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("lstm.input", TORCH_FN(lstm));
  m.impl("lstm.data", TORCH_FN(lstm_packed));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward_impl));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward));
}

} // namespace
} // namespace my_device
