// Custom MLX primitives with CPU kernels (eval_cpu). Used only for float32 on the CPU device;
// eval_gpu throws, and candle_nn never builds them for another device (cpu_fast.py decides).
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace candle_nn {

namespace mx = mlx::core;

enum class Act : int { Identity = 0, Relu = 1, Silu = 2, Gelu = 3 };
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
// output (N, H', W', out_channels). A Linear is the 1x1 case with x (1, 1, M, K).
mx::array conv2d_packed(const mx::array& x, const mx::array& w_packed,
                        const std::optional<mx::array>& bias,
                        const std::optional<mx::array>& residual, std::pair<int, int> kernel,
                        int out_channels, std::pair<int, int> stride, std::pair<int, int> padding,
                        Act act, Residual mode, mx::StreamOrDevice s = {});

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
