// SAM's mask decoder output upscaling for many prompts (automatic mask generation): per prompt,
// the first transposed conv's output (Linear to 2x2 blocks of c1) in factored form, scale_i
// shared_i + coeff_i · weight + bias (shared per image, k coefficients per image token) ->
// LayerNorm -> GELU -> Linear to 2x2 blocks of c2 -> GELU -> the masks' hypernetwork vectors, m
// products of c2 -> (m, n, 16) logits in block layout (per token its 4x4 output pixels). As MLX
// ops that is five passes over intermediates of 4 to 8 MB per prompt, each in a fresh buffer
// faulted in page by page, and a final product whose transposed operand MLX copies first; here
// one task per block of tokens of one prompt, every intermediate in per-thread scratch that
// stays in cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cpu_eval.h"
#include "kernels.h"
#include "math_f32.h"
#include "mlx/backend/cpu/encoder.h"
#include "small_gemm.h"
#include "thread_pool.h"

namespace candle_nn {

namespace {

using small_gemm::gemm_strided;
using small_gemm::kLanes;
using small_gemm::V8;
typedef int32_t V8i __attribute__((vector_size(32)));

// gelu_f32 (math_f32.h) on 8 lanes, with the same polynomials: the erfc polynomial is skipped
// where no lane has |x / sqrt 2| >= 1 (most LayerNorm outputs), the erf one where none is below.
CANDLE_NN_INLINE V8 gelu8(V8 x) {
  const V8 z = x * 0.70710678118654752f;
  const V8 a = z < 0.0f ? -z : z;
  const V8i is_small = a < 1.0f;
  uint64_t lanes[4];
  std::memcpy(lanes, &is_small, sizeof lanes);
  const uint64_t all = ~uint64_t{0};
  const bool any_large = (lanes[0] & lanes[1] & lanes[2] & lanes[3]) != all;
  const bool any_small = (lanes[0] | lanes[1] | lanes[2] | lanes[3]) != 0;
  V8 small{}, large{};
  if (any_small) small = 1.0f + z * erf_small_ratio(z * z);
  if (any_large) {
    const V8 q = erfc_large(a);
    large = z < 0.0f ? q : 2.0f - q;
  }
  return 0.5f * x * (is_small ? small : large);
}

// GELU of n floats (n a multiple of 8) in place.
CANDLE_NN_INLINE void gelu_inplace(float* x, int64_t n) {
  for (int64_t j = 0; j < n; j += kLanes) small_gemm::store8(x + j, gelu8(small_gemm::load8(x + j)));
}

struct Shape {
  int64_t u, n, k, c1, c2, m, mp;  // k: coefficients per token; mp: m rounded up to 8
};

// Lane r of the result: the sum of the lanes of a[r] (eight horizontal sums side by side, a
// tree of shuffles and adds).
CANDLE_NN_INLINE V8 lane_sums(const V8 (&a)[kLanes]) {
  V8 t[4], u[2];
  for (int i = 0; i < 4; ++i)  // [a(0+1), b(0+1), a(2+3), b(2+3), ...] of a = a[2i], b = a[2i+1]
    t[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
  for (int i = 0; i < 2; ++i)  // four rows' sums of lanes 0-3 (lanes 0-3), of 4-7 (lanes 4-7)
    u[i] = __builtin_shufflevector(t[2 * i], t[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
           __builtin_shufflevector(t[2 * i], t[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(u[0], u[1], 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(u[0], u[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

// LayerNorm over rows of w floats (w a multiple of 8), then exact GELU, in place: eight rows at
// a time, their means and variances as one vector (eight independent accumulator chains instead
// of one row's, one horizontal reduction for eight rows), the rest a row at a time.
CANDLE_NN_INLINE void norm_gelu(float* x, int64_t rows, int64_t w, const float* weight,
                                const float* bias, float eps) {
  using small_gemm::load8;
  using small_gemm::store8;
  int64_t r = 0;
  for (; r + kLanes <= rows; r += kLanes) {
    float* rows8 = x + r * w;
    V8 acc[kLanes] = {};
    for (int64_t ch = 0; ch < w; ch += kLanes)
      for (int i = 0; i < kLanes; ++i) acc[i] += load8(rows8 + i * w + ch);
    const V8 mean = lane_sums(acc) / static_cast<float>(w);
    for (int i = 0; i < kLanes; ++i) acc[i] = V8{};
    for (int64_t ch = 0; ch < w; ch += kLanes)
      for (int i = 0; i < kLanes; ++i) {
        const V8 v = load8(rows8 + i * w + ch) - mean[i];
        acc[i] += v * v;
      }
    const V8 var = lane_sums(acc);
    V8 inv;
    for (int i = 0; i < kLanes; ++i)
      inv[i] = 1.0f / std::sqrt(var[i] / static_cast<float>(w) + eps);
    for (int i = 0; i < kLanes; ++i) {
      float* row = rows8 + i * w;
      for (int64_t ch = 0; ch < w; ch += kLanes)
        store8(row + ch, gelu8((load8(row + ch) - mean[i]) * inv[i] * load8(weight + ch) +
                               load8(bias + ch)));
    }
  }
  for (; r < rows; ++r) {
    float* row = x + r * w;
    small_gemm::layer_norm_row(row, w, weight, bias, eps);
    gelu_inplace(row, w);
  }
}

// The Linears' weights are used as panels of kPanel columns, each contiguous (pack_panels): a
// panel of a (k, 256) row-major weight is k lines 1 KB apart, which fall into a few of L1's sets
// and evict each other between the row tiles that reuse them.
constexpr int64_t kPanel = 16;

// products with a panel-packed B (k x cols): C (m x cols, row stride ldc) = init + A B, init
// the matrix at src (row stride lds; lds 0: one row for every row) or zeros.
CANDLE_NN_INLINE void gemm_panels(const float* a, int64_t lda, const float* bp, float* c,
                                  int64_t ldc, int64_t m, int64_t cols, int64_t k,
                                  const float* src, int64_t lds) {
  for (int64_t j0 = 0; j0 < cols; j0 += kPanel)
    gemm_strided(a, lda, 1, bp + j0 * k, kPanel, c + j0, ldc, m, kPanel, k,
                 src ? src + j0 : nullptr, lds, m);
}

// Rows of x1 (token, 2x2 block) per pass of the second Linear, GELU and the hypernetwork
// product: their x2 (kChunk x 4 c2) stays in L1.
constexpr int64_t kChunk = 24;

// Tokens [i0, i0 + k) of prompt p. w2t (c1, 4 c2): the second Linear's weight transposed; ht
// (c2, mp): the prompt's hypernetwork vectors transposed, zero past m.
CANDLE_NN_MULTIVERSION
void upscale_block(const Shape& s, const float* scale, const float* shared, const float* coeff,
                   const float* weight, const float* bias, const float* ln_w, const float* ln_b,
                   float eps, const float* w2t, const float* b2, const float* ht, float* out,
                   int64_t p, int64_t i0, int64_t k) {
  thread_local std::vector<float> x1, x2, y;
  const int64_t w1 = 4 * s.c1;
  x1.resize(k * w1);
  x2.resize(kChunk * 4 * s.c2);
  y.resize(k * 16 * s.mp);
  // x1 (k, 4 c1) = scale shared + bias, then + coeff · weight[p]
  for (int64_t i = 0; i < k; ++i) {
    const float a = scale[p * s.n + i0 + i];
    const float* sh = shared + (i0 + i) * w1;
    float* row = x1.data() + i * w1;
    for (int64_t j = 0; j < w1; ++j) row[j] = a * sh[j] + bias[j];
  }
  gemm_panels(coeff + (p * s.n + i0) * s.k, s.k, weight + p * s.k * w1, x1.data(), w1, k, w1,
              s.k, x1.data(), w1);
  norm_gelu(x1.data(), 4 * k, s.c1, ln_w, ln_b, eps);  // rows (token, 2x2 block) of c1
  // per kChunk rows of x1: x2 = GELU(x1 · w2t + b2), then y (16 k, mp) = rows (token, 4x4
  // block) of c2 · the hypernetwork vectors
  const int64_t w2 = 4 * s.c2;
  for (int64_t r0 = 0; r0 < 4 * k; r0 += kChunk) {
    const int64_t rows = std::min(kChunk, 4 * k - r0);
    gemm_panels(x1.data() + r0 * s.c1, s.c1, w2t, x2.data(), w2, rows, w2, s.c1, b2, 0);
    gelu_inplace(x2.data(), rows * w2);
    gemm_strided(x2.data(), s.c2, 1, ht, s.mp, y.data() + 4 * r0 * s.mp, s.mp, 4 * rows, s.mp,
                 s.c2, nullptr, 0, 4 * rows);
  }
  for (int64_t mm = 0; mm < s.m; ++mm) {
    float* o = out + ((p * s.m + mm) * s.n + i0) * 16;
    for (int64_t r = 0; r < 16 * k; ++r) o[r] = y[r * s.mp + mm];
  }
}

// dst (cols, rows) = src (rows, cols)ᵀ, zero columns of dst from `rows` to ld.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst, int64_t ld) {
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < ld; ++i) dst[j * ld + i] = i < rows ? src[i * cols + j] : 0.0f;
}

// dst: b (rows x cols, row stride cols; cols a multiple of kPanel) as cols / kPanel panels of
// (rows x kPanel), each contiguous.
void pack_panels(const float* b, int64_t rows, int64_t cols, float* dst) {
  for (int64_t j0 = 0; j0 < cols; j0 += kPanel)
    for (int64_t i = 0; i < rows; ++i)
      std::copy(b + i * cols + j0, b + i * cols + j0 + kPanel, dst + (j0 * rows + i * kPanel));
}

void check(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("candle_nn.mask_upscale: ") + what);
}

Shape shape_of(const std::vector<mx::array>& in) {
  // scale, shared, coeff, weight, bias, ln_w, ln_b, w2, b2, hyper
  const auto &coeff = in[2], &shared = in[1], &w2 = in[7], &hyper = in[9];
  Shape s{coeff.shape(0), coeff.shape(1), coeff.shape(2), shared.shape(1) / 4, w2.shape(0) / 4,
          hyper.shape(1), 0};
  s.mp = (s.m + kLanes - 1) / kLanes * kLanes;
  return s;
}

}  // namespace

mx::array mask_upscale(const mx::array& scale, const mx::array& shared, const mx::array& coeff,
                       const mx::array& weight, const mx::array& bias, const mx::array& ln_w,
                       const mx::array& ln_b, float eps, const mx::array& w2,
                       const mx::array& b2, const mx::array& hyper, mx::StreamOrDevice st) {
  std::vector<const mx::array*> all{&scale, &shared, &coeff, &weight, &bias, &ln_w, &ln_b, &w2,
                                    &b2, &hyper};
  for (const auto* a : all) check_float32_cpu(*a, "mask_upscale");
  check(!traced({&scale, &shared, &coeff, &weight, &bias, &ln_w, &ln_b, &w2, &b2, &hyper}),
        "no tracer inputs (use the reference)");
  check(scale.ndim() == 2 && shared.ndim() == 2 && coeff.ndim() == 3 && weight.ndim() == 3 &&
            w2.ndim() == 2 && hyper.ndim() == 3,
        "ranks");
  const int64_t u = coeff.shape(0), n = coeff.shape(1), k = coeff.shape(2);
  const int64_t c1 = shared.shape(1) / 4, c2 = w2.shape(0) / 4;
  check(scale.shape(0) == u && scale.shape(1) == n && shared.shape(0) == n &&
            shared.shape(1) == 4 * c1 && weight.shape(0) == u && weight.shape(1) == k &&
            weight.shape(2) == 4 * c1 && bias.ndim() == 1 && bias.shape(0) == 4 * c1 &&
            w2.shape(1) == c1 && w2.shape(0) == 4 * c2 && b2.ndim() == 1 &&
            b2.shape(0) == w2.shape(0) && ln_w.ndim() == 1 && ln_w.shape(0) == c1 &&
            ln_b.ndim() == 1 && ln_b.shape(0) == c1 && hyper.shape(0) == u &&
            hyper.shape(2) == c2,
        "scale (u, n), shared (n, 4 c1), coeff (u, n, k), weight (u, k, 4 c1), w2 (4 c2, c1), "
        "hyper (u, m, c2)");
  check(c1 % kLanes == 0 && c2 % kLanes == 0, "channels must be multiples of 8");
  auto stream = mx::to_stream(st);
  std::vector<mx::array> inputs;
  for (const auto* a : all) inputs.push_back(mx::contiguous(*a, false, stream));
  mx::Shape shape{static_cast<int>(u), hyper.shape(1), static_cast<int>(n), 16};
  return primitive_output<MaskUpscale>(shape, std::move(inputs), stream, eps);
}

void MaskUpscale::eval_cpu(const std::vector<mx::array>& inputs,
                           std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const Shape s = shape_of(inputs);
  encoder.dispatch([s, eps = eps_, scale = inputs[0].data<float>(),
                    shared = inputs[1].data<float>(), coeff = inputs[2].data<float>(),
                    weight = inputs[3].data<float>(), bias = inputs[4].data<float>(),
                    ln_w = inputs[5].data<float>(), ln_b = inputs[6].data<float>(),
                    w2 = inputs[7].data<float>(), b2 = inputs[8].data<float>(),
                    hyper = inputs[9].data<float>(), o = out.data<float>(),
                    bytes = out.nbytes()]() {
    if (s.u == 0 || s.n == 0 || s.m == 0) return;
    advise_huge_pages(o, bytes);
    std::vector<float> w2t(s.c1 * 4 * s.c2), w2p(w2t.size()), ht(s.u * s.c2 * s.mp),
        wp(s.u * s.k * 4 * s.c1);
    transpose(w2, 4 * s.c2, s.c1, w2t.data(), 4 * s.c2);
    pack_panels(w2t.data(), s.c1, 4 * s.c2, w2p.data());
    for (int64_t p = 0; p < s.u; ++p)
      pack_panels(weight + p * s.k * 4 * s.c1, s.k, 4 * s.c1, wp.data() + p * s.k * 4 * s.c1);
    for (int64_t p = 0; p < s.u; ++p)
      transpose(hyper + p * s.m * s.c2, s.m, s.c2, ht.data() + p * s.c2 * s.mp, s.mp);
    constexpr int64_t kBlock = 32;
    const int64_t blocks = (s.n + kBlock - 1) / kBlock;
    ThreadPool::instance().run(static_cast<int>(s.u * blocks), [&](int task) {
      const int64_t p = task / blocks, i0 = task % blocks * kBlock;
      upscale_block(s, scale, shared, coeff, wp.data(), bias, ln_w, ln_b, eps, w2p.data(), b2,
                    ht.data() + p * s.c2 * s.mp, o, p, i0, std::min(kBlock, s.n - i0));
    });
  });
}

void MaskUpscale::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.mask_upscale: a CPU-only kernel (run on the CPU device)");
}

bool MaskUpscale::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const MaskUpscale*>(&other);
  return p && p->eps_ == eps_;
}

}  // namespace candle_nn
