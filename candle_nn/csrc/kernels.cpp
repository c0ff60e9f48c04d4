#include "kernels.h"

#include <stdexcept>

#include "math_f32.h"
#include "mlx/backend/cpu/encoder.h"
#include "thread_pool.h"

// x86-64: each hot loop is compiled twice (AVX2+FMA and the baseline), the loader picks the one
// the CPU runs (GCC/Clang function multiversioning), so one build works on every x86-64 CPU.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define CANDLE_NN_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CANDLE_NN_MULTIVERSION
#endif
#define CANDLE_NN_INLINE inline __attribute__((always_inline))

namespace candle_nn {

namespace {

constexpr int64_t kMinChunk = 1 << 15;  // elements per task: below this, threads cost more

template <Act A>
CANDLE_NN_INLINE float activate(float v) {
  if constexpr (A == Act::Relu) return v > 0.0f ? v : 0.0f;
  if constexpr (A == Act::Silu) return silu_f32(v);
  if constexpr (A == Act::Gelu) return gelu_f32(v);
  return v;
}

template <Act A, Residual M, bool B>
CANDLE_NN_INLINE void bias_act_rows(const float* x, const float* bias, const float* res,
                                    float* out, int64_t begin, int64_t end, int64_t c) {
  for (int64_t row = begin; row < end; row += c) {
    const float* xr = x + row;
    const float* rr = res + row;
    float* o = out + row;
    for (int64_t j = 0; j < c; ++j) {
      float v = xr[j];
      if constexpr (B) v += bias[j];
      if constexpr (M == Residual::BeforeAct) v += rr[j];
      v = activate<A>(v);
      if constexpr (M == Residual::AfterAct) v += rr[j];
      o[j] = v;
    }
  }
}

template <Act A>
CANDLE_NN_INLINE void bias_act_mode(const float* x, const float* bias, const float* res,
                                    float* out, int64_t begin, int64_t end, int64_t c,
                                    Residual mode) {
  bool b = bias != nullptr;
  switch (mode) {
    case Residual::None:
      return b ? bias_act_rows<A, Residual::None, true>(x, bias, res, out, begin, end, c)
               : bias_act_rows<A, Residual::None, false>(x, bias, res, out, begin, end, c);
    case Residual::BeforeAct:
      return b ? bias_act_rows<A, Residual::BeforeAct, true>(x, bias, res, out, begin, end, c)
               : bias_act_rows<A, Residual::BeforeAct, false>(x, bias, res, out, begin, end, c);
    case Residual::AfterAct:
      return b ? bias_act_rows<A, Residual::AfterAct, true>(x, bias, res, out, begin, end, c)
               : bias_act_rows<A, Residual::AfterAct, false>(x, bias, res, out, begin, end, c);
  }
}

CANDLE_NN_MULTIVERSION
void bias_act_range(const float* x, const float* bias, const float* res, float* out,
                    int64_t begin, int64_t end, int64_t c, Act act, Residual mode) {
  switch (act) {
    case Act::Identity:
      return bias_act_mode<Act::Identity>(x, bias, res, out, begin, end, c, mode);
    case Act::Relu:
      return bias_act_mode<Act::Relu>(x, bias, res, out, begin, end, c, mode);
    case Act::Silu:
      return bias_act_mode<Act::Silu>(x, bias, res, out, begin, end, c, mode);
    case Act::Gelu:
      return bias_act_mode<Act::Gelu>(x, bias, res, out, begin, end, c, mode);
  }
}

// softmax of rows [row0, row1) of length n; 8 partial maxima/sums so the reductions vectorise.
CANDLE_NN_MULTIVERSION
void softmax_rows(const float* x, float* out, int64_t row0, int64_t row1, int64_t n) {
  constexpr int L = 8;
  for (int64_t r = row0; r < row1; ++r) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    float mx8[L];
    for (int l = 0; l < L; ++l) mx8[l] = -__builtin_inff();
    int64_t j = 0;
    for (; j + L <= n; j += L)
      for (int l = 0; l < L; ++l) mx8[l] = xr[j + l] > mx8[l] ? xr[j + l] : mx8[l];
    float m = -__builtin_inff();
    for (int l = 0; l < L; ++l) m = mx8[l] > m ? mx8[l] : m;
    for (; j < n; ++j) m = xr[j] > m ? xr[j] : m;
    if (m == -__builtin_inff()) m = 0.0f;  // a fully masked row: exp(-inf - 0) = 0 below
    float s8[L] = {};
    j = 0;
    for (; j + L <= n; j += L)
      for (int l = 0; l < L; ++l) {
        float e = exp_f32(xr[j + l] - m);
        o[j + l] = e;
        s8[l] += e;
      }
    float s = 0.0f;
    for (int l = 0; l < L; ++l) s += s8[l];
    for (; j < n; ++j) {
      float e = exp_f32(xr[j] - m);
      o[j] = e;
      s += e;
    }
    float inv = 1.0f / s;
    for (j = 0; j < n; ++j) o[j] *= inv;
  }
}

void check_float32_cpu(const mx::array& a, const char* op) {
  if (a.dtype() != mx::float32)
    throw std::invalid_argument(std::string("candle_nn.") + op + ": float32 only");
}

// The output takes the input's buffer when nothing else holds it (saves an allocation).
void alloc_like(const mx::array& in, mx::array& out) {
  if (in.is_donatable() && in.flags().row_contiguous && in.data_size() == in.size())
    out.copy_shared_buffer(in);
  else
    out.set_data(mx::allocator::malloc(out.nbytes()));
}

}  // namespace

mx::array bias_act(const mx::array& x, const std::optional<mx::array>& bias,
                   const std::optional<mx::array>& residual, Act act, Residual mode,
                   mx::StreamOrDevice s) {
  check_float32_cpu(x, "bias_act");
  auto stream = mx::to_stream(s);
  if (x.ndim() == 0) throw std::invalid_argument("candle_nn.bias_act: x must have an axis");
  std::vector<mx::array> inputs{mx::contiguous(x, false, stream)};
  if (bias) {
    check_float32_cpu(*bias, "bias_act");
    if (bias->ndim() != 1 || bias->shape(0) != x.shape(-1))
      throw std::invalid_argument("candle_nn.bias_act: bias must be (C,) with C = x.shape[-1]");
    inputs.push_back(mx::contiguous(*bias, false, stream));
  }
  if (mode != Residual::None) {
    if (!residual) throw std::invalid_argument("candle_nn.bias_act: residual missing");
    check_float32_cpu(*residual, "bias_act");
    if (residual->shape() != x.shape())
      throw std::invalid_argument("candle_nn.bias_act: residual must have x's shape");
    inputs.push_back(mx::contiguous(*residual, false, stream));
  }
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<BiasAct>(stream, act, mode, bias.has_value()), inputs);
}

void BiasAct::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& out = outputs[0];
  alloc_like(x, out);
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  const float* bias = has_bias_ ? inputs[1].data<float>() : nullptr;
  const float* res = mode_ != Residual::None ? inputs[has_bias_ ? 2 : 1].data<float>() : nullptr;
  int64_t n = static_cast<int64_t>(out.size());
  // Without a bias the channel axis does not matter: one long row vectorises best.
  int64_t c = has_bias_ ? static_cast<int64_t>(x.shape(-1)) : n;
  encoder.dispatch([x = x.data<float>(), bias, res, o = out.data<float>(), n, c, act = act_,
                    mode = mode_]() {
    if (n == 0) return;
    if (!bias) {  // no channel axis: chunks of any length
      parallel_for(n, kMinChunk, 64, [&](int64_t b, int64_t e) {
        bias_act_range(x + b, nullptr, res ? res + b : nullptr, o + b, 0, e - b, e - b, act, mode);
      });
    } else {
      parallel_for(n, kMinChunk, c, [&](int64_t b, int64_t e) {
        bias_act_range(x, bias, res, o, b, e, c, act, mode);
      });
    }
  });
}

void BiasAct::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.bias_act: a CPU-only kernel (run on the CPU device)");
}

bool BiasAct::is_equivalent(const mx::Primitive& other) const {
  auto* o = dynamic_cast<const BiasAct*>(&other);
  return o && o->act_ == act_ && o->mode_ == mode_ && o->has_bias_ == has_bias_;
}

mx::array softmax_last(const mx::array& x, mx::StreamOrDevice s) {
  check_float32_cpu(x, "softmax_last");
  if (x.ndim() == 0) throw std::invalid_argument("candle_nn.softmax_last: x must have an axis");
  auto stream = mx::to_stream(s);
  return mx::array(x.shape(), mx::float32, std::make_shared<SoftmaxLast>(stream),
                   {mx::contiguous(x, false, stream)});
}

void SoftmaxLast::eval_cpu(const std::vector<mx::array>& inputs,
                           std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& out = outputs[0];
  alloc_like(x, out);
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(x);
  encoder.set_output_array(out);
  int64_t n = x.ndim() ? x.shape(-1) : 1;
  int64_t rows = n ? static_cast<int64_t>(x.size()) / n : 0;
  encoder.dispatch([x = x.data<float>(), o = out.data<float>(), rows, n]() {
    if (rows == 0) return;
    int64_t min_rows = std::max<int64_t>(1, kMinChunk / std::max<int64_t>(n, 1));
    parallel_for(rows, min_rows, 1, [&](int64_t b, int64_t e) { softmax_rows(x, o, b, e, n); });
  });
}

void SoftmaxLast::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.softmax_last: a CPU-only kernel (run on the CPU device)");
}

}  // namespace candle_nn
