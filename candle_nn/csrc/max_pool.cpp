// Max pooling of an NHWC float32 image (MLX 0.32's CPU max pool pads with -inf by a copy, then
// reduces an as_strided window view on one thread: ~1.3 ms for ResNet's 112x112x64 3x3/s2 stem
// pool). Here each output pixel is the maximum of its taps inside the image, kept in registers 8
// channels a vector, output rows spread over the thread pool. A NaN tap makes the window's maximum NaN, as
// MLX's max reduction.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "cpu_eval.h"
#include "kernels.h"
#include "small_gemm.h"
#include "mlx/backend/cpu/encoder.h"
#include "thread_pool.h"

namespace candle_nn {

namespace {

struct PoolGeometry {
  int64_t h, w, c, oh, ow, kh, kw, sh, sw, ph, pw;
};

// max(m, v), NaN if either is: a NaN m stays (neither test replaces it).
inline float nan_max(float m, float v) { return (v > m || v != v) ? v : m; }

using v8 = small_gemm::V8;
using small_gemm::load8;
using small_gemm::store8;
typedef int32_t v8i __attribute__((vector_size(32)));
// nan_max on 8 lanes (the same operations, the same bits).
CANDLE_NN_INLINE v8 nan_max8(v8 m, v8 v) {
  const v8i take = (v > m) | (v != v);
  return take ? v : m;
}

// Channels [c0, c0 + 8 * V) of one output pixel: the maxima kept in V vectors over the taps and
// stored once (as a running maximum in memory each tap would reload and store them, and the
// compiler must assume the output may alias the input).
template <int V>
CANDLE_NN_INLINE void pool_vectors(const float* img, float* o, int64_t c0, int64_t iy0, int64_t iy1,
                         int64_t ix0, int64_t ix1, const PoolGeometry& g) {
  constexpr float kLow = -std::numeric_limits<float>::infinity();
  v8 m[V];
  for (int v = 0; v < V; ++v) m[v] = v8{} + kLow;
  for (int64_t iy = iy0; iy < iy1; ++iy)
    for (int64_t ix = ix0; ix < ix1; ++ix) {
      const float* p = img + (iy * g.w + ix) * g.c + c0;
      for (int v = 0; v < V; ++v) m[v] = nan_max8(m[v], load8(p + 8 * v));
    }
  for (int v = 0; v < V; ++v) store8(o + c0 + 8 * v, m[v]);
}

// Output rows [r0, r1) of (batch, output row) index r = n * oh + oy.
CANDLE_NN_MULTIVERSION
void max_pool_rows(const float* x, float* out, int64_t r0, int64_t r1, const PoolGeometry& g) {
  constexpr float kLow = -std::numeric_limits<float>::infinity();
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / g.oh, oy = r % g.oh;
    const float* img = x + n * g.h * g.w * g.c;
    const int64_t iy0 = std::max<int64_t>(0, oy * g.sh - g.ph);
    const int64_t iy1 = std::min<int64_t>(g.h, oy * g.sh - g.ph + g.kh);
    for (int64_t ox = 0; ox < g.ow; ++ox) {
      float* o = out + (r * g.ow + ox) * g.c;
      const int64_t ix0 = std::max<int64_t>(0, ox * g.sw - g.pw);
      const int64_t ix1 = std::min<int64_t>(g.w, ox * g.sw - g.pw + g.kw);
      int64_t ch = 0;
      for (; ch + 32 <= g.c; ch += 32) pool_vectors<4>(img, o, ch, iy0, iy1, ix0, ix1, g);
      for (; ch + 8 <= g.c; ch += 8) pool_vectors<1>(img, o, ch, iy0, iy1, ix0, ix1, g);
      for (; ch < g.c; ++ch) {
        float m = kLow;
        for (int64_t iy = iy0; iy < iy1; ++iy)
          for (int64_t ix = ix0; ix < ix1; ++ix) m = nan_max(m, img[(iy * g.w + ix) * g.c + ch]);
        o[ch] = m;
      }
    }
  }
}

}  // namespace

mx::array max_pool2d_nhwc(const mx::array& x, std::pair<int, int> kernel,
                          std::pair<int, int> stride, std::pair<int, int> padding,
                          mx::StreamOrDevice s) {
  check_float32_cpu(x, "max_pool2d");
  if (x.ndim() != 4) throw std::invalid_argument("candle_nn.max_pool2d: x must be (N, H, W, C)");
  auto [kh, kw] = kernel;
  auto [sh, sw] = stride;
  auto [ph, pw] = padding;
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || ph < 0 || pw < 0 || 2 * ph > kh || 2 * pw > kw)
    throw std::invalid_argument(
        "candle_nn.max_pool2d: kernel and stride >= 1, 0 <= padding <= kernel / 2");
  const int oh = (x.shape(1) + 2 * ph - kh) / sh + 1, ow = (x.shape(2) + 2 * pw - kw) / sw + 1;
  if (oh <= 0 || ow <= 0) throw std::invalid_argument("candle_nn.max_pool2d: empty output");
  auto stream = mx::to_stream(s);
  return mx::array(mx::Shape{x.shape(0), oh, ow, x.shape(3)}, mx::float32,
                   std::make_shared<MaxPool2dNhwc>(stream, kernel, stride, padding),
                   {mx::contiguous(x, false, stream)});
}

void MaxPool2dNhwc::eval_cpu(const std::vector<mx::array>& inputs,
                             std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  PoolGeometry g{x.shape(1),      x.shape(2),     x.shape(3),      out.shape(1),
                 out.shape(2),    kernel_.first,  kernel_.second,  stride_.first,
                 stride_.second,  padding_.first, padding_.second};
  const int64_t rows = static_cast<int64_t>(x.shape(0)) * g.oh;
  encoder.dispatch([xp = x.data<float>(), o = out.data<float>(), rows, g]() {
    if (rows == 0 || g.c == 0) return;
    // ~16K output floats a chunk at least: smaller pools stay on one thread
    const int64_t min_rows = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(g.ow * g.c, 1));
    parallel_for(rows, min_rows, 1, [&](int64_t b, int64_t e) { max_pool_rows(xp, o, b, e, g); });
  });
}

void MaxPool2dNhwc::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.max_pool2d: a CPU-only kernel (run on the CPU device)");
}

bool MaxPool2dNhwc::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const MaxPool2dNhwc*>(&other);
  return p && p->kernel_ == kernel_ && p->stride_ == stride_ && p->padding_ == padding_;
}

}  // namespace candle_nn
