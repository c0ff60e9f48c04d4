// Depthwise 2-D convolution (one kH x kW filter per channel) on NHWC float32, with the bias added
// in the accumulators and the bias_act epilogue (activation, residual) applied while each chunk
// of output pixels is still in cache. MLX 0.32 runs grouped convs as a naive scalar loop on one
// thread; here each output pixel's channels are a run of 8-wide vectors (NHWC: channels are
// contiguous), and output rows are spread over the thread pool.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "cpu_eval.h"
#include "kernels.h"
#include "mlx/backend/cpu/encoder.h"
#include "thread_pool.h"


namespace candle_nn {

namespace {

// 8 floats, any alignment (GCC vector extension: AVX registers in the x86-64-v3 clone, pairs of
// SSE registers in the baseline one).
typedef float V8 __attribute__((vector_size(32), aligned(4), may_alias));
constexpr int kLanes = 8;
constexpr int kBlock = 4 * kLanes;  // channels accumulated in registers per pass over the taps
constexpr int64_t kEpilogueFloats = 4096;  // output floats per epilogue call (16 KB: in L1/L2)

struct Geometry {
  int h, w, c, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
};

// acc[0..B) (B vectors of 8 channels) += sum over the in-bounds taps of x * w, for output pixel
// (oy, ox) of image `img`, channels [c0, c0 + 8 B). wt is the (kH * kW, C) weight.
template <int B>
CANDLE_NN_INLINE void accumulate(V8* acc, const float* img, const float* wt, const Geometry& g,
                                 int oy, int ox, int c0) {
  for (int i = 0; i < g.kh; ++i) {
    int iy = oy * g.sh - g.ph + i * g.dh;
    if (iy < 0 || iy >= g.h) continue;
    const float* row = img + static_cast<int64_t>(iy) * g.w * g.c + c0;
    const float* wrow = wt + static_cast<int64_t>(i) * g.kw * g.c + c0;
    for (int j = 0; j < g.kw; ++j) {
      int ix = ox * g.sw - g.pw + j * g.dw;
      if (ix < 0 || ix >= g.w) continue;
      const float* xp = row + static_cast<int64_t>(ix) * g.c;
      const float* wp = wrow + static_cast<int64_t>(j) * g.c;
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b)
        acc[b] += *reinterpret_cast<const V8*>(xp + b * kLanes) *
                  *reinterpret_cast<const V8*>(wp + b * kLanes);
    }
  }
}

// Output rows [r0, r1) (r = n * OH + oy) without the epilogue: bias + taps.
CANDLE_NN_MULTIVERSION
void depthwise_rows(const float* x, const float* wt, const float* bias, float* out, int64_t r0,
                    int64_t r1, Geometry g) {
  const int c_vec = g.c / kLanes * kLanes;
  for (int64_t r = r0; r < r1; ++r) {
    int64_t n = r / g.oh;
    int oy = static_cast<int>(r % g.oh);
    const float* img = x + n * g.h * static_cast<int64_t>(g.w) * g.c;
    float* orow = out + r * g.ow * static_cast<int64_t>(g.c);
    for (int ox = 0; ox < g.ow; ++ox) {
      float* o = orow + static_cast<int64_t>(ox) * g.c;
      int c0 = 0;
      for (; c0 + kBlock <= c_vec; c0 += kBlock) {
        V8 acc[4];
        for (int b = 0; b < 4; ++b)
          acc[b] = bias ? *reinterpret_cast<const V8*>(bias + c0 + b * kLanes) : V8{};
        accumulate<4>(acc, img, wt, g, oy, ox, c0);
        for (int b = 0; b < 4; ++b) *reinterpret_cast<V8*>(o + c0 + b * kLanes) = acc[b];
      }
      for (; c0 < c_vec; c0 += kLanes) {
        V8 acc[1] = {bias ? *reinterpret_cast<const V8*>(bias + c0) : V8{}};
        accumulate<1>(acc, img, wt, g, oy, ox, c0);
        *reinterpret_cast<V8*>(o + c0) = acc[0];
      }
      for (int c = c_vec; c < g.c; ++c) {  // channels past the last multiple of 8
        float acc = bias ? bias[c] : 0.0f;
        for (int i = 0; i < g.kh; ++i) {
          int iy = oy * g.sh - g.ph + i * g.dh;
          if (iy < 0 || iy >= g.h) continue;
          for (int j = 0; j < g.kw; ++j) {
            int ix = ox * g.sw - g.pw + j * g.dw;
            if (ix < 0 || ix >= g.w) continue;
            acc += img[(static_cast<int64_t>(iy) * g.w + ix) * g.c + c] *
                   wt[(static_cast<int64_t>(i) * g.kw + j) * g.c + c];
          }
        }
        o[c] = acc;
      }
    }
  }
}

}  // namespace

mx::array depthwise_conv2d(const mx::array& x, const mx::array& w,
                           const std::optional<mx::array>& bias,
                           const std::optional<mx::array>& residual, std::pair<int, int> stride,
                           std::pair<int, int> padding, std::pair<int, int> dilation, Act act,
                           Residual mode, mx::StreamOrDevice s) {
  check_float32_cpu(x, "depthwise_conv2d");
  check_float32_cpu(w, "depthwise_conv2d");
  if (x.ndim() != 4 || w.ndim() != 4 || w.shape(3) != 1 || w.shape(0) != x.shape(3))
    throw std::invalid_argument("candle_nn.depthwise_conv2d: x (N, H, W, C), w (C, kH, kW, 1)");
  if (stride.first < 1 || stride.second < 1 || padding.first < 0 || padding.second < 0 ||
      dilation.first < 1 || dilation.second < 1)
    throw std::invalid_argument("candle_nn.depthwise_conv2d: bad stride, padding or dilation");
  int oh = (x.shape(1) + 2 * padding.first - dilation.first * (w.shape(1) - 1) - 1) /
               stride.first + 1;
  int ow = (x.shape(2) + 2 * padding.second - dilation.second * (w.shape(2) - 1) - 1) /
               stride.second + 1;
  if (oh <= 0 || ow <= 0) throw std::invalid_argument("candle_nn.depthwise_conv2d: empty output");
  mx::Shape out_shape{x.shape(0), oh, ow, x.shape(3)};
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs{mx::contiguous(x, false, stream), mx::contiguous(w, false, stream)};
  push_epilogue_inputs(inputs, "depthwise_conv2d", bias, residual, mode, x.shape(3), "(C,)",
                       out_shape, stream);
  if (traced({&x, &w, bias ? &*bias : nullptr, residual ? &*residual : nullptr}))
    return bias_act_ops(mx::conv2d(x, w, stride, padding, dilation, x.shape(3), stream), bias,
                        residual, act, mode, stream);
  return primitive_output<DepthwiseConv2d>(out_shape, std::move(inputs), stream,
                                           stride, padding, dilation, act, mode, bias.has_value());
}

void DepthwiseConv2d::eval_cpu(const std::vector<mx::array>& inputs,
                               std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  auto& out = outputs[0];
  auto [encoder, bias, res] = begin_epilogue_eval(stream(), inputs, out, has_bias_, mode_);
  Geometry g{x.shape(1),      x.shape(2),      x.shape(3),       out.shape(1),    out.shape(2),
             w.shape(1),      w.shape(2),      stride_.first,    stride_.second,  padding_.first,
             padding_.second, dilation_.first, dilation_.second};
  int64_t rows = static_cast<int64_t>(out.shape(0)) * g.oh;
  encoder.dispatch([xp = x.data<float>(), wp = w.data<float>(), bias, res,
                    op = out.data<float>(), rows, g, act = act_, mode = mode_]() {
    if (rows == 0 || g.ow == 0 || g.c == 0) return;
    // (C, kH, kW) -> (kH * kW, C): the taps' weights for a run of channels are contiguous.
    const int taps = g.kh * g.kw;
    std::vector<float> wt(static_cast<size_t>(taps) * g.c);
    for (int c = 0; c < g.c; ++c)
      for (int t = 0; t < taps; ++t) wt[static_cast<size_t>(t) * g.c + c] = wp[c * taps + t];
    const int64_t row_floats = static_cast<int64_t>(g.ow) * g.c;
    const bool epilogue = act != Act::Identity || mode != Residual::None;
    // Pixels per epilogue call: whole pixels, about kEpilogueFloats floats.
    const int64_t chunk = std::max<int64_t>(1, kEpilogueFloats / g.c) * g.c;
    int64_t min_rows = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(row_floats, 1));
    parallel_for(rows, min_rows, 1, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        depthwise_rows(xp, wt.data(), bias, op, r, r + 1, g);
        if (!epilogue) continue;
        float* orow = op + r * row_floats;
        const float* rrow = res ? res + r * row_floats : nullptr;
        for (int64_t p = 0; p < row_floats; p += chunk) {
          int64_t len = std::min(chunk, row_floats - p);
          bias_act_range(orow + p, nullptr, rrow ? rrow + p : nullptr, orow + p, 0, len, len,
                         act, mode);
        }
      }
    });
  });
}

void DepthwiseConv2d::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(
      "candle_nn.depthwise_conv2d: a CPU-only kernel (run on the CPU device)");
}

bool DepthwiseConv2d::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const DepthwiseConv2d*>(&other);
  return p && p->stride_ == stride_ && p->padding_ == padding_ && p->dilation_ == dilation_ &&
         p->act_ == act_ && p->mode_ == mode_ && p->has_bias_ == has_bias_;
}

}  // namespace candle_nn
