// Attention between a few prompt tokens and many image tokens, one prompt per image copy (SAM's
// automatic mask generation: b prompts, each with its own n = 4096 image tokens of c = 256, and
// r = heads x tokens = 56 folded token rows). Every product is a few-row GEMM per prompt; MLX
// runs a batched matmul as one threaded sgemm call per prompt, whose threads synchronise
// several times per call (one thread per call is ~3x faster at these shapes). Here each prompt
// (point_pool) or each block of a prompt's image rows (point_spread) is one task on the pool,
// its products single-threaded on 6x16 register tiles, with the softmax, the residual and the
// LayerNorm fused while the block is in cache.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "cpu_eval.h"
#include "kernels.h"
#include "math_f32.h"
#include "small_gemm.h"
#include "mlx/backend/cpu/encoder.h"
#include "thread_pool.h"

namespace candle_nn {

namespace {

using small_gemm::V8;
using small_gemm::kLanes;
using small_gemm::load8;
using small_gemm::store8;
using small_gemm::gemm_strided;
using small_gemm::layer_norm_row;

// The shapes of both ops: b prompts, n image tokens of c channels, heads x t token rows (r) with
// d-wide positional keys / queries per head. Score matrices: `cols` = r rounded up to 8 computed
// columns, row stride ld (room for the last head's tp-wide positional tile, see add_positional).
struct Dims {
  int64_t b, n, c, heads, t, d, r, tp, cols, ld;
};

// The token side of one prompt: ft (c x cols) = folded[p]ᵀ (zero columns past r), and per head
// qt (d x tp) = that head's t rows of q (heads, b t, d) transposed (zero columns past t).
CANDLE_NN_INLINE void prompt_side(const Dims& d, const float* folded, const float* q, int64_t p,
                                  float* ft, float* qt) {
  if (folded != nullptr) {
    const float* f = folded + p * d.r * d.c;
    for (int64_t ch = 0; ch < d.c; ++ch) {
      float* row = ft + ch * d.cols;
      for (int64_t j = 0; j < d.r; ++j) row[j] = f[j * d.c + ch];
      for (int64_t j = d.r; j < d.cols; ++j) row[j] = 0.0f;
    }
  }
  for (int64_t h = 0; h < d.heads; ++h)
    for (int64_t k = 0; k < d.d; ++k) {
      float* row = qt + (h * d.d + k) * d.tp;
      for (int64_t u = 0; u < d.tp; ++u)
        row[u] = u < d.t ? q[((h * d.b + p) * d.t + u) * d.d + k] : 0.0f;
    }
}

// Scores s (m x ld) of image rows [i0, i0 + m) += the positional share pe[h] (n x d) · qt[h] per
// head, head h's tile on columns [h t, h t + tp): its zero columns past t add 0 to the next
// head's first columns (heads run in order) or to the padding of the row.
CANDLE_NN_INLINE void add_positional(const Dims& d, const float* pe, const float* qt, float* s,
                                     int64_t i0, int64_t m) {
  for (int64_t h = 0; h < d.heads; ++h) {
    float* c = s + h * d.t;
    gemm_strided(pe + (h * d.n + i0) * d.d, d.d, 1, qt + h * d.d * d.tp, d.tp, c, d.ld, m, d.tp,
                 d.d, c, d.ld, m);
  }
}

// point_pool, prompt p: out (r x c) = softmax over i of (folded · imageᵀ + pe · qᵀ) · image.
CANDLE_NN_MULTIVERSION
void pool_prompt(const Dims& d, const float* folded, const float* image, const float* pe,
                 const float* q, float* out, int64_t p) {
  thread_local std::vector<float> ft, qt, s, top, sum;
  ft.resize(d.c * d.cols);
  qt.resize(d.heads * d.d * d.tp);
  s.resize(d.n * d.ld);
  prompt_side(d, folded, q, p, ft.data(), qt.data());
  const float* x = image + p * d.n * d.c;
  // scores, transposed: s (n x ld) = image · foldedᵀ + positional share
  constexpr int64_t kBlock = 48;
  for (int64_t i0 = 0; i0 < d.n; i0 += kBlock) {
    const int64_t m = std::min(kBlock, d.n - i0);
    float* si = s.data() + i0 * d.ld;
    gemm_strided(x + i0 * d.c, d.c, 1, ft.data(), d.cols, si, d.ld, m, d.cols, d.c, nullptr, 0,
                 kBlock);
    add_positional(d, pe, qt.data(), si, i0, m);
  }
  // softmax over the image tokens: column maxima, exp, column sums
  top.assign(d.cols, -INFINITY);
  sum.assign(d.cols, 0.0f);
  for (int64_t i = 0; i < d.n; ++i) {
    const float* row = s.data() + i * d.ld;
    for (int64_t j = 0; j < d.cols; ++j) top[j] = std::max(top[j], row[j]);
  }
  for (int64_t i = 0; i < d.n; ++i) {
    float* row = s.data() + i * d.ld;
    for (int64_t j = 0; j < d.cols; ++j) {
      float e = exp_f32(row[j] - top[j]);
      row[j] = e;
      sum[j] += e;
    }
  }
  // out = sᵀ · image, K (the image tokens) in blocks whose image rows stay in L2
  float* o = out + p * d.r * d.c;
  constexpr int64_t kK = 256;
  for (int64_t k0 = 0; k0 < d.n; k0 += kK) {
    const int64_t kc = std::min(kK, d.n - k0);
    gemm_strided(s.data() + k0 * d.ld, 1, d.ld, x + k0 * d.c, d.c, o, d.c, d.r, d.c, kc,
                 k0 > 0 ? o : nullptr, d.c, d.r);
  }
  for (int64_t j = 0; j < d.r; ++j) {
    const float inv = 1.0f / sum[j];
    for (int64_t ch = 0; ch < d.c; ++ch) o[j * d.c + ch] *= inv;
  }
}

// point_spread, rows [i0, i0 + m) of prompt p (its token side prepared by prompt_side at ft, qt):
// out = LayerNorm(x + softmax over each head's tokens of (x · foldedᵀ + pe · qᵀ) · values).
CANDLE_NN_MULTIVERSION
void spread_block(const Dims& d, const float* x, bool shared_x, const float* ft,
                  const float* qt, const float* pe, const float* values, const float* weight,
                  const float* ln_bias, float eps, float* out, int64_t p, int64_t i0, int64_t m) {
  thread_local std::vector<float> s, scale;
  s.resize(m * d.ld);
  scale.resize(d.cols);
  const float* xb = x + ((shared_x ? 0 : p) * d.n + i0) * d.c;
  if (ft != nullptr)
    gemm_strided(xb, d.c, 1, ft, d.cols, s.data(), d.ld, m, d.cols, d.c, nullptr, 0, m);
  else
    std::fill(s.begin(), s.end(), 0.0f);
  add_positional(d, pe, qt, s.data(), i0, m);
  float* g = scale.data();
  for (int64_t i = 0; i < m; ++i) {
    float* row = s.data() + i * d.ld;
    for (int64_t h = 0; h < d.heads; ++h) {
      float top = row[h * d.t];
      for (int64_t u = 1; u < d.t; ++u) top = std::max(top, row[h * d.t + u]);
      for (int64_t u = 0; u < d.t; ++u) g[h * d.t + u] = top;
    }
    for (int64_t j = 0; j < d.r; ++j) row[j] = exp_f32(row[j] - g[j]);
    for (int64_t h = 0; h < d.heads; ++h) {
      float total = 0.0f;
      for (int64_t u = 0; u < d.t; ++u) total += row[h * d.t + u];
      for (int64_t u = 0; u < d.t; ++u) g[h * d.t + u] = 1.0f / total;
    }
    for (int64_t j = 0; j < d.r; ++j) row[j] *= g[j];
  }
  float* o = out + (p * d.n + i0) * d.c;
  gemm_strided(s.data(), d.ld, 1, values + p * d.r * d.c, d.c, o, d.c, m, d.c, d.r, xb, d.c, m);
  for (int64_t i = 0; i < m; ++i) layer_norm_row(o + i * d.c, d.c, weight, ln_bias, eps);
}

CANDLE_NN_MULTIVERSION
void prompt_sides(const Dims& d, const float* folded, const float* q, float* ft, float* qt,
                  int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p)
    prompt_side(d, folded, q, p, folded ? ft + p * d.c * d.cols : nullptr,
                qt + p * d.heads * d.d * d.tp);
}

void check(bool ok, const char* op, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("candle_nn.") + op + ": " + what);
}

// The shapes, from pe (heads, n, d) and q (heads, b t, d), checked against b, n and c.
Dims dims(const mx::array& pe, const mx::array& q, int64_t b, int64_t n, int64_t c,
          const char* op) {
  check(pe.ndim() == 3 && q.ndim() == 3 && pe.shape(0) == q.shape(0) && pe.shape(1) == n &&
            pe.shape(2) == q.shape(2) && b > 0 && q.shape(1) % b == 0,
        op, "pe must be (heads, n, d) and q (heads, b * t, d)");
  check(c % kLanes == 0, op, "channels must be a multiple of 8");
  Dims d{b, n, c, pe.shape(0), q.shape(1) / b, pe.shape(2), 0, 0, 0, 0};
  d.r = d.heads * d.t;
  d.tp = (d.t + kLanes - 1) / kLanes * kLanes;
  d.cols = (d.r + kLanes - 1) / kLanes * kLanes;
  d.ld = std::max(d.cols, (d.r - d.t + d.tp + kLanes - 1) / kLanes * kLanes);
  return d;
}

}  // namespace

mx::array point_pool(const mx::array& folded, const mx::array& image, const mx::array& pe,
                     const mx::array& q, mx::StreamOrDevice s) {
  const char* op = "point_pool";
  for (const auto* a : {&folded, &image, &pe, &q}) check_float32_cpu(*a, op);
  check(!traced({&folded, &image, &pe, &q}), op, "no tracer inputs (use the reference)");
  check(folded.ndim() == 3 && image.ndim() == 3 && image.shape(0) == folded.shape(0) &&
            image.shape(2) == folded.shape(2),
        op, "folded (b, r, c), image (b, n, c)");
  Dims d = dims(pe, q, folded.shape(0), image.shape(1), image.shape(2), op);
  check(d.r == folded.shape(1), op, "folded must have heads * t rows");
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs;
  for (const auto* a : {&folded, &image, &pe, &q})
    inputs.push_back(mx::contiguous(*a, false, stream));
  return primitive_output<PointPool>(folded.shape(), std::move(inputs), stream);
}

void PointPool::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  Dims d = dims(inputs[2], inputs[3], inputs[0].shape(0), inputs[1].shape(1),
                inputs[1].shape(2), "point_pool");
  encoder.dispatch([d, f = inputs[0].data<float>(), x = inputs[1].data<float>(),
                    pe = inputs[2].data<float>(), q = inputs[3].data<float>(),
                    o = out.data<float>()]() {
    if (d.r == 0 || d.c == 0) return;
    ThreadPool::instance().run(static_cast<int>(d.b), [&](int p) {
      pool_prompt(d, f, x, pe, q, o, p);
    });
  });
}

void PointPool::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.point_pool: a CPU-only kernel (run on the CPU device)");
}

mx::array point_spread(const mx::array& x, const std::optional<mx::array>& folded,
                       const mx::array& pe, const mx::array& q, const mx::array& values,
                       const mx::array& weight, const mx::array& ln_bias, float eps,
                       mx::StreamOrDevice s) {
  const char* op = "point_spread";
  for (const auto* a : {&x, &pe, &q, &values, &weight, &ln_bias}) check_float32_cpu(*a, op);
  check(!traced({&x, folded ? &*folded : nullptr, &pe, &q, &values, &weight, &ln_bias}), op,
        "no tracer inputs (use the reference)");
  check(values.ndim() == 3 && x.ndim() == 3 && values.shape(2) == x.shape(2) &&
            (x.shape(0) == 1 || x.shape(0) == values.shape(0)),
        op, "x (1 or b, n, c), values (b, r, c)");
  const int64_t b = values.shape(0), n = x.shape(1), c = x.shape(2);
  Dims d = dims(pe, q, b, n, c, op);
  check(d.r == values.shape(1), op, "values must have heads * t rows");
  check(weight.ndim() == 1 && weight.shape(0) == c && ln_bias.ndim() == 1 &&
            ln_bias.shape(0) == c,
        op, "weight and bias must be (c,)");
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs;
  for (const auto* a : {&x, &pe, &q, &values, &weight, &ln_bias})
    inputs.push_back(mx::contiguous(*a, false, stream));
  if (folded) {
    check_float32_cpu(*folded, op);
    check(folded->shape() == values.shape(), op, "folded must have values' shape");
    inputs.push_back(mx::contiguous(*folded, false, stream));
  }
  mx::Shape shape{static_cast<int>(b), static_cast<int>(n), static_cast<int>(c)};
  return primitive_output<PointSpread>(shape, std::move(inputs), stream, eps);
}

void PointSpread::eval_cpu(const std::vector<mx::array>& inputs,
                           std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const auto& x = inputs[0];
  const int64_t b = inputs[3].shape(0);
  Dims d = dims(inputs[1], inputs[2], b, x.shape(1), x.shape(2), "point_spread");
  const float* folded = inputs.size() > 6 ? inputs[6].data<float>() : nullptr;
  encoder.dispatch([d, eps = eps_, shared_x = x.shape(0) == 1, xp = x.data<float>(),
                    pe = inputs[1].data<float>(), q = inputs[2].data<float>(),
                    values = inputs[3].data<float>(), weight = inputs[4].data<float>(),
                    ln_bias = inputs[5].data<float>(), folded, o = out.data<float>(),
                    bytes = out.nbytes()]() {
    if (d.n == 0 || d.c == 0) return;
    advise_huge_pages(o, bytes);
    std::vector<float> ft(folded ? d.b * d.c * d.cols : 0), qt(d.b * d.heads * d.d * d.tp);
    parallel_for(d.b, 1, 1, [&](int64_t p0, int64_t p1) {
      prompt_sides(d, folded, q, ft.data(), qt.data(), p0, p1);
    });
    // Tasks block-major: the prompts of one block of image rows run together (their
    // positional rows stay in cache).
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (d.n + kBlock - 1) / kBlock;
    ThreadPool::instance().run(static_cast<int>(d.b * blocks), [&](int task) {
      const int64_t p = task % d.b, i0 = task / d.b * kBlock;
      spread_block(d, xp, shared_x, folded ? ft.data() + p * d.c * d.cols : nullptr,
                   qt.data() + p * d.heads * d.d * d.tp, pe, values, weight, ln_bias, eps, o, p,
                   i0, std::min(kBlock, d.n - i0));
    });
  });
}

void PointSpread::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.point_spread: a CPU-only kernel (run on the CPU device)");
}

bool PointSpread::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const PointSpread*>(&other);
  return p && p->eps_ == eps_;
}

}  // namespace candle_nn
