// Custom MLX primitives with CPU kernels (eval_cpu). Used only for float32 on the CPU device;
// eval_gpu throws, and candle_nn never builds them for another device (cpu_fast.py decides).
#pragma once

#include <initializer_list>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace candle_nn {

namespace mx = mlx::core;

enum class Act : int { Identity = 0, Relu = 1, Silu = 2, Gelu = 3, Sigmoid = 4 };
enum class Residual : int { None = 0, BeforeAct = 1, AfterAct = 2 };

// y = act(x + bias [+ residual])  (Residual::BeforeAct)  or  act(x + bias) + residual
// (Residual::AfterAct), in one multithreaded pass. x (..., C) float32; bias (C,) or none;
// residual x's shape or none.
mx::array bias_act(const mx::array& x, const std::optional<mx::array>& bias,
                   const std::optional<mx::array>& residual, Act act, Residual mode,
                   mx::StreamOrDevice s = {});

// act(conv2d(x, w) + bias [+ residual]) for groups = 1, dilation = 1: a multithreaded im2col
// (none for a 1x1 stride-1 conv), one sgemm of the BLAS set by set_sgemm, and the bias_act
// epilogue. x (N, H, W, C), w (O, kH, kW, C) float32; output (N, H', W', O).
mx::array conv2d_fused(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                       const std::optional<mx::array>& residual, std::pair<int, int> stride,
                       std::pair<int, int> padding, Act act, Residual mode,
                       mx::StreamOrDevice s = {});

// The cblas_sgemm conv2d_fused calls (the optimized BLAS candle_nn/blas.py loaded); 0: none.
void set_sgemm(uintptr_t address);
bool has_sgemm();

// softmax over the last axis, float32, one row per task.
mx::array softmax_last(const mx::array& x, mx::StreamOrDevice s = {});

class BiasAct : public mx::Primitive {
 public:
  BiasAct(mx::Stream stream, Act act, Residual mode, bool has_bias)
      : mx::Primitive(stream), act_(act), mode_(mode), has_bias_(has_bias) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNBiasAct"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  Act act_;
  Residual mode_;
  bool has_bias_;
};

class Conv2dFused : public mx::Primitive {
 public:
  Conv2dFused(mx::Stream stream, std::pair<int, int> stride, std::pair<int, int> padding, Act act,
              Residual mode, bool has_bias)
      : mx::Primitive(stream), stride_(stride), padding_(padding), act_(act), mode_(mode),
        has_bias_(has_bias) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNConv2dFused"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  std::pair<int, int> stride_, padding_;
  Act act_;
  Residual mode_;
  bool has_bias_;
};

class SoftmaxLast : public mx::Primitive {
 public:
  explicit SoftmaxLast(mx::Stream stream) : mx::Primitive(stream) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNSoftmaxLast"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const SoftmaxLast*>(&other) != nullptr;
  }
};

// -- shared by the kernel files (defined in kernels.cpp) ------------------------------------------
// The bias_act epilogue on [begin, end) of a (rows, c) float32 matrix; out may be x. Without a
// bias, c may be any multiple-free length (one long row).
void bias_act_range(const float* x, const float* bias, const float* res, float* out,
                    int64_t begin, int64_t end, int64_t c, Act act, Residual mode);
// Throws unless `a` is float32.
void check_float32_cpu(const mx::array& a, const char* op);
// True when any array is a tracer (mx.grad / vmap / compile): then the ops below are used.
bool traced(std::initializer_list<const mx::array*> arrays);
// The conv ops' optional epilogue inputs, checked (float32; bias (channels,), named `bias_shape`
// in the message; a residual of the output's shape) and appended, contiguous, to `inputs`: the
// layout [x, w, bias?, residual?] that epilogue_inputs (cpu_eval.h) reads back.
void push_epilogue_inputs(std::vector<mx::array>& inputs, const char* op,
                          const std::optional<mx::array>& bias,
                          const std::optional<mx::array>& residual, Residual mode, int channels,
                          const char* bias_shape, const mx::Shape& out_shape, mx::Stream stream);
// The op's float32 output of `shape`, computed from `inputs` by primitive P(stream, args...).
template <class P, class... Args>
mx::array primitive_output(const mx::Shape& shape, std::vector<mx::array> inputs, mx::Stream stream,
                           Args... args) {
  return mx::array(shape, mx::float32, std::make_shared<P>(stream, args...), std::move(inputs));
}
// The epilogue as MLX ops (the traced path).
mx::array bias_act_ops(mx::array v, const std::optional<mx::array>& bias,
                       const std::optional<mx::array>& residual, Act act, Residual mode,
                       mx::Stream s);

// -- depthwise conv (depthwise.cpp) --------------------------------------------------------------
// act(depthwise_conv2d(x, w) + bias [+ residual]): x (N, H, W, C), w (C, kH, kW, 1) (MLX's
// layout for groups = C), bias (C,), float32; any kernel size, stride, padding, dilation. Output
// rows spread over the thread pool, 8-channel vectors, the epilogue fused per chunk of pixels.
mx::array depthwise_conv2d(const mx::array& x, const mx::array& w,
                           const std::optional<mx::array>& bias,
                           const std::optional<mx::array>& residual, std::pair<int, int> stride,
                           std::pair<int, int> padding, std::pair<int, int> dilation, Act act,
                           Residual mode, mx::StreamOrDevice s = {});

class DepthwiseConv2d : public mx::Primitive {
 public:
  DepthwiseConv2d(mx::Stream stream, std::pair<int, int> stride, std::pair<int, int> padding,
                  std::pair<int, int> dilation, Act act, Residual mode, bool has_bias)
      : mx::Primitive(stream), stride_(stride), padding_(padding), dilation_(dilation), act_(act),
        mode_(mode), has_bias_(has_bias) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNDepthwiseConv2d"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  std::pair<int, int> stride_, padding_, dilation_;
  Act act_;
  Residual mode_;
  bool has_bias_;
};

// -- attention from a packed qkv projection (attention.cpp) --------------------------------------
// softmax(q k^T * scale + bias) v for every (sequence, head): qkv (B, N, heads * 3 * D) with,
// per token and head, q, k, v of D each (TinyViT's packing); bias (heads, N, N) or none;
// output (B, N, heads * D). One (sequence, head) per task on the thread pool.
mx::array attention_packed(const mx::array& qkv, const std::optional<mx::array>& bias, int heads,
                           float scale, mx::StreamOrDevice s = {});

class AttentionPacked : public mx::Primitive {
 public:
  AttentionPacked(mx::Stream stream, int heads, float scale, bool has_bias)
      : mx::Primitive(stream), heads_(heads), scale_(scale), has_bias_(has_bias) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNAttentionPacked"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int heads_;
  float scale_;
  bool has_bias_;
};

// -- LayerNorm (layer_norm.cpp) ------------------------------------------------------------------
// (x - mean) / sqrt(var + eps) * weight + bias over the last axis; x float32, weight and bias
// (D,) or none. Rows spread over the thread pool.
mx::array layer_norm(const mx::array& x, const std::optional<mx::array>& weight,
                     const std::optional<mx::array>& bias, float eps, mx::StreamOrDevice s = {});

class LayerNormRows : public mx::Primitive {
 public:
  LayerNormRows(mx::Stream stream, float eps, bool has_weight, bool has_bias)
      : mx::Primitive(stream), eps_(eps), has_weight_(has_weight), has_bias_(has_bias) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNLayerNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  float eps_;
  bool has_weight_, has_bias_;
};

// Concatenation of xs (float32, equal shapes but the last axis) along the last axis
// (concat.cpp): output rows over the thread pool, slices of a contiguous array's last axis read
// in place. No VJP (tracers: the caller runs mx.concatenate).
mx::array concat_last(const std::vector<mx::array>& xs, mx::StreamOrDevice s = {});

class ConcatLast : public mx::Primitive {
 public:
  explicit ConcatLast(mx::Stream stream) : mx::Primitive(stream) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNConcatLast"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const ConcatLast*>(&other) != nullptr;
  }
};

// Max pooling of x (N, H, W, C) float32 (max_pool.cpp): padding counts as -inf (0 <= padding <=
// kernel / 2), a NaN tap gives NaN; output rows over the thread pool. No VJP (tracers: the caller
// runs MLX's pooling).
mx::array max_pool2d_nhwc(const mx::array& x, std::pair<int, int> kernel,
                          std::pair<int, int> stride, std::pair<int, int> padding,
                          mx::StreamOrDevice s = {});

class MaxPool2dNhwc : public mx::Primitive {
 public:
  MaxPool2dNhwc(mx::Stream stream, std::pair<int, int> kernel, std::pair<int, int> stride,
                std::pair<int, int> padding)
      : mx::Primitive(stream), kernel_(kernel), stride_(stride), padding_(padding) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNMaxPool2d"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  std::pair<int, int> kernel_, stride_, padding_;
};

// Window attention of an image, straight from its packed qkv projection in image order: the
// image (qkv (B, H, W, heads * 3 * D), per token and head q, k, v of D each) cut into window x
// window tiles, the tokens past its bottom / right edge taking the pad token's qkv
// (heads * 3 * D,) (zeros without one), softmax(q k^T * scale + bias) v per (window, head) with
// bias (heads, window², window²) or none; output (B, H, W, heads * D) in image order (no rows
// for the padding). One (window, head) per task on the thread pool.
mx::array window_attention(const mx::array& qkv, const std::optional<mx::array>& pad,
                           const std::optional<mx::array>& bias, int heads, int window,
                           float scale, mx::StreamOrDevice s = {});

class WindowAttention : public mx::Primitive {
 public:
  WindowAttention(mx::Stream stream, int heads, int window, float scale, bool has_pad,
                  bool has_bias)
      : mx::Primitive(stream), heads_(heads), window_(window), scale_(scale), has_pad_(has_pad),
        has_bias_(has_bias) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNWindowAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int heads_, window_;
  float scale_;
  bool has_pad_, has_bias_;
};

// softmax(q k^T * scale) v per (sequence, head) with the heads side by side in the last axis:
// q (B, Lq, heads * D), k (B, Lk, heads * D), v (B, Lk, heads * Dv) -> (B, Lq, heads * Dv)
// (attention.cpp; no transposes to (B, heads, L, D) and back).
mx::array attention_heads(const mx::array& q, const mx::array& k, const mx::array& v, int heads,
                          float scale, mx::StreamOrDevice s = {});

class AttentionHeads : public mx::Primitive {
 public:
  AttentionHeads(mx::Stream stream, int heads, float scale)
      : mx::Primitive(stream), heads_(heads), scale_(scale) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNAttentionHeads"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int heads_;
  float scale_;
};

// -- attention between prompt tokens and factored image tokens (point_attention.cpp) ----------
// SAM's automatic masks: b prompts, n image tokens, r = heads * t token rows. Per-head products
// of image rows shared (heads, n, d) with tokens tok (heads, b t, d): row h t + u of prompt p
// gets shared[h] (n, d) · tok[h, p t + u].
// point_probs: (b, n, r) softmax over each head's t (k (heads, b t, d)) of pe · k
// [+ scale (shared · k)]
// [+ coeff (b, n, m) · fold[p]ᵀ (fold (b, r, m)) + bias (b, r)].
mx::array point_probs(const mx::array& pe, const mx::array& k, int t,
                      const std::optional<mx::array>& scale,
                      const std::optional<mx::array>& shared,
                      const std::optional<mx::array>& coeff, const std::optional<mx::array>& fold,
                      const std::optional<mx::array>& bias, mx::StreamOrDevice s = {});
// point_norm: u = [coeff, probs, 0...] (b, n, mu), mu rounded up to 8; out = inv u,
// inv = 1 / sqrt((s² sq + 2 s lin + u gram[p] uᵀ) / channels + eps), s = scale (or 1), lin =
// lin0 + Σ probs (lp_shared · lp_tok) [+ Σ coeff (lc_shared · lc_tok)] per head.
mx::array point_norm(const mx::array& probs, const mx::array& sq, const mx::array& lp_shared,
                     const mx::array& lp_tok, const mx::array& lin0, const mx::array& gram,
                     float eps, int channels, const std::optional<mx::array>& scale,
                     const std::optional<mx::array>& coeff,
                     const std::optional<mx::array>& lc_shared,
                     const std::optional<mx::array>& lc_tok, mx::StreamOrDevice s = {});
// point_pool: (b, r, m + dv) = [A coeff, per head (A scale) shared_v[h]], A the softmax over n
// of scale (shared_k · q) + pe · q + fold[p] · coeffᵀ; without scale, coeff, fold, shared_k:
// (heads, rows, dv) = per head A shared_v[h], A the softmax over n of pe · q.
mx::array point_pool(const std::optional<mx::array>& scale, const std::optional<mx::array>& coeff,
                     const std::optional<mx::array>& fold,
                     const std::optional<mx::array>& shared_k, const mx::array& pe,
                     const mx::array& q, const mx::array& shared_v, mx::StreamOrDevice s = {});

class PointProbs : public mx::Primitive {
 public:
  PointProbs(mx::Stream stream, int flags) : mx::Primitive(stream), flags_(flags) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNPointProbs"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int flags_;  // 1: scale, shared; 2: coeff, fold; 4: bias
};

class PointNorm : public mx::Primitive {
 public:
  PointNorm(mx::Stream stream, float eps, int channels, bool has_scale, bool has_coeff)
      : mx::Primitive(stream), eps_(eps), channels_(channels), has_scale_(has_scale),
        has_coeff_(has_coeff) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNPointNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  float eps_;
  int channels_;
  bool has_scale_, has_coeff_;
};

class PointPool : public mx::Primitive {
 public:
  PointPool(mx::Stream stream, bool factored) : mx::Primitive(stream), factored_(factored) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNPointPool"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto* p = dynamic_cast<const PointPool*>(&other);
    return p && p->factored_ == factored_;
  }

 private:
  bool factored_;
};

// -- SAM's mask output upscaling for many prompts (mask_upscale.cpp) ---------------------------
// x1 = scale shared + coeff[p] · weight[p] + bias as (u, 4n, c1) rows (scale (u, n), shared
// (n, 4 c1), coeff (u, n, k), weight (u, k, 4 c1)) -> GELU(LayerNorm(x1; ln_w, ln_b, eps)) ->
// GELU(· w2ᵀ + b2) as (u, 16n, c2) rows -> · hyper[p]ᵀ (hyper (u, m, c2)): (u, m, n, 16).
// w2 (4 c2, c1): the second transposed conv (stride = kernel) as a Linear.
mx::array mask_upscale(const mx::array& scale, const mx::array& shared, const mx::array& coeff,
                       const mx::array& weight, const mx::array& bias, const mx::array& ln_w,
                       const mx::array& ln_b, float eps, const mx::array& w2,
                       const mx::array& b2, const mx::array& hyper, mx::StreamOrDevice s = {});

class MaskUpscale : public mx::Primitive {
 public:
  MaskUpscale(mx::Stream stream, float eps) : mx::Primitive(stream), eps_(eps) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNMaskUpscale"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  float eps_;
};

// -- SAM's mask post-processing for many masks (mask_postprocess.cpp) --------------------------
// rows (H, h) · masks (k, h, w) · cols (W, w)ᵀ over the non-zero bands of rows and cols.
mx::array resize_masks(const mx::array& masks, const mx::array& rows, const mx::array& cols,
                       mx::StreamOrDevice s = {});
// (count of > threshold + offset) / (count of > threshold - offset) per (..., H, W) plane.
mx::array stability_score(const mx::array& masks, float threshold, float offset,
                          mx::StreamOrDevice s = {});

class ResizeMasks : public mx::Primitive {
 public:
  explicit ResizeMasks(mx::Stream stream) : mx::Primitive(stream) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNResizeMasks"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const ResizeMasks*>(&other) != nullptr;
  }
};

class StabilityScore : public mx::Primitive {
 public:
  StabilityScore(mx::Stream stream, float threshold, float offset)
      : mx::Primitive(stream), threshold_(threshold), offset_(offset) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNStabilityScore"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  float threshold_, offset_;
};

// -- few-row Linear (linear_rows.cpp) ------------------------------------------------------------
// x (..., K) @ w (N, K)^T + bias (N,) for a handful of rows (SAM's decoder tokens): dot products
// along K, output columns over the thread pool (no BLAS threads to synchronise).
mx::array linear_rows(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                      mx::StreamOrDevice s = {});

class LinearRows : public mx::Primitive {
 public:
  LinearRows(mx::Stream stream, bool has_bias) : mx::Primitive(stream), has_bias_(has_bias) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNLinearRows"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  bool has_bias_;
};

}  // namespace candle_nn

// -- Winograd F(4x4, 3x3) for 3x3 stride-1 convs (winograd.cpp) -------------------------------
namespace candle_nn {

// U = G w G^T of a 3x3 weight w (O, 3, 3, C) float32, computed in float64 now (not lazily):
// (36, Cp, Op) float32, Cp/Op = C/O rounded up to 8, zeros past C/O, each position's (Cp, Op)
// stored in panels of 32 output channels (winograd.cpp's u_offset), for winograd_conv3x3 only.
// None for a traced w (under mx.grad / vmap / compile as an input: it has no values yet).
std::optional<mx::array> winograd_weights(const mx::array& w);

// Allow (default) or forbid the AVX-512 GEMM of winograd_conv3x3 where the CPU has it.
void set_winograd_avx512(bool on);

// act(conv2d(x, w, stride 1, padding) + bias [+ residual]) by Winograd F(4x4, 3x3), u =
// winograd_weights(w) (w itself is used only under MLX transforms, through conv2d_fused).
// x (N, H, W, C) float32; output (N, H + 2 ph - 2, W + 2 pw - 2, O).
mx::array winograd_conv3x3(const mx::array& x, const mx::array& w, const mx::array& u,
                           const std::optional<mx::array>& bias,
                           const std::optional<mx::array>& residual, std::pair<int, int> padding,
                           Act act, Residual mode, mx::StreamOrDevice s = {});

class WinogradConv3x3 : public mx::Primitive {
 public:
  WinogradConv3x3(mx::Stream stream, std::pair<int, int> padding, Act act, Residual mode,
                  bool has_bias)
      : mx::Primitive(stream), padding_(padding), act_(act), mode_(mode), has_bias_(has_bias) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNWinogradConv3x3"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  std::pair<int, int> padding_;
  Act act_;
  Residual mode_;
  bool has_bias_;
};

}  // namespace candle_nn

// The packed-weight GEMM
namespace candle_nn {

// -- the packed-weight GEMM (gemm.h) as convs and Linear layers; conv_packed.cpp ------------------
// act(x + bias [+ residual]) (or act(x + bias) + residual) in place on C rows [m0, m1), columns
// [n0, n1), row stride ldc (bias indexed by column, residual laid out as C).
void bias_act_tile(float* c, int64_t ldc, const float* bias, const float* residual, int64_t m0,
                   int64_t m1, int64_t n0, int64_t n1, Act act, Residual mode);

// Whether conv2d_packed runs on this CPU (AVX-512F, or AVX2 + FMA), which micro-kernel it
// uses ("avx512", "avx2", "none"), and a switch between them for tests and A/B ("avx512",
// "avx2", "best"; false where this CPU cannot).
bool packed_gemm_available();
const char* packed_gemm_isa();
bool set_packed_gemm_isa(const std::string& name);

// w (N, K) float32 (a conv's (O, kH * kW * C) weight, a Linear's (out, in)) packed for
// conv2d_packed: a 1-D array of gemm::packed_size(N, K) floats. Evaluates w; runs at once.
mx::array pack_gemm_weight(const mx::array& w);

// act(conv2d(x, w) + bias [+ residual]) as conv2d_fused, with w given packed
// (pack_gemm_weight of w.reshape(O, kH * kW * C)) and an AVX-512/AVX2 GEMM that gathers im2col
// blocks itself and runs the epilogue on each tile while it is in cache. x (N, H, W, C) float32;
// output (N, H', W', out_channels). A Linear is the 1x1 case with x (1, 1, M, K). traced_ok:
// build the primitive for tracer inputs too (it has no VJP: the caller supplies one, e.g. an
// mx.custom_function's) instead of falling back to MLX's ops.
mx::array conv2d_packed(const mx::array& x, const mx::array& w_packed,
                        const std::optional<mx::array>& bias,
                        const std::optional<mx::array>& residual, std::pair<int, int> kernel,
                        int out_channels, std::pair<int, int> stride, std::pair<int, int> padding,
                        Act act, Residual mode, bool traced_ok = false,
                        mx::StreamOrDevice s = {});

class Conv2dPacked : public mx::Primitive {
 public:
  Conv2dPacked(mx::Stream stream, std::pair<int, int> kernel, std::pair<int, int> stride,
               std::pair<int, int> padding, Act act, Residual mode, bool has_bias)
      : mx::Primitive(stream), kernel_(kernel), stride_(stride), padding_(padding), act_(act),
        mode_(mode), has_bias_(has_bias) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "CandleNNConv2dPacked"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  std::pair<int, int> kernel_, stride_, padding_;
  Act act_;
  Residual mode_;
  bool has_bias_;
};

}  // namespace candle_nn
