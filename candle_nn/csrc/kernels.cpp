#include "cpu_eval.h"
#include "kernels.h"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "math_f32.h"
#include "mlx/backend/cpu/encoder.h"
#include "thread_pool.h"


namespace candle_nn {

namespace {

constexpr int64_t kMinChunk = 1 << 15;  // elements per task: below this, threads cost more

template <Act A>
CANDLE_NN_INLINE float activate(float v) {
  // NaN fails v < 0 and comes out as NaN (torch.relu / mx.maximum(x, 0) keep it).
  if constexpr (A == Act::Relu) return v < 0.0f ? 0.0f : v;
  if constexpr (A == Act::Silu) return silu_f32(v);
  if constexpr (A == Act::Gelu) return gelu_f32(v);
  if constexpr (A == Act::Sigmoid) return sigmoid_f32(v);
  return v;
}

// In place (x == out) the loop reads and writes through one pointer: with two equal pointers
// the compiler's overlap check would send it to the scalar version.
template <Act A, Residual M, bool B, bool InPlace>
CANDLE_NN_INLINE void bias_act_rows(const float* x, const float* bias, const float* res,
                                    float* out, int64_t begin, int64_t end, int64_t c) {
  for (int64_t row = begin; row < end; row += c) {
    const float* xr = InPlace ? out + row : x + row;
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

template <Act A, bool InPlace>
CANDLE_NN_INLINE void bias_act_mode(const float* x, const float* bias, const float* res,
                                    float* out, int64_t begin, int64_t end, int64_t c,
                                    Residual mode) {
  with_residual(mode, [&]<Residual M>() CANDLE_NN_LAMBDA_INLINE {
    if (bias != nullptr)
      bias_act_rows<A, M, true, InPlace>(x, bias, res, out, begin, end, c);
    else
      bias_act_rows<A, M, false, InPlace>(x, bias, res, out, begin, end, c);
  });
}

}  // namespace

// Shared with the other kernel files (declared in kernels.h): the epilogue pass and the checks.
CANDLE_NN_MULTIVERSION
void bias_act_range(const float* x, const float* bias, const float* res, float* out,
                    int64_t begin, int64_t end, int64_t c, Act act, Residual mode) {
  with_act(act, [&]<Act A>() CANDLE_NN_LAMBDA_INLINE {
    if (x == out)
      bias_act_mode<A, true>(x, bias, res, out, begin, end, c, mode);
    else
      bias_act_mode<A, false>(x, bias, res, out, begin, end, c, mode);
  });
}

namespace {

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

}  // namespace

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

// Under a transformation (mx.grad, mx.vmap, mx.compile: some input is a tracer) the primitives
// have no vjp/jvp/vmap, so the same math is built from MLX's own ops instead.
bool traced(std::initializer_list<const mx::array*> arrays) {
  for (const auto* a : arrays)
    if (a != nullptr && a->is_tracer()) return true;
  return false;
}

void push_epilogue_inputs(std::vector<mx::array>& inputs, const char* op,
                          const std::optional<mx::array>& bias,
                          const std::optional<mx::array>& residual, Residual mode, int channels,
                          const char* bias_shape, const mx::Shape& out_shape, mx::Stream stream) {
  auto refuse = [op](const std::string& what) {
    throw std::invalid_argument(std::string("candle_nn.") + op + ": " + what);
  };
  if (bias) {
    if (bias->dtype() != mx::float32) refuse("bias must be float32");
    if (bias->ndim() != 1 || bias->shape(0) != channels)
      refuse(std::string("bias must be ") + bias_shape);
    inputs.push_back(mx::contiguous(*bias, false, stream));
  }
  if (mode != Residual::None) {
    if (!residual || residual->shape() != out_shape)
      refuse("residual must have the output's shape");
    if (residual->dtype() != mx::float32) refuse("residual must be float32");
    inputs.push_back(mx::contiguous(*residual, false, stream));
  }
}

mx::array bias_act_ops(mx::array v, const std::optional<mx::array>& bias,
                       const std::optional<mx::array>& residual, Act act, Residual mode,
                       mx::Stream s) {
  if (bias) v = mx::add(v, *bias, s);
  if (mode == Residual::BeforeAct) v = mx::add(v, *residual, s);
  switch (act) {
    case Act::Relu:
      v = mx::maximum(v, mx::array(0.0f), s);
      break;
    case Act::Silu:
      v = mx::multiply(v, mx::sigmoid(v, s), s);
      break;
    case Act::Gelu:
      v = mx::multiply(
          mx::multiply(v, mx::add(mx::array(1.0f), mx::erf(mx::multiply(
                                                          v, mx::array(0.70710678118654752f), s),
                                                      s),
                                  s),
                       s),
          mx::array(0.5f), s);
      break;
    case Act::Sigmoid:
      v = mx::sigmoid(v, s);
      break;
    case Act::Identity:
      break;
  }
  if (mode == Residual::AfterAct) v = mx::add(v, *residual, s);
  return v;
}

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
  if (traced({&x, bias ? &*bias : nullptr, residual ? &*residual : nullptr}))
    return bias_act_ops(x, bias, residual, act, mode, stream);
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<BiasAct>(stream, act, mode, bias.has_value()), inputs);
}

void BiasAct::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  auto& out = outputs[0];
  // Without a bias the in-place loop (x == out) of GELU, SiLU and sigmoid is not vectorised
  // (~15x slower than into a fresh buffer), so only an epilogue with a bias reuses x's buffer.
  if (has_bias_)
    alloc_like(x, out);
  else
    out.set_data(mx::allocator::malloc(out.nbytes()));
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
  if (traced({&x})) return mx::softmax(x, std::vector<int>{-1}, true, stream);
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

namespace candle_nn {

namespace {

// CBLAS's cblas_sgemm (enums passed as ints: CblasRowMajor 101, CblasNoTrans 111, CblasTrans 112).
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                       float, float*, int);
std::atomic<Sgemm> g_sgemm{nullptr};

// im2col rows [m0, m1) of the (N * OH * OW, KH * KW * C) matrix, zeros where the window is off x.
void im2col_rows(const float* x, float* col, int64_t m0, int64_t m1, int h, int w, int c, int oh,
                 int ow, int kh, int kw, int sh, int sw, int ph, int pw) {
  const int64_t k = static_cast<int64_t>(kh) * kw * c;
  for (int64_t m = m0; m < m1; ++m) {
    int64_t n = m / (static_cast<int64_t>(oh) * ow);
    int oy = static_cast<int>((m / ow) % oh), ox = static_cast<int>(m % ow);
    float* dst = col + m * k;
    const float* img = x + n * h * static_cast<int64_t>(w) * c;
    for (int i = 0; i < kh; ++i) {
      int iy = oy * sh - ph + i;
      if (iy < 0 || iy >= h) {
        std::memset(dst, 0, sizeof(float) * kw * c);
        dst += static_cast<int64_t>(kw) * c;
        continue;
      }
      int ix0 = ox * sw - pw;
      if (sw == 1 && ix0 >= 0 && ix0 + kw <= w) {  // the kW taps are one contiguous run of x
        std::memcpy(dst, img + (static_cast<int64_t>(iy) * w + ix0) * c, sizeof(float) * kw * c);
        dst += static_cast<int64_t>(kw) * c;
        continue;
      }
      for (int j = 0; j < kw; ++j, dst += c) {
        int ix = ix0 + j;
        if (ix < 0 || ix >= w)
          std::memset(dst, 0, sizeof(float) * c);
        else
          std::memcpy(dst, img + (static_cast<int64_t>(iy) * w + ix) * c, sizeof(float) * c);
      }
    }
  }
}

}  // namespace

void set_sgemm(uintptr_t address) { g_sgemm.store(reinterpret_cast<Sgemm>(address)); }
bool has_sgemm() { return g_sgemm.load() != nullptr; }

mx::array conv2d_fused(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                       const std::optional<mx::array>& residual, std::pair<int, int> stride,
                       std::pair<int, int> padding, Act act, Residual mode,
                       mx::StreamOrDevice s) {
  check_float32_cpu(x, "conv2d_fused");
  check_float32_cpu(w, "conv2d_fused");
  if (!has_sgemm()) throw std::runtime_error("candle_nn.conv2d_fused: no sgemm set");
  if (x.ndim() != 4 || w.ndim() != 4 || x.shape(3) != w.shape(3))
    throw std::invalid_argument("candle_nn.conv2d_fused: x (N, H, W, C), w (O, kH, kW, C)");
  if (stride.first < 1 || stride.second < 1 || padding.first < 0 || padding.second < 0)
    throw std::invalid_argument("candle_nn.conv2d_fused: bad stride or padding");
  int oh = (x.shape(1) + 2 * padding.first - w.shape(1)) / stride.first + 1;
  int ow = (x.shape(2) + 2 * padding.second - w.shape(2)) / stride.second + 1;
  if (oh <= 0 || ow <= 0) throw std::invalid_argument("candle_nn.conv2d_fused: empty output");
  mx::Shape out_shape{x.shape(0), oh, ow, w.shape(0)};
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs{mx::contiguous(x, false, stream), mx::contiguous(w, false, stream)};
  push_epilogue_inputs(inputs, "conv2d_fused", bias, residual, mode, w.shape(0), "(O,)", out_shape,
                       stream);
  if (traced({&x, &w, bias ? &*bias : nullptr, residual ? &*residual : nullptr}))
    return bias_act_ops(mx::conv2d(x, w, stride, padding, {1, 1}, 1, stream), bias, residual, act,
                        mode, stream);
  return primitive_output<Conv2dFused>(out_shape, std::move(inputs), stream,
                                       stride, padding, act, mode, bias.has_value());
}

void Conv2dFused::eval_cpu(const std::vector<mx::array>& inputs,
                           std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  auto& out = outputs[0];
  auto [encoder, bias, res] = begin_epilogue_eval(stream(), inputs, out, has_bias_, mode_);
  int h = x.shape(1), wd = x.shape(2), c = x.shape(3);
  int o = w.shape(0), kh = w.shape(1), kw = w.shape(2);
  int oh = out.shape(1), ow = out.shape(2);
  int64_t m = static_cast<int64_t>(out.shape(0)) * oh * ow;
  int64_t k = static_cast<int64_t>(kh) * kw * c;
  bool direct = kh == 1 && kw == 1 && stride_ == std::make_pair(1, 1) &&
                padding_ == std::make_pair(0, 0);
  encoder.dispatch([xp = x.data<float>(), wp = w.data<float>(), bias, res,
                    op = out.data<float>(), m, k, h, wd, c, o, kh, kw, oh, ow, direct,
                    stride = stride_, padding = padding_, act = act_, mode = mode_]() {
    if (m == 0 || o == 0) return;
    // The im2col buffer is kept per stream thread and reused (no page faults per call).
    thread_local std::vector<float> scratch;
    const float* a = xp;
    if (!direct) {
      if (scratch.size() < static_cast<size_t>(m * k)) {
        scratch = std::vector<float>();
        scratch.resize(m * k);
      }
      float* col = scratch.data();
      int64_t min_rows = std::max<int64_t>(1, kMinChunk / std::max<int64_t>(k, 1));
      parallel_for(m, min_rows, 1, [&](int64_t b, int64_t e) {
        im2col_rows(xp, col, b, e, h, wd, c, oh, ow, kh, kw, stride.first, stride.second,
                    padding.first, padding.second);
      });
      a = col;
    }
    g_sgemm.load()(101, 111, 112, static_cast<int>(m), o, static_cast<int>(k), 1.0f, a,
                   static_cast<int>(k), wp, static_cast<int>(k), 0.0f, op, o);
    if (bias == nullptr && mode == Residual::None && act == Act::Identity) return;
    int64_t n = m * o;
    parallel_for(n, kMinChunk, o, [&](int64_t b, int64_t e) {
      bias_act_range(op, bias, res, op, b, e, o, act, mode);
    });
  });
}

void Conv2dFused::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.conv2d_fused: a CPU-only kernel (run on the CPU device)");
}

bool Conv2dFused::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const Conv2dFused*>(&other);
  return p && p->stride_ == stride_ && p->padding_ == padding_ && p->act_ == act_ &&
         p->mode_ == mode_ && p->has_bias_ == has_bias_;
}

}  // namespace candle_nn

// -- the packed GEMM's epilogue (kernels.h: bias_act_tile) ----------------------------------------
namespace candle_nn {

void bias_act_tile(float* c, int64_t ldc, const float* bias, const float* residual, int64_t m0,
                   int64_t m1, int64_t n0, int64_t n1, Act act, Residual mode) {
  const int64_t cols = n1 - n0;
  if (n0 == 0 && n1 == ldc) {  // whole rows: one contiguous range
    bias_act_range(c, bias, residual, c, m0 * ldc, m1 * ldc, ldc, act, mode);
    return;
  }
  for (int64_t m = m0; m < m1; ++m) {
    float* row = c + m * ldc + n0;
    bias_act_range(row, bias ? bias + n0 : nullptr, residual ? residual + m * ldc + n0 : nullptr,
                   row, 0, cols, cols, act, mode);
  }
}

}  // namespace candle_nn
