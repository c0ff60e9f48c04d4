// Attention between a few prompt tokens and many image tokens held in factored form (SAM's
// automatic mask generation: b prompts, n = 4096 image tokens, heads x t = 56 token rows r).
// Each prompt's image tokens are `scale_i y_i + coeff_i basis + bias` over rows y shared by
// every prompt, so every product with them is a product with y's projections (per image, per
// head (heads, n, d)) and with coeff's m columns: per prompt a few-row GEMM of inner size m or
// d. MLX runs a batched matmul as one threaded sgemm call per prompt, and the per-head products,
// the softmax, the transposes between the head and prompt layouts and the LayerNorm statistics
// as passes over (b, n, r) arrays; here each prompt (point_pool) or block of a prompt's rows
// (point_probs, point_norm) is one task on the pool, its products single-threaded on 6x16
// register tiles, every intermediate in per-thread scratch.
#include <algorithm>
#include <cmath>
#include <cstring>
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

using small_gemm::gemm_strided;
using small_gemm::kLanes;
using small_gemm::load8;
using small_gemm::store8;
using small_gemm::transpose8;
using small_gemm::V8;

int64_t round8(int64_t x) { return (x + kLanes - 1) / kLanes * kLanes; }

// Per-head products: shared (heads, n, d) rows of the image, tok (heads, b t, d) the prompts'
// tokens. ld of a score block: room for the last head's tp-wide tile (see add_per_head).
struct PerHead {
  int64_t heads, n, d, b, t, tp, r, ld;
};

PerHead per_head_of(const mx::array& shared, const mx::array& tok, int64_t b) {
  PerHead h{shared.shape(0), shared.shape(1), shared.shape(2), b, tok.shape(1) / b, 0, 0, 0};
  h.tp = round8(h.t);
  h.r = h.heads * h.t;
  h.ld = std::max(round8(h.r), round8(h.r - h.t + h.tp));
  return h;
}

// tokt (heads, d, tp): prompt p's t rows of tok (heads, b t, d) per head, transposed, zero past t.
void tokens_t(const PerHead& h, const float* tok, int64_t p, float* tokt) {
  for (int64_t hh = 0; hh < h.heads; ++hh)
    for (int64_t k = 0; k < h.d; ++k) {
      float* row = tokt + (hh * h.d + k) * h.tp;
      for (int64_t u = 0; u < h.tp; ++u)
        row[u] = u < h.t ? tok[((hh * h.b + p) * h.t + u) * h.d + k] : 0.0f;
    }
}

// s (m x ld) of rows [i0, i0 + m) += shared[h] · tokt[h] per head on columns [h t, h t + tp):
// a tile's zero columns past t add 0 to the next head's first columns (heads in order).
CANDLE_NN_INLINE void add_per_head(const PerHead& h, const float* shared, const float* tokt,
                                   float* s, int64_t ld, int64_t i0, int64_t m) {
  for (int64_t hh = 0; hh < h.heads; ++hh) {
    float* c = s + hh * h.t;
    gemm_strided(shared + (hh * h.n + i0) * h.d, h.d, 1, tokt + hh * h.d * h.tp, h.tp, c, ld, m,
                 h.tp, h.d, c, ld, m);
  }
}

// dst (cols x ld) = src (rows x cols)ᵀ, zero columns from `rows` to ld.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst, int64_t ld) {
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < ld; ++i) dst[j * ld + i] = i < rows ? src[i * cols + j] : 0.0f;
}

// Scores of rows [i0, i0 + m) of prompt p: s (m x ld) = coeff · foldᵀ + scale (shared · k) +
// pe · k, column by column r of them (the rest scratch), the per-head products as one, (scale
// shared + pe) · k, of that sum per row in tmp (heads, m, d). foldt (mc x ld) = fold[p]ᵀ, zero
// past r.
CANDLE_NN_INLINE void scores(const PerHead& h, const float* scale, const float* coeff,
                             int64_t mc, const float* foldt, const float* shared, const float* pe,
                             const float* kt, float* s, float* tmp, int64_t p, int64_t i0,
                             int64_t m) {
  // columns past round8(r) are only ever added to (the last head's positional tile)
  if (coeff != nullptr) {
    const int64_t cols = round8(h.r);
    gemm_strided(coeff + (p * h.n + i0) * mc, mc, 1, foldt, h.ld, s, h.ld, m, cols, mc, nullptr,
                 0, m);
    for (int64_t i = 0; i < m; ++i) std::fill(s + i * h.ld + cols, s + (i + 1) * h.ld, 0.0f);
  } else {
    std::fill(s, s + m * h.ld, 0.0f);
  }
  if (shared == nullptr) return add_per_head(h, pe, kt, s, h.ld, i0, m);
  for (int64_t hh = 0; hh < h.heads; ++hh) {
    // a head's m rows of shared, pe and tmp are each m d contiguous floats
    const float* sh = shared + (hh * h.n + i0) * h.d;
    const float* pr = pe + (hh * h.n + i0) * h.d;
    float* rows = tmp + hh * m * h.d;
    if (h.d % kLanes == 0) {
      for (int64_t i = 0; i < m; ++i) {
        const float a = scale[p * h.n + i0 + i];
        const V8 av = {a, a, a, a, a, a, a, a};
        for (int64_t c = i * h.d; c < (i + 1) * h.d; c += kLanes)
          store8(rows + c, av * load8(sh + c) + load8(pr + c));
      }
    } else {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = i * h.d; c < (i + 1) * h.d; ++c)
          rows[c] = scale[p * h.n + i0 + i] * sh[c] + pr[c];
    }
  }
  PerHead block = h;  // tmp's rows: m per head
  block.n = m;
  add_per_head(block, tmp, kt, s, h.ld, 0, m);
}

void check(bool ok, const char* op, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("candle_nn.") + op + ": " + what);
}

void check_per_head(const mx::array& shared, const mx::array& tok, int64_t b, int64_t n,
                    const char* op) {
  check(shared.ndim() == 3 && tok.ndim() == 3 && shared.shape(0) == tok.shape(0) &&
            shared.shape(1) == n && shared.shape(2) == tok.shape(2) && b > 0 &&
            tok.shape(1) % b == 0,
        op, "per-head products need shared (heads, n, d) and tokens (heads, b * t, d)");
}

std::vector<mx::array> contiguous(std::initializer_list<const mx::array*> arrays,
                                  mx::Stream stream) {
  std::vector<mx::array> out;
  for (const auto* a : arrays) out.push_back(mx::contiguous(*a, false, stream));
  return out;
}

// -- point_probs -------------------------------------------------------------------------------
typedef int32_t V8i __attribute__((vector_size(32)));

// exp_f32 (math_f32.h) on 8 lanes: the same operations lane by lane, so the same bits.
CANDLE_NN_INLINE V8 exp8(V8 x_in) {
  const V8 lo = V8{} - 87.3f, hi = V8{} + 88.3f;
  const V8 x = x_in < lo ? lo : (x_in > hi ? hi : x_in);
  const V8 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const V8 r = x - n * 0.693359375f + n * 2.12194440e-4f;
  V8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V8i bits = (__builtin_convertvector(n, V8i) + 127) << 23;
  V8 two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const V8 e = (p * (r * r) + r + 1.0f) * two_n;
  return x_in < lo ? V8{} : e;
}

// inputs: pe, k, [scale, shared], [coeff, fold, bias]
// The softmax over each head's t columns runs on eight rows at once: their columns as vectors
// (8 x 8 transposes), so the maxima, exponentials, sums and inverses are lane-wise over rows;
// the per-column arithmetic is the same as one row at a time (the rest rows).
CANDLE_NN_MULTIVERSION
void probs_block(const PerHead& h, const float* scale, const float* coeff, int64_t mc,
                 const float* foldt, const float* bias, const float* shared, const float* pe,
                 const float* kt, float* out, int64_t p, int64_t i0, int64_t m) {
  thread_local std::vector<float> s, tmp, g, colf;  // colf: the columns, 8 floats each
  s.resize(m * h.ld);
  tmp.resize(shared ? h.heads * m * h.d : 0);
  g.resize(h.r);
  const int64_t chunks = (h.r + kLanes - 1) / kLanes;
  colf.resize(chunks * kLanes * kLanes);
  V8* cols = reinterpret_cast<V8*>(colf.data());  // V8: 4-byte aligned
  scores(h, scale, coeff, mc, foldt, shared, pe, kt, s.data(), tmp.data(), p, i0, m);
  int64_t i = 0;
  for (; i + kLanes <= m; i += kLanes) {
    const float* rows = s.data() + i * h.ld;
    for (int64_t c = 0; c < chunks; ++c) {
      V8 a[kLanes];
      for (int l = 0; l < kLanes; ++l) a[l] = load8(rows + l * h.ld + c * kLanes);
      transpose8(a);
      for (int l = 0; l < kLanes; ++l) cols[c * kLanes + l] = a[l];
    }
    if (bias != nullptr)
      for (int64_t j = 0; j < h.r; ++j) cols[j] += bias[p * h.r + j];
    for (int64_t hh = 0; hh < h.heads; ++hh) {
      V8* col = cols + hh * h.t;
      V8 top = col[0];
      for (int64_t u = 1; u < h.t; ++u) top = top < col[u] ? col[u] : top;
      V8 total{};
      for (int64_t u = 0; u < h.t; ++u) {
        col[u] = exp8(col[u] - top);
        total += col[u];
      }
      const V8 inv = 1.0f / total;
      for (int64_t u = 0; u < h.t; ++u) col[u] *= inv;
    }
    float* o = out + (p * h.n + i0 + i) * h.r;
    for (int64_t c = 0; c < chunks; ++c) {
      V8 a[kLanes];
      for (int l = 0; l < kLanes; ++l) a[l] = cols[c * kLanes + l];
      transpose8(a);
      const int64_t width = std::min<int64_t>(kLanes, h.r - c * kLanes);
      for (int l = 0; l < kLanes; ++l) {
        float* dst = o + l * h.r + c * kLanes;
        if (width == kLanes) {
          store8(dst, a[l]);
        } else {
          for (int64_t j = 0; j < width; ++j) dst[j] = a[l][j];
        }
      }
    }
  }
  for (; i < m; ++i) {
    float* row = s.data() + i * h.ld;
    float* o = out + (p * h.n + i0 + i) * h.r;
    if (bias != nullptr)
      for (int64_t j = 0; j < h.r; ++j) row[j] += bias[p * h.r + j];
    // per head: its maximum on each of its columns, exp over the row, its sum's inverse
    for (int64_t hh = 0; hh < h.heads; ++hh) {
      float top = row[hh * h.t];
      for (int64_t u = 1; u < h.t; ++u) top = std::max(top, row[hh * h.t + u]);
      for (int64_t u = 0; u < h.t; ++u) g[hh * h.t + u] = top;
    }
    for (int64_t j = 0; j < h.r; ++j) row[j] = exp_f32(row[j] - g[j]);
    for (int64_t hh = 0; hh < h.heads; ++hh) {
      float total = 0.0f;
      for (int64_t u = 0; u < h.t; ++u) total += row[hh * h.t + u];
      for (int64_t u = 0; u < h.t; ++u) g[hh * h.t + u] = 1.0f / total;
    }
    for (int64_t j = 0; j < h.r; ++j) o[j] = row[j] * g[j];
  }
}

// -- point_norm --------------------------------------------------------------------------------
// a · b over n floats: 8 lanes at a time, then the rest one by one (a sum in another order than
// one float at a time: a vectorised reduction, which the compiler does not make on its own).
CANDLE_NN_INLINE float dot(const float* a, const float* b, int64_t n) {
  V8 acc{};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) acc += load8(a + j) * load8(b + j);
  float total = 0.0f;
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  for (; j < n; ++j) total += a[j] * b[j];
  return total;
}

struct NormDims {
  int64_t mc, mu, channels;
};

// u (m x mu) rows [coeff, probs, 0...] of rows [i0, i0 + m); then out = inv u with inv the
// rows' 1 / sqrt(var + eps), var = (s² sq + 2 s lin + u G uᵀ) / channels.
CANDLE_NN_MULTIVERSION
void norm_block(const PerHead& h, const NormDims& nd, const float* scale, const float* coeff,
                const float* probs, const float* sq, const float* lc_shared, const float* lct,
                const PerHead* hc, const float* lp_shared, const float* lpt, const float* lin0,
                const float* uppers, float eps, float* out, int64_t p, int64_t i0, int64_t m) {
  thread_local std::vector<float> u, t, lp, lc;
  u.resize(m * nd.mu);
  t.resize(m * nd.mu);
  lp.resize(m * h.ld);
  for (int64_t i = 0; i < m; ++i) {
    float* row = u.data() + i * nd.mu;
    const int64_t g = p * h.n + i0 + i;
    for (int64_t j = 0; j < nd.mc; ++j) row[j] = coeff[g * nd.mc + j];
    for (int64_t j = 0; j < h.r; ++j) row[nd.mc + j] = probs[g * h.r + j];
    for (int64_t j = nd.mc + h.r; j < nd.mu; ++j) row[j] = 0.0f;
  }
  // t = u · upper, upper = the gram's upper triangle with half its diagonal (u gram uᵀ = 2 u ·
  // t): per 16-column panel only the rows of upper up to the panel's last
  const float* upper = uppers + p * nd.mu * nd.mu;
  for (int64_t j0 = 0; j0 < nd.mu; j0 += 2 * kLanes) {
    const int64_t cols = std::min<int64_t>(2 * kLanes, nd.mu - j0);
    gemm_strided(u.data(), nd.mu, 1, upper + j0, nd.mu, t.data() + j0, nd.mu, m, cols, j0 + cols,
                 nullptr, 0, m);
  }
  std::fill(lp.begin(), lp.end(), 0.0f);
  add_per_head(h, lp_shared, lpt, lp.data(), h.ld, i0, m);
  if (lc_shared != nullptr) {
    lc.resize(m * hc->ld);
    std::fill(lc.begin(), lc.end(), 0.0f);
    add_per_head(*hc, lc_shared, lct, lc.data(), hc->ld, i0, m);
  }
  for (int64_t i = 0; i < m; ++i) {
    const int64_t g = p * h.n + i0 + i;
    const float* row = u.data() + i * nd.mu;
    const float quad = 2.0f * dot(row, t.data() + i * nd.mu, nd.mu);
    float lin = lin0[i0 + i] + dot(row + nd.mc, lp.data() + i * h.ld, h.r);
    if (lc_shared != nullptr) lin += dot(row, lc.data() + i * hc->ld, nd.mc);
    const float s = scale ? scale[g] : 1.0f;
    const float var = (s * s * sq[i0 + i] + 2.0f * s * lin + quad) / static_cast<float>(nd.channels);
    const V8 inv = V8{} + 1.0f / std::sqrt(var + eps);
    float* o = out + g * nd.mu;
    for (int64_t j = 0; j < nd.mu; j += kLanes) store8(o + j, inv * load8(row + j));
  }
}

// -- point_pool --------------------------------------------------------------------------------
// Prompt p: out (r x (mc + dv)) = [A coeff, per head (A scale) shared_v] with A the scores'
// softmax over the n image tokens, scores as in `scores`; the values' rows of head hh at
// `values + hh head_stride`, row stride ldv. Without the factored part (coeff, scale, shared
// null, mc 0) only the values, of the scores pe · k.
//
// One pass over the image rows in blocks of kPoolBlock (their scores stay in L1): each block's
// exponentials are taken against the running maximum of their column, the sums and products
// accumulated so far rescaled where a block raises it (an online softmax), so the (n x r)
// scores are never written out and read back. Against a column's maximum that is still -inf
// (every score so far -inf or NaN) the exponentials are taken against 0, so -inf gives 0 and
// NaN stays NaN, as against the column's final maximum.
constexpr int64_t kPoolBlock = 128;

CANDLE_NN_MULTIVERSION
void pool_prompt(const PerHead& h, const float* scale, const float* coeff, int64_t mc,
                 const float* foldt, const float* shared, const float* pe, const float* kt,
                 const float* shared_v, int64_t dv, float* out, int64_t p, float* values,
                 int64_t head_stride, int64_t ldv) {
  thread_local std::vector<float> s, tmp, top, ref, sum, fac;
  s.resize(kPoolBlock * h.ld);
  tmp.resize(shared ? h.heads * kPoolBlock * h.d : 0);
  top.assign(h.r, -INFINITY);
  ref.resize(h.r);
  sum.assign(h.r, 0.0f);
  fac.resize(h.r);
  const int64_t ldo = mc + dv;
  float* o = coeff != nullptr ? out + p * h.r * ldo : nullptr;
  const float* cp = coeff != nullptr ? coeff + p * h.n * mc : nullptr;
  for (int64_t i0 = 0; i0 < h.n; i0 += kPoolBlock) {
    const int64_t m = std::min(kPoolBlock, h.n - i0);
    scores(h, scale, coeff, mc, foldt, shared, pe, kt, s.data(), tmp.data(), p, i0, m);
    for (int64_t j = 0; j < h.r; ++j) fac[j] = top[j];  // the block's maxima, from the old ones
    for (int64_t i = 0; i < m; ++i) {
      const float* row = s.data() + i * h.ld;
      for (int64_t j = 0; j < h.r; ++j) fac[j] = std::max(fac[j], row[j]);
    }
    bool rose = false;
    for (int64_t j = 0; j < h.r; ++j) {
      const float now = fac[j];
      fac[j] = now > top[j] ? (top[j] == -INFINITY ? 0.0f : exp_f32(top[j] - now)) : 1.0f;
      rose = rose || now > top[j];
      top[j] = now;
      ref[j] = now == -INFINITY ? 0.0f : now;
    }
    if (rose && i0 > 0) {
      for (int64_t j = 0; j < h.r; ++j) {
        sum[j] *= fac[j];
        if (o != nullptr)
          for (int64_t c = 0; c < mc; ++c) o[j * ldo + c] *= fac[j];
        float* v = values + (j / h.t) * head_stride + (j % h.t) * ldv;
        for (int64_t c = 0; c < dv; ++c) v[c] *= fac[j];
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      float* row = s.data() + i * h.ld;
      for (int64_t j = 0; j < h.r; ++j) {
        const float e = exp_f32(row[j] - ref[j]);
        row[j] = e;
        sum[j] += e;
      }
      for (int64_t j = h.r; j < h.ld; ++j) row[j] = 0.0f;
    }
    if (coeff != nullptr) {
      gemm_strided(s.data(), 1, h.ld, cp + i0 * mc, mc, o, ldo, h.r, mc, m,
                   i0 > 0 ? o : nullptr, ldo, h.r);
      for (int64_t i = 0; i < m; ++i) {
        const float a = scale[p * h.n + i0 + i];
        float* row = s.data() + i * h.ld;
        for (int64_t j = 0; j < h.r; ++j) row[j] *= a;
      }
    }
    for (int64_t hh = 0; hh < h.heads; ++hh) {
      float* oh = values + hh * head_stride;
      gemm_strided(s.data() + hh * h.t, 1, h.ld, shared_v + (hh * h.n + i0) * dv, dv, oh, ldv,
                   h.t, dv, m, i0 > 0 ? oh : nullptr, ldv, h.t);
    }
  }
  for (int64_t j = 0; j < h.r; ++j) {
    const float inv = 1.0f / sum[j];
    if (o != nullptr)
      for (int64_t c = 0; c < mc; ++c) o[j * ldo + c] *= inv;
    float* v = values + (j / h.t) * head_stride + (j % h.t) * ldv;
    for (int64_t c = 0; c < dv; ++c) v[c] *= inv;
  }
}

// Per prompt: kt (heads, d, tp) of the tokens, foldt (mc x ld) of fold (b, r, mc).
void prompt_sides(const PerHead& h, const float* tok, const float* fold, int64_t mc, float* kt,
                  float* foldt, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    tokens_t(h, tok, p, kt + p * h.heads * h.d * h.tp);
    if (fold != nullptr) transpose(fold + p * h.r * mc, h.r, mc, foldt + p * mc * h.ld, h.ld);
  }
}

}  // namespace

// -- point_probs -------------------------------------------------------------------------------
mx::array point_probs(const mx::array& pe, const mx::array& k, int t,
                      const std::optional<mx::array>& scale,
                      const std::optional<mx::array>& shared,
                      const std::optional<mx::array>& coeff, const std::optional<mx::array>& fold,
                      const std::optional<mx::array>& bias, mx::StreamOrDevice s) {
  const char* op = "point_probs";
  for (const auto* a : {&pe, &k}) check_float32_cpu(*a, op);
  check(pe.ndim() == 3 && k.ndim() == 3, op, "pe (heads, n, d), k (heads, b t, d)");
  check(scale.has_value() == shared.has_value() && coeff.has_value() == fold.has_value() &&
            (!bias || coeff),
        op, "scale with shared, coeff with fold, bias only with them");
  check(t > 0 && k.shape(1) % t == 0, op, "k must have b * t rows");
  const int64_t b = k.shape(1) / t;
  const int64_t n = pe.shape(1);
  check_per_head(pe, k, b, n, op);
  std::vector<mx::array> inputs = contiguous({&pe, &k}, mx::to_stream(s));
  int flags = 0;
  if (scale) {
    check_float32_cpu(*scale, op);
    check_float32_cpu(*shared, op);
    check(scale->ndim() == 2 && scale->shape(0) == b && scale->shape(1) == n &&
              shared->shape() == pe.shape(),
          op, "scale (b, n), shared as pe");
    for (auto& a : contiguous({&*scale, &*shared}, mx::to_stream(s))) inputs.push_back(a);
    flags |= 1;
  }
  if (coeff) {
    check_float32_cpu(*coeff, op);
    check_float32_cpu(*fold, op);
    const int64_t r = pe.shape(0) * (k.shape(1) / b);
    check(coeff->ndim() == 3 && coeff->shape(0) == b && coeff->shape(1) == n &&
              fold->ndim() == 3 && fold->shape(0) == b && fold->shape(1) == r &&
              fold->shape(2) == coeff->shape(2),
          op, "coeff (b, n, m), fold (b, heads t, m)");
    for (auto& a : contiguous({&*coeff, &*fold}, mx::to_stream(s))) inputs.push_back(a);
    flags |= 2;
    if (bias) {
      check_float32_cpu(*bias, op);
      check(bias->ndim() == 2 && bias->shape(0) == b && bias->shape(1) == r, op,
            "bias (b, heads t)");
      inputs.push_back(mx::contiguous(*bias, false, mx::to_stream(s)));
      flags |= 4;
    }
  }
  std::vector<const mx::array*> all;
  for (const auto& a : inputs) all.push_back(&a);
  for (const auto* a : all) check(!traced({a}), op, "no tracer inputs (use the reference)");
  mx::Shape shape{static_cast<int>(b), static_cast<int>(n),
                  static_cast<int>(pe.shape(0) * (k.shape(1) / b))};
  return primitive_output<PointProbs>(shape, std::move(inputs), mx::to_stream(s), flags);
}

void PointProbs::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const int64_t b = out.shape(0);
  PerHead h = per_head_of(inputs[0], inputs[1], b);
  size_t next = 2;
  const float *scale = nullptr, *shared = nullptr, *coeff = nullptr, *fold = nullptr,
              *bias = nullptr;
  int64_t mc = 0;
  if (flags_ & 1) {
    scale = inputs[next++].data<float>();
    shared = inputs[next++].data<float>();
  }
  if (flags_ & 2) {
    mc = inputs[next].shape(2);
    coeff = inputs[next++].data<float>();
    fold = inputs[next++].data<float>();
  }
  if (flags_ & 4) bias = inputs[next++].data<float>();
  encoder.dispatch([h, mc, scale, shared, coeff, fold, bias, pe = inputs[0].data<float>(),
                    k = inputs[1].data<float>(), o = out.data<float>()]() {
    if (h.n == 0 || h.r == 0) return;
    std::vector<float> kt(h.b * h.heads * h.d * h.tp), foldt(fold ? h.b * mc * h.ld : 0);
    prompt_sides(h, k, fold, mc, kt.data(), foldt.data(), 0, h.b);
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (h.n + kBlock - 1) / kBlock;
    ThreadPool::instance().run(static_cast<int>(h.b * blocks), [&](int task) {
      const int64_t p = task / blocks, i0 = task % blocks * kBlock;
      probs_block(h, scale, coeff, mc, fold ? foldt.data() + p * mc * h.ld : nullptr, bias,
                  shared, pe, kt.data() + p * h.heads * h.d * h.tp, o, p, i0,
                  std::min(kBlock, h.n - i0));
    });
  });
}

void PointProbs::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.point_probs: a CPU-only kernel (run on the CPU device)");
}

bool PointProbs::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const PointProbs*>(&other);
  return p && p->flags_ == flags_;
}

// -- point_norm --------------------------------------------------------------------------------
mx::array point_norm(const mx::array& probs, const mx::array& sq, const mx::array& lp_shared,
                     const mx::array& lp_tok, const mx::array& lin0, const mx::array& gram,
                     float eps, int channels, const std::optional<mx::array>& scale,
                     const std::optional<mx::array>& coeff,
                     const std::optional<mx::array>& lc_shared,
                     const std::optional<mx::array>& lc_tok, mx::StreamOrDevice s) {
  const char* op = "point_norm";
  for (const auto* a : {&probs, &sq, &lp_shared, &lp_tok, &lin0, &gram}) check_float32_cpu(*a, op);
  check(probs.ndim() == 3, op, "probs (b, n, heads t)");
  const int64_t b = probs.shape(0), n = probs.shape(1), r = probs.shape(2);
  check_per_head(lp_shared, lp_tok, b, n, op);
  check(lp_shared.shape(0) * (lp_tok.shape(1) / b) == r, op, "probs must have heads * t columns");
  check(sq.ndim() == 1 && sq.shape(0) == n && lin0.ndim() == 1 && lin0.shape(0) == n, op,
        "sq and lin0 (n,)");
  check(coeff.has_value() == lc_shared.has_value() && lc_shared.has_value() == lc_tok.has_value(),
        op, "coeff with lc_shared and lc_tok");
  const int64_t mc = coeff ? coeff->shape(2) : 0;
  const int64_t mu = round8(mc + r);
  check(gram.ndim() == 3 && gram.shape(0) == b && gram.shape(1) == mu && gram.shape(2) == mu, op,
        "gram (b, mu, mu), mu = coeff's and probs' columns rounded up to 8");
  check(channels > 0, op, "channels must be positive");
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = contiguous({&probs, &sq, &lp_shared, &lp_tok, &lin0, &gram},
                                             stream);
  if (scale) {
    check_float32_cpu(*scale, op);
    check(scale->ndim() == 2 && scale->shape(0) == b && scale->shape(1) == n, op, "scale (b, n)");
    inputs.push_back(mx::contiguous(*scale, false, stream));
  }
  if (coeff) {
    for (const auto* a : {&*coeff, &*lc_shared, &*lc_tok}) check_float32_cpu(*a, op);
    check(coeff->ndim() == 3 && coeff->shape(0) == b && coeff->shape(1) == n, op,
          "coeff (b, n, m)");
    check_per_head(*lc_shared, *lc_tok, b, n, op);
    check(lc_shared->shape(0) * (lc_tok->shape(1) / b) == mc, op,
          "coeff must have lc's heads * t columns");
    for (auto& a : contiguous({&*coeff, &*lc_shared, &*lc_tok}, stream)) inputs.push_back(a);
  }
  for (const auto& a : inputs) check(!traced({&a}), op, "no tracer inputs (use the reference)");
  mx::Shape shape{static_cast<int>(b), static_cast<int>(n), static_cast<int>(mu)};
  return primitive_output<PointNorm>(shape, std::move(inputs), stream, eps, channels,
                                     scale.has_value(), coeff.has_value());
}

void PointNorm::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const int64_t b = out.shape(0);
  PerHead h = per_head_of(inputs[2], inputs[3], b);
  size_t next = 6;
  const float* scale = has_scale_ ? inputs[next++].data<float>() : nullptr;
  const float *coeff = nullptr, *lc_shared = nullptr, *lc_tok = nullptr;
  PerHead hc{};
  int64_t mc = 0;
  if (has_coeff_) {
    mc = inputs[next].shape(2);
    coeff = inputs[next++].data<float>();
    hc = per_head_of(inputs[next], inputs[next + 1], b);
    lc_shared = inputs[next++].data<float>();
    lc_tok = inputs[next++].data<float>();
  }
  NormDims nd{mc, out.shape(2), channels_};
  encoder.dispatch([h, hc, nd, eps = eps_, scale, coeff, lc_shared, lc_tok,
                    probs = inputs[0].data<float>(), sq = inputs[1].data<float>(),
                    lp_shared = inputs[2].data<float>(), lp_tok = inputs[3].data<float>(),
                    lin0 = inputs[4].data<float>(), gram = inputs[5].data<float>(),
                    o = out.data<float>(), bytes = out.nbytes()]() {
    if (h.n == 0) return;
    advise_huge_pages(o, bytes);
    std::vector<float> lpt(h.b * h.heads * h.d * h.tp),
        lct(lc_tok ? h.b * hc.heads * hc.d * hc.tp : 0), upper(h.b * nd.mu * nd.mu);
    for (int64_t p = 0; p < h.b; ++p) {
      const float* g = gram + p * nd.mu * nd.mu;
      float* up = upper.data() + p * nd.mu * nd.mu;
      for (int64_t i = 0; i < nd.mu; ++i)
        for (int64_t j = 0; j < nd.mu; ++j)
          up[i * nd.mu + j] = j > i ? g[i * nd.mu + j] : (j == i ? 0.5f * g[i * nd.mu + j] : 0.0f);
      tokens_t(h, lp_tok, p, lpt.data() + p * h.heads * h.d * h.tp);
      if (lc_tok) tokens_t(hc, lc_tok, p, lct.data() + p * hc.heads * hc.d * hc.tp);
    }
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (h.n + kBlock - 1) / kBlock;
    ThreadPool::instance().run(static_cast<int>(h.b * blocks), [&](int task) {
      const int64_t p = task / blocks, i0 = task % blocks * kBlock;
      norm_block(h, nd, scale, coeff, probs, sq, lc_shared,
                 lc_tok ? lct.data() + p * hc.heads * hc.d * hc.tp : nullptr, &hc, lp_shared,
                 lpt.data() + p * h.heads * h.d * h.tp, lin0, upper.data(), eps, o, p, i0,
                 std::min(kBlock, h.n - i0));
    });
  });
}

void PointNorm::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.point_norm: a CPU-only kernel (run on the CPU device)");
}

bool PointNorm::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const PointNorm*>(&other);
  return p && p->eps_ == eps_ && p->channels_ == channels_ &&
         p->has_scale_ == has_scale_ && p->has_coeff_ == has_coeff_;
}

// -- point_pool --------------------------------------------------------------------------------
// inputs: [scale, coeff, fold, shared_k,] pe, q, shared_v
mx::array point_pool(const std::optional<mx::array>& scale, const std::optional<mx::array>& coeff,
                     const std::optional<mx::array>& fold,
                     const std::optional<mx::array>& shared_k, const mx::array& pe,
                     const mx::array& q, const mx::array& shared_v, mx::StreamOrDevice s) {
  const char* op = "point_pool";
  const bool factored = scale.has_value();
  check(coeff.has_value() == factored && fold.has_value() == factored &&
            shared_k.has_value() == factored,
        op, "scale, coeff, fold and shared_k all given or none");
  std::vector<const mx::array*> all;
  if (factored) all = {&*scale, &*coeff, &*fold, &*shared_k};
  for (const auto* a : {&pe, &q, &shared_v}) all.push_back(a);
  for (const auto* a : all) check_float32_cpu(*a, op);
  for (const auto* a : all) check(!traced({a}), op, "no tracer inputs (use the reference)");
  check(pe.ndim() == 3 && q.ndim() == 3 && shared_v.ndim() == 3, op,
        "pe (heads, n, d), q (heads, rows, d), shared_v (heads, n, dv)");
  const int64_t n = pe.shape(1), heads = pe.shape(0), dv = shared_v.shape(2);
  check(shared_v.shape(0) == heads && shared_v.shape(1) == n && dv % kLanes == 0, op,
        "shared_v (heads, n, dv) as pe, dv a multiple of 8");
  auto stream = mx::to_stream(s);
  mx::Shape shape{static_cast<int>(heads), static_cast<int>(q.shape(1)), static_cast<int>(dv)};
  if (factored) {
    check(scale->ndim() == 2 && coeff->ndim() == 3 && fold->ndim() == 3, op,
          "scale (b, n), coeff (b, n, m), fold (b, heads t, m)");
    const int64_t b = scale->shape(0), mc = coeff->shape(2);
    check_per_head(pe, q, b, n, op);
    const int64_t r = heads * (q.shape(1) / b);
    check(scale->shape(1) == n && coeff->shape(0) == b && coeff->shape(1) == n &&
              fold->shape(0) == b && fold->shape(1) == r && fold->shape(2) == mc &&
              shared_k->shape() == pe.shape(),
          op, "shapes: scale (b, n), coeff (b, n, m), fold (b, heads t, m), shared_k as pe");
    check(mc % kLanes == 0, op, "coeff's columns must be a multiple of 8");
    shape = {static_cast<int>(b), static_cast<int>(r), static_cast<int>(mc + dv)};
  } else {
    check(q.shape(0) == heads && q.shape(2) == pe.shape(2), op,
          "q (heads, rows, d) with pe's heads and d");
  }
  std::vector<mx::array> inputs;
  for (const auto* a : all) inputs.push_back(mx::contiguous(*a, false, stream));
  return primitive_output<PointPool>(shape, std::move(inputs), stream, factored);
}

void PointPool::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const size_t first = factored_ ? 4 : 0;  // pe, q, shared_v
  const mx::array &pe = inputs[first], &q = inputs[first + 1], &sv = inputs[first + 2];
  const int64_t rows = q.shape(1), dv = sv.shape(2);
  // without the factored inputs every query row is its own: rows in groups of up to 8 per task
  int64_t b = factored_ ? inputs[0].shape(0) : std::max<int64_t>(rows, 1);
  if (!factored_)
    for (int64_t t = std::min<int64_t>(8, rows); t >= 1; --t)
      if (rows % t == 0) {
        b = rows / t;
        break;
      }
  PerHead h = per_head_of(pe, q, b);
  const int64_t mc = factored_ ? inputs[1].shape(2) : 0;
  const float *scale = nullptr, *coeff = nullptr, *fold = nullptr, *shared_k = nullptr;
  if (factored_) {
    scale = inputs[0].data<float>();
    coeff = inputs[1].data<float>();
    fold = inputs[2].data<float>();
    shared_k = inputs[3].data<float>();
  }
  encoder.dispatch([h, mc, dv, rows, scale, coeff, fold, shared_k, pe = pe.data<float>(),
                    q = q.data<float>(), shared_v = sv.data<float>(), o = out.data<float>()]() {
    if (h.r == 0 || h.b == 0) return;
    std::vector<float> qt(h.b * h.heads * h.d * h.tp), foldt(fold ? h.b * mc * h.ld : 0);
    prompt_sides(h, q, fold, mc, qt.data(), foldt.data(), 0, h.b);
    const int64_t ldo = mc + dv;
    ThreadPool::instance().run(static_cast<int>(h.b), [&](int p) {
      float* values = coeff ? o + p * h.r * ldo + mc : o + p * h.t * dv;
      pool_prompt(h, scale, coeff, mc, fold ? foldt.data() + p * mc * h.ld : nullptr, shared_k,
                  pe, qt.data() + p * h.heads * h.d * h.tp, shared_v, dv, o, p, values,
                  coeff ? h.t * ldo : rows * dv, coeff ? ldo : dv);
    });
  });
}

void PointPool::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.point_pool: a CPU-only kernel (run on the CPU device)");
}

}  // namespace candle_nn
