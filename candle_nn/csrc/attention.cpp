// Multi-head attention over short sequences (window attention) straight from a packed qkv
// projection: softmax(q k^T * scale + bias) v per (sequence, head), one task each on the thread
// pool, the result written in (B, N, heads * D) order. MLX 0.32's CPU path for the same math is
// a transpose + three split copies, two batched matmuls of tiny matrices on one thread, a
// broadcast bias add and a transpose back; here q, k^T and v of one head sit in L1-sized scratch
// and the products run as small register-tiled loops.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "cpu_eval.h"
#include "kernels.h"
#include "math_f32.h"
#include "mlx/backend/cpu/encoder.h"
#include "thread_pool.h"


namespace candle_nn {

namespace {

typedef float V8 __attribute__((vector_size(32), aligned(4), may_alias));
constexpr int kLanes = 8;

CANDLE_NN_INLINE V8 load8(const float* p) { return *reinterpret_cast<const V8*>(p); }
CANDLE_NN_INLINE void store8(float* p, V8 v) { *reinterpret_cast<V8*>(p) = v; }

typedef int I8 __attribute__((vector_size(32)));

// kt[e * ldt + j] = rows[j][e] for 8 keys j (rows[j] null: zeros) and 8 dims e, as an 8x8
// transpose in registers (the scalar loop stores each float to its own cache line).
CANDLE_NN_INLINE void transpose8(const float* const* rows, int64_t e0, float* kt, int64_t ldt) {
  V8 r[8];
  for (int i = 0; i < 8; ++i) r[i] = rows[i] ? load8(rows[i] + e0) : V8{};
  V8 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = __builtin_shuffle(r[2 * i], r[2 * i + 1], I8{0, 8, 1, 9, 4, 12, 5, 13});
    t[2 * i + 1] = __builtin_shuffle(r[2 * i], r[2 * i + 1], I8{2, 10, 3, 11, 6, 14, 7, 15});
  }
  for (int i = 0; i < 2; ++i)
    for (int h = 0; h < 2; ++h) {
      const V8 a = t[4 * i + h], b = t[4 * i + h + 2];
      u[4 * i + 2 * h] = __builtin_shuffle(a, b, I8{0, 1, 8, 9, 4, 5, 12, 13});
      u[4 * i + 2 * h + 1] = __builtin_shuffle(a, b, I8{2, 3, 10, 11, 6, 7, 14, 15});
    }
  for (int e = 0; e < 4; ++e) {
    store8(kt + e * ldt, __builtin_shuffle(u[e], u[e + 4], I8{0, 1, 2, 3, 8, 9, 10, 11}));
    store8(kt + (e + 4) * ldt, __builtin_shuffle(u[e], u[e + 4], I8{4, 5, 6, 7, 12, 13, 14, 15}));
  }
}

// C[MR rows, 8 NV cols] = A[MR, K] @ B[K, 8 NV] (row-major, leading dims lda, ldb, ldc).
template <int MR, int NV>
CANDLE_NN_INLINE void tile(const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                           int64_t ldc, int k) {
  V8 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = V8{};
  for (int p = 0; p < k; ++p) {
    V8 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load8(b + p * ldb + v * kLanes);
    // scalar * vector, not a splat helper: a vector built in an inlined helper is lowered for
    // the baseline target before target_clones specialises it (8 inserts instead of a broadcast)
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] += a[r * lda + p] * bv[v];
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) store8(c + r * ldc + v * kLanes, acc[r][v]);
}

template <int MR>
CANDLE_NN_INLINE void row_block(const float* a, int64_t lda, const float* b, int64_t ldb,
                                float* c, int64_t ldc, int n_vec, int k) {
  int v = 0;
  for (; v + 4 <= n_vec; v += 4) tile<MR, 4>(a, lda, b + v * kLanes, ldb, c + v * kLanes, ldc, k);
  switch (n_vec - v) {
    case 3: tile<MR, 3>(a, lda, b + v * kLanes, ldb, c + v * kLanes, ldc, k); break;
    case 2: tile<MR, 2>(a, lda, b + v * kLanes, ldb, c + v * kLanes, ldc, k); break;
    case 1: tile<MR, 1>(a, lda, b + v * kLanes, ldb, c + v * kLanes, ldc, k); break;
    default: break;
  }
}

// C[M, 8 n_vec] = A[M, K] @ B[K, 8 n_vec]: rows three at a time (12 accumulators of 16 ymm).
CANDLE_NN_INLINE void small_gemm(const float* a, int64_t lda, const float* b, int64_t ldb,
                                 float* c, int64_t ldc, int m, int n_vec, int k) {
  int r = 0;
  for (; r + 3 <= m; r += 3) row_block<3>(a + r * lda, lda, b, ldb, c + r * ldc, ldc, n_vec, k);
  if (m - r == 2) row_block<2>(a + r * lda, lda, b, ldb, c + r * ldc, ldc, n_vec, k);
  if (m - r == 1) row_block<1>(a + r * lda, lda, b, ldb, c + r * ldc, ldc, n_vec, k);
}

// Where one (sequence, head)'s q, k and v rows are: token i's q at q + i * q_stride (d floats),
// k and v likewise; the output row of token i at out + i * out_stride (dv floats). Gathered
// (rows set; a window of an image): token j's q, k and v at rows[j], + d, + 2 d, query i is
// token query_token[i] (its q row and bias row) and its output row is out_rows[i].
struct HeadView {
  const float *q, *k, *v;
  int64_t q_stride, k_stride, v_stride;
  float* out;
  int64_t out_stride;
  const float* const* rows = nullptr;
  const int* query_token = nullptr;
  float* const* out_rows = nullptr;
};

// out_i = sum_j softmax_j(q_i . k_j * scale + bias[i, j]) v_j for lq queries, lk keys of width d,
// values of width dv; bias (lq, lk) row-major or null.
CANDLE_NN_MULTIVERSION
void attention_head(const HeadView& hv, const float* bias, int lq, int lk, int d, int dv,
                    float scale) {
  const int np = (lk + kLanes - 1) / kLanes * kLanes;  // score columns, padded to whole vectors
  const int dp = (dv + kLanes - 1) / kLanes * kLanes;  // v / output columns, padded
  thread_local std::vector<float> scratch;
  size_t need = static_cast<size_t>(lq) * d + static_cast<size_t>(d) * np +
                static_cast<size_t>(lk) * dp + static_cast<size_t>(lq) * dp +
                static_cast<size_t>(lq) * np;
  if (scratch.size() < need) scratch.resize(need);
  float* q = scratch.data();  // (lq, d), scaled
  float* kt = q + static_cast<size_t>(lq) * d;  // (d, np), zero past lk
  float* v = kt + static_cast<size_t>(d) * np;  // (lk, dp), zero past dv
  float* o = v + static_cast<size_t>(lk) * dp;  // (lq, dp)
  float* s = o + static_cast<size_t>(lq) * dp;  // (lq, np)
  for (int i = 0; i < lq; ++i) {
    const float* qi = hv.rows ? hv.rows[hv.query_token[i]] : hv.q + i * hv.q_stride;
    for (int e = 0; e < d; ++e) q[i * d + e] = qi[e] * scale;
  }
  for (int j = 0; j < lk; ++j) {
    const float* vj = hv.rows ? hv.rows[j] + 2 * d : hv.v + j * hv.v_stride;
    for (int e = 0; e < dv; ++e) v[j * dp + e] = vj[e];
    for (int e = dv; e < dp; ++e) v[j * dp + e] = 0.0f;
  }
  if (d % kLanes == 0) {
    for (int j0 = 0; j0 < np; j0 += kLanes) {
      const float* kr[kLanes];
      for (int l = 0; l < kLanes; ++l) {
        const int j = j0 + l;
        kr[l] = j >= lk ? nullptr : hv.rows ? hv.rows[j] + d : hv.k + j * hv.k_stride;
      }
      for (int e0 = 0; e0 < d; e0 += kLanes) transpose8(kr, e0, kt + e0 * np + j0, np);
    }
  } else {
    for (int j = 0; j < lk; ++j) {
      const float* kj = hv.rows ? hv.rows[j] + d : hv.k + j * hv.k_stride;
      for (int e = 0; e < d; ++e) kt[static_cast<int64_t>(e) * np + j] = kj[e];
    }
    for (int e = 0; e < d; ++e)
      for (int j = lk; j < np; ++j) kt[static_cast<int64_t>(e) * np + j] = 0.0f;
  }
  small_gemm(q, d, kt, np, s, np, lq, np / kLanes, d);
  for (int i = 0; i < lq; ++i) {
    float* row = s + static_cast<int64_t>(i) * np;
    if (bias) {
      const float* b = bias + static_cast<int64_t>(hv.rows ? hv.query_token[i] : i) * lk;
      for (int j = 0; j < lk; ++j) row[j] += b[j];
    }
    for (int j = lk; j < np; ++j) row[j] = -__builtin_inff();  // exp gives 0 there
    // 8 partial maxima / sums (np is a multiple of 8) so the reductions vectorise.
    float m8[kLanes], s8[kLanes] = {};
    for (int l = 0; l < kLanes; ++l) m8[l] = row[l];
    for (int j = kLanes; j < np; j += kLanes)
      for (int l = 0; l < kLanes; ++l) m8[l] = row[j + l] > m8[l] ? row[j + l] : m8[l];
    float m = m8[0];
    for (int l = 1; l < kLanes; ++l) m = m8[l] > m ? m8[l] : m;
    if (m == -__builtin_inff()) m = 0.0f;  // a fully masked row
    for (int j = 0; j < np; j += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        float e = exp_f32(row[j + l] - m);
        row[j + l] = e;
        s8[l] += e;
      }
    float sum = 0.0f;
    for (int l = 0; l < kLanes; ++l) sum += s8[l];
    float inv = 1.0f / sum;
    for (int j = 0; j < np; ++j) row[j] *= inv;
  }
  small_gemm(s, np, v, dp, o, dp, lq, dp / kLanes, lk);
  for (int i = 0; i < lq; ++i) {
    const float* oi = o + static_cast<int64_t>(i) * dp;
    float* dst = hv.out_rows ? hv.out_rows[i] : hv.out + i * hv.out_stride;
    int e = 0;
    for (; e + kLanes <= dv; e += kLanes) store8(dst + e, load8(oi + e));  // not a memmove call
    for (; e < dv; ++e) dst[e] = oi[e];
  }
}

mx::array attention_ops(const mx::array& qkv, const std::optional<mx::array>& bias, int heads,
                        float scale, mx::Stream s) {
  int b = qkv.shape(0), n = qkv.shape(1), d = qkv.shape(2) / (3 * heads);
  auto t = mx::transpose(mx::reshape(qkv, {b, n, heads, 3, d}, s), {3, 0, 2, 1, 4}, s);
  auto parts = mx::split(t, 3, 0, s);
  auto q = mx::squeeze(parts[0], 0, s), k = mx::squeeze(parts[1], 0, s),
       v = mx::squeeze(parts[2], 0, s);
  auto scores = mx::matmul(mx::multiply(q, mx::array(scale), s), mx::swapaxes(k, -1, -2, s), s);
  if (bias) scores = mx::add(scores, *bias, s);
  auto o = mx::matmul(mx::softmax(scores, std::vector<int>{-1}, true, s), v, s);
  return mx::reshape(mx::transpose(o, {0, 2, 1, 3}, s), {b, n, heads * d}, s);
}

mx::array heads_ops(const mx::array& q, const mx::array& k, const mx::array& v, int heads,
                    float scale, mx::Stream s) {
  auto split_heads = [&](const mx::array& x) {
    return mx::transpose(mx::reshape(x, {x.shape(0), x.shape(1), heads, -1}, s), {0, 2, 1, 3}, s);
  };
  auto scores = mx::matmul(mx::multiply(split_heads(q), mx::array(scale), s),
                           mx::swapaxes(split_heads(k), -1, -2, s), s);
  auto o = mx::matmul(mx::softmax(scores, std::vector<int>{-1}, true, s), split_heads(v), s);
  return mx::reshape(mx::transpose(o, {0, 2, 1, 3}, s), {q.shape(0), q.shape(1), -1}, s);
}

}  // namespace

mx::array attention_packed(const mx::array& qkv, const std::optional<mx::array>& bias, int heads,
                           float scale, mx::StreamOrDevice s) {
  check_float32_cpu(qkv, "attention_packed");
  if (qkv.ndim() != 3 || heads < 1 || qkv.shape(2) % (3 * heads) != 0)
    throw std::invalid_argument(
        "candle_nn.attention_packed: qkv (B, N, heads * 3 * D) with per head q, k, v");
  int n = qkv.shape(1), d = qkv.shape(2) / (3 * heads);
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs{mx::contiguous(qkv, false, stream)};
  if (bias) {
    check_float32_cpu(*bias, "attention_packed");
    if (bias->shape() != mx::Shape{heads, n, n})
      throw std::invalid_argument("candle_nn.attention_packed: bias must be (heads, N, N)");
    inputs.push_back(mx::contiguous(*bias, false, stream));
  }
  if (traced({&qkv, bias ? &*bias : nullptr})) return attention_ops(qkv, bias, heads, scale, stream);
  return mx::array(mx::Shape{qkv.shape(0), n, heads * d}, mx::float32,
                   std::make_shared<AttentionPacked>(stream, heads, scale, bias.has_value()),
                   inputs);
}

void AttentionPacked::eval_cpu(const std::vector<mx::array>& inputs,
                               std::vector<mx::array>& outputs) {
  const auto& qkv = inputs[0];
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const float* bias = has_bias_ ? inputs[1].data<float>() : nullptr;
  const int n = qkv.shape(1), heads = heads_, d = qkv.shape(2) / (3 * heads_);
  int64_t tasks = static_cast<int64_t>(qkv.shape(0)) * heads;
  encoder.dispatch([x = qkv.data<float>(), bias, o = out.data<float>(), tasks, n, heads, d,
                    scale = scale_]() {
    if (tasks == 0 || n == 0 || d == 0) return;
    const int64_t stride = static_cast<int64_t>(heads) * 3 * d;
    parallel_for(tasks, 1, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t seq = t / heads;
        int h = static_cast<int>(t % heads);
        const float* base = x + seq * n * stride + static_cast<int64_t>(h) * 3 * d;
        HeadView hv{base, base + d, base + 2 * d, stride, stride, stride,
                    o + seq * n * static_cast<int64_t>(heads) * d + static_cast<int64_t>(h) * d,
                    static_cast<int64_t>(heads) * d};
        attention_head(hv, bias ? bias + static_cast<int64_t>(h) * n * n : nullptr, n, n, d, d,
                       scale);
      }
    });
  });
}

void AttentionPacked::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(
      "candle_nn.attention_packed: a CPU-only kernel (run on the CPU device)");
}

bool AttentionPacked::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const AttentionPacked*>(&other);
  return p && p->heads_ == heads_ && p->scale_ == scale_ && p->has_bias_ == has_bias_;
}

}  // namespace candle_nn

namespace candle_nn {

mx::array attention_heads(const mx::array& q, const mx::array& k, const mx::array& v, int heads,
                          float scale, mx::StreamOrDevice s) {
  for (const auto* a : {&q, &k, &v}) check_float32_cpu(*a, "attention_heads");
  if (q.ndim() != 3 || k.ndim() != 3 || v.ndim() != 3 || heads < 1 ||
      q.shape(0) != k.shape(0) || k.shape(0) != v.shape(0) || k.shape(1) != v.shape(1) ||
      q.shape(2) != k.shape(2) || q.shape(2) % heads != 0 || v.shape(2) % heads != 0)
    throw std::invalid_argument(
        "candle_nn.attention_heads: q (B, Lq, heads * D), k (B, Lk, heads * D), "
        "v (B, Lk, heads * Dv)");
  auto stream = mx::to_stream(s);
  if (traced({&q, &k, &v})) return heads_ops(q, k, v, heads, scale, stream);
  return mx::array(mx::Shape{q.shape(0), q.shape(1), v.shape(2)}, mx::float32,
                   std::make_shared<AttentionHeads>(stream, heads, scale),
                   {mx::contiguous(q, false, stream), mx::contiguous(k, false, stream),
                    mx::contiguous(v, false, stream)});
}

void AttentionHeads::eval_cpu(const std::vector<mx::array>& inputs,
                              std::vector<mx::array>& outputs) {
  const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const int lq = q.shape(1), lk = k.shape(1), heads = heads_;
  const int d = q.shape(2) / heads, dv = v.shape(2) / heads;
  int64_t tasks = static_cast<int64_t>(q.shape(0)) * heads;
  encoder.dispatch([qp = q.data<float>(), kp = k.data<float>(), vp = v.data<float>(),
                    o = out.data<float>(), tasks, lq, lk, heads, d, dv, scale = scale_]() {
    if (tasks == 0 || lq == 0 || dv == 0) return;
    const int64_t qs = static_cast<int64_t>(heads) * d, vs = static_cast<int64_t>(heads) * dv;
    parallel_for(tasks, 1, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t seq = t / heads;
        int h = static_cast<int>(t % heads);
        HeadView hv{qp + seq * lq * qs + static_cast<int64_t>(h) * d,
                    kp + seq * lk * qs + static_cast<int64_t>(h) * d,
                    vp + seq * lk * vs + static_cast<int64_t>(h) * dv, qs, qs, vs,
                    o + seq * lq * vs + static_cast<int64_t>(h) * dv, vs};
        if (lk == 0) {  // no keys: softmax of nothing, MLX gives NaN
          for (int i = 0; i < lq; ++i)
            for (int x = 0; x < dv; ++x) hv.out[i * vs + x] = __builtin_nanf("");
          continue;
        }
        attention_head(hv, nullptr, lq, lk, d, dv, scale);
      }
    });
  });
}

void AttentionHeads::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.attention_heads: a CPU-only kernel (run on the CPU device)");
}

bool AttentionHeads::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const AttentionHeads*>(&other);
  return p && p->heads_ == heads_ && p->scale_ == scale_;
}

}  // namespace candle_nn

namespace candle_nn {

namespace {

// window_attention with MLX ops (traced calls): the image padded with the pad token to whole
// windows, partitioned, attention_ops per window, merged and cropped.
mx::array window_ops(const mx::array& qkv, const std::optional<mx::array>& pad,
                     const std::optional<mx::array>& bias, int heads, int window, float scale,
                     mx::Stream s) {
  const int b = qkv.shape(0), h = qkv.shape(1), w = qkv.shape(2), c3 = qkv.shape(3);
  const int hp = (h + window - 1) / window * window, wp = (w + window - 1) / window * window;
  mx::array x = qkv;
  if (hp != h || wp != w) {
    auto fill = pad ? mx::reshape(*pad, {1, 1, 1, c3}, s) : mx::zeros({1, 1, 1, c3}, mx::float32, s);
    x = mx::slice_update(mx::broadcast_to(fill, {b, hp, wp, c3}, s), qkv,
                         mx::Shape{0, 0, 0, 0}, mx::Shape{b, h, w, c3}, s);
  }
  const int nh = hp / window, nw = wp / window;
  x = mx::reshape(x, {b, nh, window, nw, window, c3}, s);
  x = mx::reshape(mx::transpose(x, {0, 1, 3, 2, 4, 5}, s), {b * nh * nw, window * window, c3}, s);
  auto o = attention_ops(x, bias, heads, scale, s);
  const int c = c3 / 3;
  o = mx::reshape(o, {b, nh, nw, window, window, c}, s);
  o = mx::reshape(mx::transpose(o, {0, 1, 3, 2, 4, 5}, s), {b, hp, wp, c}, s);
  return mx::slice(o, {0, 0, 0, 0}, {b, h, w, c}, s);
}

}  // namespace

mx::array window_attention(const mx::array& qkv, const std::optional<mx::array>& pad,
                           const std::optional<mx::array>& bias, int heads, int window,
                           float scale, mx::StreamOrDevice s) {
  check_float32_cpu(qkv, "window_attention");
  if (qkv.ndim() != 4 || heads < 1 || window < 1 || qkv.shape(3) % (3 * heads) != 0)
    throw std::invalid_argument(
        "candle_nn.window_attention: qkv (B, H, W, heads * 3 * D) with per head q, k, v, "
        "window >= 1");
  const int n = window * window, c3 = qkv.shape(3);
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs{mx::contiguous(qkv, false, stream)};
  if (pad) {
    check_float32_cpu(*pad, "window_attention");
    if (pad->shape() != mx::Shape{c3})
      throw std::invalid_argument("candle_nn.window_attention: pad must be (heads * 3 * D,)");
    inputs.push_back(mx::contiguous(*pad, false, stream));
  }
  if (bias) {
    check_float32_cpu(*bias, "window_attention");
    if (bias->shape() != mx::Shape{heads, n, n})
      throw std::invalid_argument(
          "candle_nn.window_attention: bias must be (heads, window², window²)");
    inputs.push_back(mx::contiguous(*bias, false, stream));
  }
  if (traced({&qkv, pad ? &*pad : nullptr, bias ? &*bias : nullptr}))
    return window_ops(qkv, pad, bias, heads, window, scale, stream);
  return mx::array(mx::Shape{qkv.shape(0), qkv.shape(1), qkv.shape(2), c3 / 3}, mx::float32,
                   std::make_shared<WindowAttention>(stream, heads, window, scale,
                                                     pad.has_value(), bias.has_value()),
                   inputs);
}

void WindowAttention::eval_cpu(const std::vector<mx::array>& inputs,
                               std::vector<mx::array>& outputs) {
  const auto& qkv = inputs[0];
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const float* pad = has_pad_ ? inputs[1].data<float>() : nullptr;
  const float* bias = has_bias_ ? inputs[has_pad_ ? 2 : 1].data<float>() : nullptr;
  const int b = qkv.shape(0), h = qkv.shape(1), w = qkv.shape(2);
  const int heads = heads_, ws = window_, d = qkv.shape(3) / (3 * heads_);
  const int nh = (h + ws - 1) / ws, nw = (w + ws - 1) / ws;
  const int64_t tasks = static_cast<int64_t>(b) * nh * nw * heads;
  encoder.dispatch([x = qkv.data<float>(), pad, bias, o = out.data<float>(), tasks, b, h, w, nh,
                    nw, heads, ws, d, scale = scale_]() {
    if (tasks == 0 || d == 0) return;
    const int64_t stride = static_cast<int64_t>(heads) * 3 * d, ostride = int64_t{heads} * d;
    const int n = ws * ws;
    // Tokens past the image's bottom / right edge: the pad token (zeros without one); they are
    // keys and values only, no output row is computed for them.
    std::vector<float> zeros(pad ? 0 : stride, 0.0f);
    const float* fill = pad ? pad : zeros.data();
    // Task t's rows: token j's q, k, v at rows[j], query i (a token inside the image) is token
    // query_token[i], its output row out_rows[i]; returns the number of queries.
    auto gather = [&](int64_t t, const float** rows, int* query_token, float** out_rows) {
      const int head = static_cast<int>(t % heads);
      const int64_t win = t / heads;
      const int wx = static_cast<int>(win % nw), wy = static_cast<int>(win / nw % nh);
      const int64_t img = win / (int64_t{nw} * nh);
      const int64_t hoff = int64_t{head} * 3 * d;
      int lq = 0;
      for (int ty = 0; ty < ws; ++ty)
        for (int tx = 0; tx < ws; ++tx) {
          const int y = wy * ws + ty, xx = wx * ws + tx, tok = ty * ws + tx;
          if (y < h && xx < w) {
            const int64_t pix = (img * h + y) * w + xx;
            rows[tok] = x + pix * stride + hoff;
            query_token[lq] = tok;
            out_rows[lq++] = o + pix * ostride + int64_t{head} * d;
          } else {
            rows[tok] = fill + hoff;
          }
        }
      return lq;
    };
    parallel_for(tasks, 1, 1, [&](int64_t t0, int64_t t1) {
      thread_local std::vector<const float*> rows;
      thread_local std::vector<float*> out_rows;
      thread_local std::vector<int> query_token;
      rows.resize(n), out_rows.resize(n), query_token.resize(n);
      for (int64_t t = t0; t < t1; ++t) {
        const int lq = gather(t, rows.data(), query_token.data(), out_rows.data());
        const int head = static_cast<int>(t % heads);
        HeadView hv{nullptr, nullptr, nullptr, 0, 0, 0, nullptr, 0,
                    rows.data(), query_token.data(), out_rows.data()};
        attention_head(hv, bias ? bias + int64_t{head} * n * n : nullptr, lq, n, d, d, scale);
      }
    });
  });
}

void WindowAttention::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(
      "candle_nn.window_attention: a CPU-only kernel (run on the CPU device)");
}

bool WindowAttention::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const WindowAttention*>(&other);
  return p && p->heads_ == heads_ && p->window_ == window_ && p->scale_ == scale_ &&
         p->has_pad_ == has_pad_ && p->has_bias_ == has_bias_;
}

}  // namespace candle_nn
