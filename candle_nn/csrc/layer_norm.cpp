// LayerNorm over the last axis, float32, rows spread over the thread pool (MLX 0.32's CPU
// layer_norm runs on one thread). Two passes per row (mean, then the centred sum of squares), with
// 8 partial sums so the reductions vectorise.
#include <cmath>
#include <stdexcept>

#include "cpu_eval.h"
#include "kernels.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/fast.h"
#include "thread_pool.h"


namespace candle_nn {

namespace {

// Rows [r0, r1) of length n: out = (x - mean) / sqrt(var + eps) * weight + bias.
CANDLE_NN_MULTIVERSION
void layer_norm_rows(const float* x, const float* weight, const float* bias, float* out,
                     int64_t r0, int64_t r1, int64_t n, float eps) {
  constexpr int L = 8;
  const int64_t n8 = n / L * L;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    float s8[L] = {};
    for (int64_t j = 0; j < n8; j += L)
      for (int l = 0; l < L; ++l) s8[l] += xr[j + l];
    float sum = 0.0f;
    for (int l = 0; l < L; ++l) sum += s8[l];
    for (int64_t j = n8; j < n; ++j) sum += xr[j];
    const float mean = sum / static_cast<float>(n);
    float q8[L] = {};
    for (int64_t j = 0; j < n8; j += L)
      for (int l = 0; l < L; ++l) {
        float d = xr[j + l] - mean;
        q8[l] += d * d;
      }
    float sq = 0.0f;
    for (int l = 0; l < L; ++l) sq += q8[l];
    for (int64_t j = n8; j < n; ++j) sq += (xr[j] - mean) * (xr[j] - mean);
    const float inv = 1.0f / std::sqrt(sq / static_cast<float>(n) + eps);
    if (weight && bias)
      for (int64_t j = 0; j < n; ++j) o[j] = (xr[j] - mean) * inv * weight[j] + bias[j];
    else if (weight)
      for (int64_t j = 0; j < n; ++j) o[j] = (xr[j] - mean) * inv * weight[j];
    else if (bias)
      for (int64_t j = 0; j < n; ++j) o[j] = (xr[j] - mean) * inv + bias[j];
    else
      for (int64_t j = 0; j < n; ++j) o[j] = (xr[j] - mean) * inv;
  }
}

}  // namespace

mx::array layer_norm(const mx::array& x, const std::optional<mx::array>& weight,
                     const std::optional<mx::array>& bias, float eps, mx::StreamOrDevice s) {
  check_float32_cpu(x, "layer_norm");
  if (x.ndim() == 0) throw std::invalid_argument("candle_nn.layer_norm: x must have an axis");
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs{mx::contiguous(x, false, stream)};
  for (const auto* p : {&weight, &bias}) {
    if (!*p) continue;
    check_float32_cpu(**p, "layer_norm");
    if ((*p)->ndim() != 1 || (*p)->shape(0) != x.shape(-1))
      throw std::invalid_argument("candle_nn.layer_norm: weight and bias must be (D,)");
    inputs.push_back(mx::contiguous(**p, false, stream));
  }
  if (traced({&x, weight ? &*weight : nullptr, bias ? &*bias : nullptr}))
    return mx::fast::layer_norm(x, weight, bias, eps, stream);
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<LayerNormRows>(stream, eps, weight.has_value(),
                                                   bias.has_value()),
                   inputs);
}

void LayerNormRows::eval_cpu(const std::vector<mx::array>& inputs,
                             std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& out = outputs[0];
  auto& encoder = begin_eval(stream(), inputs, out);
  const float* weight = has_weight_ ? inputs[1].data<float>() : nullptr;
  const float* bias = has_bias_ ? inputs[has_weight_ ? 2 : 1].data<float>() : nullptr;
  int64_t n = x.shape(-1);
  int64_t rows = n ? static_cast<int64_t>(x.size()) / n : 0;
  encoder.dispatch([xp = x.data<float>(), weight, bias, o = out.data<float>(), rows, n,
                    eps = eps_]() {
    if (rows == 0) return;
    int64_t min_rows = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(n, 1));
    parallel_for(rows, min_rows, 1, [&](int64_t b, int64_t e) {
      layer_norm_rows(xp, weight, bias, o, b, e, n, eps);
    });
  });
}

void LayerNormRows::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.layer_norm: a CPU-only kernel (run on the CPU device)");
}

bool LayerNormRows::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const LayerNormRows*>(&other);
  return p && p->eps_ == eps_ && p->has_weight_ == has_weight_ && p->has_bias_ == has_bias_;
}

}  // namespace candle_nn
