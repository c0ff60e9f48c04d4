// y = x W^T + b for a few rows of x (SAM's decoder: 7 prompt tokens): each output is a dot
// product along K, 3 rows x 4 columns at a time on 8-wide vectors, output columns spread over
// the thread pool. OpenBLAS's threaded sgemm splits such a product across its threads and
// synchronises them several times per call; on a busy machine a descheduled BLAS thread stalls
// each call for a scheduler time slice (measured: a 7x2048 @ 2048x256 product 0.15 ms alone,
// 80 ms with four other jobs on the two cores; this kernel: 0.11 ms alone). The pool here never
// waits for a worker that is not running.
#include <algorithm>
#include <stdexcept>

#include "cpu_eval.h"
#include "kernels.h"
#include "mlx/backend/cpu/encoder.h"
#include "thread_pool.h"


namespace candle_nn {

namespace {

typedef float V8 __attribute__((vector_size(32), aligned(4), may_alias));
constexpr int kLanes = 8;

CANDLE_NN_INLINE V8 load8(const float* p) { return *reinterpret_cast<const V8*>(p); }

CANDLE_NN_INLINE float lane_sum(V8 v) {
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

// y[r0 + i, n0 + j] for i < R, j < NC: each k-step loads NC vectors of W and R of x for R * NC
// multiply-adds (3 x 4: 7 loads for 12 FMAs).
template <int R, int NC>
CANDLE_NN_INLINE void tile_dot(const float* x, const float* w, const float* bias, float* y,
                               int64_t r0, int64_t n0, int64_t k, int64_t n_out) {
  const int64_t k8 = k / kLanes * kLanes;
  V8 acc[R][NC];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NC; ++j) acc[i][j] = V8{};
  for (int64_t p = 0; p < k8; p += kLanes) {
    V8 wv[NC];
    for (int j = 0; j < NC; ++j) wv[j] = load8(w + (n0 + j) * k + p);
    for (int i = 0; i < R; ++i) {
      V8 xv = load8(x + (r0 + i) * k + p);
      for (int j = 0; j < NC; ++j) acc[i][j] += xv * wv[j];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NC; ++j) {
      float s = lane_sum(acc[i][j]);
      for (int64_t p = k8; p < k; ++p) s += x[(r0 + i) * k + p] * w[(n0 + j) * k + p];
      y[(r0 + i) * n_out + n0 + j] = bias ? s + bias[n0 + j] : s;
    }
}

template <int R>
CANDLE_NN_INLINE void row_group(const float* x, const float* w, const float* bias, float* y,
                                int64_t r0, int64_t n0, int64_t n1, int64_t k, int64_t n_out) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) tile_dot<R, 4>(x, w, bias, y, r0, n, k, n_out);
  for (; n < n1; ++n) tile_dot<R, 1>(x, w, bias, y, r0, n, k, n_out);
}

CANDLE_NN_MULTIVERSION
void linear_rows_range(const float* x, const float* w, const float* bias, float* y, int m,
                       int64_t n0, int64_t n1, int64_t k, int64_t n_out) {
  int r = 0;
  for (; r + 3 <= m; r += 3) row_group<3>(x, w, bias, y, r, n0, n1, k, n_out);
  if (m - r == 2) row_group<2>(x, w, bias, y, r, n0, n1, k, n_out);
  if (m - r == 1) row_group<1>(x, w, bias, y, r, n0, n1, k, n_out);
}

}  // namespace

mx::array linear_rows(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                      mx::StreamOrDevice s) {
  check_float32_cpu(x, "linear_rows");
  check_float32_cpu(w, "linear_rows");
  if (x.ndim() < 1 || w.ndim() != 2 || x.shape(-1) != w.shape(1))
    throw std::invalid_argument("candle_nn.linear_rows: x (..., K), w (N, K)");
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs{mx::contiguous(x, false, stream), mx::contiguous(w, false, stream)};
  if (bias) {
    check_float32_cpu(*bias, "linear_rows");
    if (bias->ndim() != 1 || bias->shape(0) != w.shape(0))
      throw std::invalid_argument("candle_nn.linear_rows: bias must be (N,)");
    inputs.push_back(mx::contiguous(*bias, false, stream));
  }
  if (traced({&x, &w, bias ? &*bias : nullptr})) {
    auto y = mx::matmul(x, mx::transpose(w, s), stream);
    return bias ? mx::add(y, *bias, stream) : y;
  }
  mx::Shape shape = x.shape();
  shape.back() = w.shape(0);
  return mx::array(shape, mx::float32, std::make_shared<LinearRows>(stream, bias.has_value()),
                   inputs);
}

void LinearRows::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const float* bias = has_bias_ ? inputs[2].data<float>() : nullptr;
  const int64_t k = w.shape(1), n = w.shape(0);
  const int m = k ? static_cast<int>(x.size() / k) : 0;
  encoder.dispatch([xp = x.data<float>(), wp = w.data<float>(), bias, yp = out.data<float>(), m,
                    n, k]() {
    if (m == 0 || n == 0) return;
    if (k == 0) {
      for (int r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j) yp[r * n + j] = bias ? bias[j] : 0.0f;
      return;
    }
    // columns per task: enough work (m * k multiply-adds each) to pay for a task
    int64_t min_cols = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(m * k, 1));
    parallel_for(n, min_cols, 1, [&](int64_t b, int64_t e) {
      linear_rows_range(xp, wp, bias, yp, m, b, e, k, n);
    });
  });
}

void LinearRows::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.linear_rows: a CPU-only kernel (run on the CPU device)");
}

bool LinearRows::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const LinearRows*>(&other);
  return p && p->has_bias_ == has_bias_;
}

}  // namespace candle_nn
