// Convs (groups 1, dilation 1) and Linear layers on the packed-weight GEMM of gemm.h: the MLX
// primitive Conv2dPacked and the weight packing. See kernels.h for the contracts.
#include <cstdlib>
#include <stdexcept>

#include "gemm.h"
#include "cpu_eval.h"
#include "kernels.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/transforms.h"

namespace candle_nn {

namespace {

void check_f32(const mx::array& a, const char* what) {
  if (a.dtype() != mx::float32)
    throw std::invalid_argument(std::string("candle_nn.conv2d_packed: ") + what +
                                " must be float32");
}

struct EpilogueArgs {
  const float* bias;
  const float* residual;
  Act act;
  Residual mode;
};

void epilogue_tile(const void* ctx, float* c, int64_t ldc, int64_t m0, int64_t m1, int64_t n0,
                   int64_t n1) {
  const auto* e = static_cast<const EpilogueArgs*>(ctx);
  bias_act_tile(c, ldc, e->bias, e->residual, m0, m1, n0, n1, e->act, e->mode);
}

// The (O, kH, kW, C) weight back from its packed form, with MLX ops (for traced calls).
mx::array unpack_ops(const mx::array& packed, int o, int kh, int kw, int c, mx::Stream s) {
  int k = kh * kw * c;
  int panels = static_cast<int>(packed.size() / (gemm::kPanel * k));
  auto w = mx::reshape(packed, {panels, k, static_cast<int>(gemm::kPanel)}, s);
  w = mx::reshape(mx::transpose(w, {0, 2, 1}, s), {panels * static_cast<int>(gemm::kPanel), k},
                  s);
  w = mx::slice(w, {0, 0}, {o, k}, s);
  return mx::reshape(w, {o, kh, kw, c}, s);
}

}  // namespace

bool packed_gemm_available() { return gemm::available(); }

const char* packed_gemm_isa() { return gemm::isa(); }

bool set_packed_gemm_isa(const std::string& name) { return gemm::set_isa(name.c_str()); }

mx::array pack_gemm_weight(const mx::array& w) {
  check_f32(w, "the weight");
  if (w.ndim() != 2) throw std::invalid_argument("candle_nn.pack_gemm_weight: w must be (N, K)");
  if (w.is_tracer()) {  // under mx.grad / mx.vmap: the same layout from MLX ops, differentiable
    auto s = mx::default_stream(mx::Device::cpu);
    int n = w.shape(0), k = w.shape(1), p = static_cast<int>(gemm::kPanel);
    int np = (n + p - 1) / p * p;
    auto wp = np == n ? w : mx::pad(w, {{0, np - n}, {0, 0}}, mx::array(0.0f), "constant", s);
    wp = mx::transpose(mx::reshape(wp, {np / p, p, k}, s), {0, 2, 1}, s);
    return mx::reshape(wp, {np * k}, s);
  }
  // A transposed view of a row-major (k, n) array (such as v.T for P @ v) is packed in place.
  mx::array wc = w;
  mx::eval(wc);
  int64_t n = w.shape(0), k = w.shape(1);
  bool transposed = !wc.flags().row_contiguous && wc.flags().col_contiguous &&
                    wc.data_size() == wc.size();
  if (!transposed && !wc.flags().row_contiguous) {
    wc = mx::contiguous(w, false, mx::Device::cpu);
    mx::eval(wc);
  }
  int64_t size = gemm::packed_size(n, k);
  void* buf = std::aligned_alloc(64, ((size * sizeof(float)) + 63) / 64 * 64 + 64);
  if (buf == nullptr) throw std::bad_alloc();
  if (transposed)
    gemm::pack_b(wc.data<float>(), 1, n, k, static_cast<float*>(buf), n);
  else
    gemm::pack_b(wc.data<float>(), k, n, k, static_cast<float*>(buf));
  return mx::array(buf, mx::Shape{static_cast<int>(size)}, mx::float32, [](void* p) { std::free(p); });
}

mx::array conv2d_packed(const mx::array& x, const mx::array& w_packed,
                        const std::optional<mx::array>& bias,
                        const std::optional<mx::array>& residual, std::pair<int, int> kernel,
                        int out_channels, std::pair<int, int> stride, std::pair<int, int> padding,
                        Act act, Residual mode, bool traced_ok, mx::StreamOrDevice s) {
  check_f32(x, "x");
  check_f32(w_packed, "the packed weight");
  if (!gemm::available())
    throw std::runtime_error("candle_nn.conv2d_packed: this CPU has no AVX-512F nor AVX2 + FMA");
  if (x.ndim() != 4) throw std::invalid_argument("candle_nn.conv2d_packed: x must be (N, H, W, C)");
  auto [kh, kw] = kernel;
  int c = x.shape(3);
  int64_t k = static_cast<int64_t>(kh) * kw * c;
  if (kh < 1 || kw < 1 || out_channels < 1 || w_packed.ndim() != 1 ||
      static_cast<int64_t>(w_packed.size()) != gemm::packed_size(out_channels, k))
    throw std::invalid_argument(
        "candle_nn.conv2d_packed: w_packed must be pack_gemm_weight of (O, kH * kW * C)");
  if (stride.first < 1 || stride.second < 1 || padding.first < 0 || padding.second < 0)
    throw std::invalid_argument("candle_nn.conv2d_packed: bad stride or padding");
  int oh = (x.shape(1) + 2 * padding.first - kh) / stride.first + 1;
  int ow = (x.shape(2) + 2 * padding.second - kw) / stride.second + 1;
  if (oh <= 0 || ow <= 0) throw std::invalid_argument("candle_nn.conv2d_packed: empty output");
  mx::Shape out_shape{x.shape(0), oh, ow, out_channels};
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs{mx::contiguous(x, false, stream), w_packed};
  push_epilogue_inputs(inputs, "conv2d_packed", bias, residual, mode, out_channels, "(O,)",
                       out_shape, stream);
  if (!traced_ok &&
      traced({&x, &w_packed, bias ? &*bias : nullptr, residual ? &*residual : nullptr})) {
    auto w = unpack_ops(w_packed, out_channels, kh, kw, c, stream);
    return bias_act(mx::conv2d(x, w, stride, padding, {1, 1}, 1, stream), bias, residual, act,
                    mode, stream);
  }
  return primitive_output<Conv2dPacked>(out_shape, std::move(inputs), stream,
                                        kernel, stride, padding, act, mode, bias.has_value());
}

void Conv2dPacked::eval_cpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  const auto& wp = inputs[1];
  auto& out = outputs[0];
  auto [encoder, bias, res] = begin_epilogue_eval(stream(), inputs, out, has_bias_, mode_);
  gemm::ASource a;
  a.data = x.data<float>();
  a.n = x.shape(0), a.h = x.shape(1), a.w = x.shape(2), a.c = x.shape(3);
  a.kh = kernel_.first, a.kw = kernel_.second, a.sh = stride_.first, a.sw = stride_.second;
  a.ph = padding_.first, a.pw = padding_.second, a.oh = out.shape(1), a.ow = out.shape(2);
  int64_t k = static_cast<int64_t>(a.kh) * a.kw * a.c;
  a.im2col = !(a.kh == 1 && a.kw == 1 && a.sh == 1 && a.sw == 1 && a.ph == 0 && a.pw == 0);
  a.lda = k;
  int64_t m = static_cast<int64_t>(a.n) * a.oh * a.ow, n = out.shape(3);
  bool epilogue = bias != nullptr || mode_ != Residual::None || act_ != Act::Identity;
  encoder.dispatch([a, wp = wp.data<float>(), o = out.data<float>(), m, n, k, epilogue,
                    args = EpilogueArgs{bias, res, act_, mode_}]() {
    gemm::Epilogue ep;
    if (epilogue) ep = {&epilogue_tile, &args};
    gemm::gemm(a, wp, o, n, m, n, k, ep);
  });
}

void Conv2dPacked::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("candle_nn.conv2d_packed: a CPU-only kernel (run on the CPU device)");
}

bool Conv2dPacked::is_equivalent(const mx::Primitive& other) const {
  auto* p = dynamic_cast<const Conv2dPacked*>(&other);
  return p && p->kernel_ == kernel_ && p->stride_ == stride_ && p->padding_ == padding_ &&
         p->act_ == act_ && p->mode_ == mode_ && p->has_bias_ == has_bias_;
}

}  // namespace candle_nn
