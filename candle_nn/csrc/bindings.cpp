// Python module candle_nn._cpu_kernels (nanobind, in MLX's nanobind domain so mx.array crosses).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "kernels.h"
#include "thread_pool.h"

namespace nb = nanobind;
namespace mx = mlx::core;
using namespace nb::literals;
using candle_nn::Act;
using candle_nn::Residual;

NB_MODULE(_cpu_kernels, m) {
  m.doc() = "candle_nn's fused, multithreaded float32 CPU kernels (MLX primitives).";
  nb::enum_<Act>(m, "Act", "The activation of a fused epilogue.")
      .value("identity", Act::Identity)
      .value("relu", Act::Relu)
      .value("silu", Act::Silu)
      .value("gelu", Act::Gelu, "exact (erf) GELU")
      .value("sigmoid", Act::Sigmoid);
  nb::enum_<Residual>(m, "Residual", "Where a fused epilogue adds the residual.")
      .value("none", Residual::None)
      .value("before_act", Residual::BeforeAct, "act(y + bias + residual)")
      .value("after_act", Residual::AfterAct, "act(y + bias) + residual");
  m.def(
      "is_tracer", [](const mx::array& a) { return a.is_tracer(); }, "a"_a,
      "Whether a is a tracer (an input of mx.grad / mx.vmap / mx.compile's trace).");
  m.def("set_winograd_avx512", [](bool on) { candle_nn::set_winograd_avx512(on); }, "on"_a,
        "Allow (default) or forbid winograd_conv3x3's AVX-512 GEMM where the CPU has it.");
  m.def(
      "bias_act",
      [](const mx::array& x, std::optional<mx::array> bias, std::optional<mx::array> residual,
         Act act, Residual residual_mode) {
        return candle_nn::bias_act(x, bias, residual, act, residual_mode);
      },
      "x"_a, "bias"_a = nb::none(), "residual"_a = nb::none(), "act"_a = Act::Identity,
      "residual_mode"_a = Residual::None,
      "act(x + bias [+ residual]) (Residual.before_act) or act(x + bias) + residual (after_act). "
      "float32, on the current CPU stream.");
  m.def(
      "conv2d_fused",
      [](const mx::array& x, const mx::array& w, std::optional<mx::array> bias,
         std::optional<mx::array> residual, std::pair<int, int> stride,
         std::pair<int, int> padding, Act act, Residual residual_mode) {
        return candle_nn::conv2d_fused(x, w, bias, residual, stride, padding,
                                       act, residual_mode);
      },
      "x"_a, "w"_a, "bias"_a = nb::none(), "residual"_a = nb::none(), "stride"_a, "padding"_a,
      "act"_a = Act::Identity, "residual_mode"_a = Residual::None,
      "act(conv2d(x, w) + bias [+ residual]) for groups 1, dilation 1: x (N, H, W, C), "
      "w (O, kH, kW, C), float32; im2col + the sgemm set by set_sgemm + one epilogue pass.");
  m.def("set_sgemm", [](uintptr_t address) { candle_nn::set_sgemm(address); }, "address"_a,
        "The address of the cblas_sgemm conv2d_fused calls (0: none).");
  m.def("has_sgemm", [] { return candle_nn::has_sgemm(); });
  m.def("softmax_last", [](const mx::array& x) { return candle_nn::softmax_last(x); }, "x"_a,
        "Softmax over the last axis (float32, on the current CPU stream).");
  m.def("set_num_threads",
        [](int n) { candle_nn::ThreadPool::instance().set_threads(n); }, "n"_a);
  m.def("num_threads", [] { return candle_nn::ThreadPool::instance().threads(); });
  m.def(
      "depthwise_conv2d",
      [](const mx::array& x, const mx::array& w, std::optional<mx::array> bias,
         std::optional<mx::array> residual, std::pair<int, int> stride,
         std::pair<int, int> padding, std::pair<int, int> dilation, Act act,
         Residual residual_mode) {
        return candle_nn::depthwise_conv2d(x, w, bias, residual, stride, padding, dilation,
                                           act, residual_mode);
      },
      "x"_a, "w"_a, "bias"_a = nb::none(), "residual"_a = nb::none(), "stride"_a, "padding"_a,
      "dilation"_a, "act"_a = Act::Identity, "residual_mode"_a = Residual::None,
      "act(depthwise conv2d(x, w) + bias [+ residual]): x (N, H, W, C), w (C, kH, kW, 1), "
      "float32; multithreaded direct kernel with the epilogue fused.");
  m.def(
      "attention_packed",
      [](const mx::array& qkv, std::optional<mx::array> bias, int heads, float scale) {
        return candle_nn::attention_packed(qkv, bias, heads, scale);
      },
      "qkv"_a, "bias"_a = nb::none(), "heads"_a, "scale"_a,
      "softmax(q k^T * scale + bias) v per (sequence, head): qkv (B, N, heads * 3 * D) packed "
      "q, k, v per head, bias (heads, N, N); -> (B, N, heads * D). float32.");
  m.def(
      "window_attention",
      [](const mx::array& qkv, std::optional<mx::array> pad, std::optional<mx::array> bias,
         int heads, int window, float scale) {
        return candle_nn::window_attention(qkv, pad, bias, heads, window, scale);
      },
      "qkv"_a, "pad"_a = nb::none(), "bias"_a = nb::none(), "heads"_a, "window"_a, "scale"_a,
      "Window attention of an image from its packed projection: qkv (B, H, W, heads * 3 * D) "
      "in image order, pad (heads * 3 * D,) the qkv of the tokens padding H, W to whole "
      "windows (zeros if none), bias (heads, window², window²); -> (B, H, W, heads * D). "
      "float32.");
  m.def(
      "layer_norm",
      [](const mx::array& x, std::optional<mx::array> weight, std::optional<mx::array> bias,
         float eps) { return candle_nn::layer_norm(x, weight, bias, eps); },
      "x"_a, "weight"_a = nb::none(), "bias"_a = nb::none(), "eps"_a,
      "LayerNorm over the last axis (float32), rows spread over the thread pool.");
  m.def(
      "concat_last",
      [](const std::vector<mx::array>& xs) { return candle_nn::concat_last(xs); }, "xs"_a,
      "Concatenation along the last axis (float32): output rows over the thread pool, slices "
      "of a contiguous array's last axis read in place.");
  m.def(
      "max_pool2d",
      [](const mx::array& x, std::pair<int, int> kernel, std::pair<int, int> stride,
         std::pair<int, int> padding) {
        return candle_nn::max_pool2d_nhwc(x, kernel, stride, padding);
      },
      "x"_a, "kernel"_a, "stride"_a, "padding"_a,
      "Max pooling of x (N, H, W, C) (float32), padding counting as -inf, NaN kept; output rows "
      "spread over the thread pool.");
  m.def(
      "attention_heads",
      [](const mx::array& q, const mx::array& k, const mx::array& v, int heads, float scale) {
        return candle_nn::attention_heads(q, k, v, heads, scale);
      },
      "q"_a, "k"_a, "v"_a, "heads"_a, "scale"_a,
      "softmax(q k^T * scale) v per (sequence, head), heads side by side in the last axis: "
      "q (B, Lq, heads * D), k (B, Lk, heads * D), v (B, Lk, heads * Dv). float32.");
  m.def(
      "linear_rows",
      [](const mx::array& x, const mx::array& w, std::optional<mx::array> bias) {
        return candle_nn::linear_rows(x, w, bias);
      },
      "x"_a, "w"_a, "bias"_a = nb::none(),
      "x (..., K) @ w (N, K)^T + bias for a few rows (float32): dot products on the pool.");
  m.def(
      "point_probs",
      [](const mx::array& pe, const mx::array& k, int t, std::optional<mx::array> scale,
         std::optional<mx::array> shared, std::optional<mx::array> coeff,
         std::optional<mx::array> fold, std::optional<mx::array> bias) {
        return candle_nn::point_probs(pe, k, t, scale, shared, coeff, fold, bias);
      },
      "pe"_a, "k"_a, "t"_a, "scale"_a = nb::none(), "shared"_a = nb::none(), "coeff"_a = nb::none(),
      "fold"_a = nb::none(), "bias"_a = nb::none(),
      "Softmax over each head's t tokens of per-head scores of factored image rows -> "
      "(b, n, heads t). float32.");
  m.def(
      "point_norm",
      [](const mx::array& probs, const mx::array& sq, const mx::array& lp_shared,
         const mx::array& lp_tok, const mx::array& lin0, const mx::array& gram,
         float eps, int channels, std::optional<mx::array> scale,
         std::optional<mx::array> coeff, std::optional<mx::array> lc_shared,
         std::optional<mx::array> lc_tok) {
        return candle_nn::point_norm(probs, sq, lp_shared, lp_tok, lin0, gram, eps,
                                     channels, scale, coeff, lc_shared, lc_tok);
      },
      "probs"_a, "sq"_a, "lp_shared"_a, "lp_tok"_a, "lin0"_a, "gram"_a, "eps"_a,
      "channels"_a, "scale"_a = nb::none(), "coeff"_a = nb::none(), "lc_shared"_a = nb::none(),
      "lc_tok"_a = nb::none(),
      "A LayerNorm's 1 / std of factored rows times their coefficients -> (b, n, mu). float32.");
  m.def(
      "point_pool",
      [](const std::optional<mx::array>& scale, const std::optional<mx::array>& coeff,
         const std::optional<mx::array>& fold, const std::optional<mx::array>& shared_k,
         const mx::array& pe, const mx::array& q, const mx::array& shared_v) {
        return candle_nn::point_pool(scale, coeff, fold, shared_k, pe, q, shared_v);
      },
      "scale"_a.none(), "coeff"_a.none(), "fold"_a.none(), "shared_k"_a.none(), "pe"_a, "q"_a,
      "shared_v"_a,
      "Attention pooling of factored image rows over the n image tokens -> (b, heads t, m + dv);"
      " without scale, coeff, fold, shared_k: of q's rows per head -> (heads, rows, dv)."
      " float32.");
  m.def(
      "mask_upscale",
      [](const mx::array& scale, const mx::array& shared, const mx::array& coeff,
         const mx::array& weight, const mx::array& bias, const mx::array& ln_w,
         const mx::array& ln_b, float eps, const mx::array& w2, const mx::array& b2,
         const mx::array& hyper) {
        return candle_nn::mask_upscale(scale, shared, coeff, weight, bias, ln_w, ln_b, eps, w2,
                                       b2, hyper);
      },
      "scale"_a, "shared"_a, "coeff"_a, "weight"_a, "bias"_a, "ln_w"_a, "ln_b"_a, "eps"_a,
      "w2"_a, "b2"_a, "hyper"_a,
      "SAM's output upscaling per prompt from the first conv's factored output scale shared + "
      "coeff weight + bias -> (u, m, n, 16) logits in block layout. float32.");
  m.def(
      "resize_masks",
      [](const mx::array& masks, const mx::array& rows, const mx::array& cols) {
        return candle_nn::resize_masks(masks, rows, cols);
      },
      "masks"_a, "rows"_a, "cols"_a,
      "rows (H, h) @ masks (k, h, w) @ cols (W, w)^T over the non-zero bands (float32).");
  m.def(
      "stability_score",
      [](const mx::array& masks, float threshold, float offset) {
        return candle_nn::stability_score(masks, threshold, offset);
      },
      "masks"_a, "threshold"_a, "offset"_a,
      "count(> threshold + offset) / count(> threshold - offset) per (..., H, W) plane.");
  // -- the packed-weight GEMM (gemm.h, conv_packed.cpp) --
  m.def("packed_gemm_available", [] { return candle_nn::packed_gemm_available(); },
        "Whether conv2d_packed runs on this CPU (AVX-512F, or AVX2 + FMA).");
  m.def("packed_gemm_isa", [] { return std::string(candle_nn::packed_gemm_isa()); },
        "The packed GEMM's micro-kernel: 'avx512', 'avx2' or 'none'.");
  m.def("set_packed_gemm_isa",
        [](const std::string& name) { return candle_nn::set_packed_gemm_isa(name); }, "name"_a,
        "Use the 'avx512' or 'avx2' micro-kernel, or the 'best' this CPU has (tests, A/B); "
        "False where this CPU cannot.");
  m.def("pack_gemm_weight", [](const mx::array& w) { return candle_nn::pack_gemm_weight(w); },
        "w"_a, "w (N, K) float32 packed for conv2d_packed (1-D); evaluates w.");
  m.def(
      "conv2d_packed",
      [](const mx::array& x, const mx::array& w_packed, std::optional<mx::array> bias,
         std::optional<mx::array> residual, std::pair<int, int> kernel, int out_channels,
         std::pair<int, int> stride, std::pair<int, int> padding, Act act,
         Residual residual_mode, bool traced_ok) {
        return candle_nn::conv2d_packed(x, w_packed, bias, residual, kernel, out_channels, stride,
                                        padding, act, residual_mode, traced_ok);
      },
      "x"_a, "w_packed"_a, "bias"_a = nb::none(), "residual"_a = nb::none(), "kernel"_a,
      "out_channels"_a, "stride"_a, "padding"_a, "act"_a = Act::Identity,
      "residual_mode"_a = Residual::None, "traced_ok"_a = false,
      "conv2d_fused with the weight packed by pack_gemm_weight(w.reshape(O, -1)): x (N, H, W, C) "
      "float32, kernel (kH, kW); the AVX-512/AVX2 packed GEMM with im2col blocks and the epilogue "
      "fused. traced_ok: the primitive for tracer inputs too (it has no VJP; the caller gives "
      "one), not MLX's ops.");
  m.attr("LIBMLX_SIZE") = static_cast<int64_t>(CANDLE_NN_LIBMLX_SIZE);
  // -- Winograd F(4x4, 3x3) (winograd.cpp) --
  m.def("winograd_weights", [](const mx::array& w) { return candle_nn::winograd_weights(w); },
        "w"_a,
        "U = G w G^T (float64, rounded once) of a 3x3 weight w (O, 3, 3, C) float32: "
        "(36, C, O) with C, O rounded up to 8, for winograd_conv3x3; None for a traced w.");
  m.def(
      "winograd_conv3x3",
      [](const mx::array& x, const mx::array& w, const mx::array& u,
         std::optional<mx::array> bias, std::optional<mx::array> residual,
         std::pair<int, int> padding, Act act, Residual residual_mode) {
        return candle_nn::winograd_conv3x3(x, w, u, bias, residual, padding,
                                           act, residual_mode);
      },
      "x"_a, "w"_a, "u"_a, "bias"_a = nb::none(), "residual"_a = nb::none(), "padding"_a,
      "act"_a = Act::Identity, "residual_mode"_a = Residual::None,
      "act(conv2d(x, w, stride 1) + bias [+ residual]) by Winograd F(4x4, 3x3): x (N, H, W, C), "
      "w (O, 3, 3, C), u = winograd_weights(w), float32; same epilogue as conv2d_fused.");
}
