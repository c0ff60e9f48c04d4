"""A differentiable groups-1 conv for training on the CPU: candle_nn's conv kernels forward
and backward, in an ``mx.custom_function`` whose VJP replaces MLX's convolution VJP.

MLX limitation: the CPU conv VJP runs the weight gradient (and the input gradient of a strided
conv) as naive loops, 3-5x the forward's time for a 3x3 layer, and MLX's CPU conv forward is
im2col + sgemm with single-threaded copies. Here, for ``y = conv2d(x, w, stride, padding)`` with
``x`` ``(N, H, W, C)``, ``w`` ``(O, kH, kW, C)``, ``dy`` ``(N, H', W', O)``:

- forward: the packed GEMM (packed_gemm.py), the weight packed by MLX ops inside the graph (it
  is a tracer). Not Winograd: its float32 error (~1e-5 of the output's max, winograd.py) comes
  back amplified through train-mode BatchNorm's gradient (ResNet-18's fixture: 1.1e-3 relative
  L2 in the last conv's weight gradient against a 1.2e-4 tolerance);
- input gradient: the conv of ``dy`` (zeros between its rows and columns for a stride > 1,
  padded by ``k - 1 - padding``) with the flipped, transposed weight ``(C, kH, kW, O)``, the
  math of MLX's own VJP, through the same kernels;
- weight gradient: ``dw = (im2col(x)^T @ dy)^T``, ``(kH kW C, N H' W') @ (N H' W', O)``: one
  sgemm (OpenBLAS, multithreaded).

Non-finite values: a NaN or infinity in ``x`` or ``dy`` reaches the same gradient entries as
through MLX's VJP. A non-finite *weight* differs near the borders (and, for a stride > 1,
between strided positions): the input gradient multiplies it by ``dy``'s zero padding, giving
NaN where MLX's VJP skips those products. In a training step that weight has already made the
forward output, the loss and so every cotangent non-finite.

The kernels are MLX primitives without a VJP of their own; they refuse tracer inputs unless
asked (``traced_ok``), which is safe here because this module's VJP is the one MLX uses. Without
the kernels (or AVX2) MLX's conv runs in their place, with the same VJP.

It runs only under a transformation: the dispatcher sends concrete (inference) calls to the
kernels registered before it, and tracer calls skip those (``grad="reference"``) and reach this
one (``grad="own"``; it works under ``mx.compile`` too). 1x1 convs too: the reference's matmul
would get MLX's matmul VJP, whose weight gradient ``dy^T @ x`` OpenBLAS runs 3-25x slower than
``(x^T @ dy)^T`` on these shapes. ``candle_nn.ops.disable("conv_grad")`` turns it off (MLX's
conv and conv VJP then run).
"""

from __future__ import annotations

import mlx.core as mx

from ...device import Device
from ...ops.activation import bias_act
from ...ops.conv import dilate
from ...ops.registry import register
from . import kernels, packed_gemm
from .conv_common import conv_applies


def applies(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
            activation=None, residual=None, residual_after_activation=False) -> bool:
    """A groups-1, dilation-1 float32 CPU conv with ``padding <= kernel - 1`` (the input
    gradient's padding is not negative)."""
    if not conv_applies(x, weight, bias, stride, padding, dilation, groups):
        return False
    _, kh, kw, _ = weight.shape
    return padding[0] <= kh - 1 and padding[1] <= kw - 1


def im2col(x: mx.array, kernel: tuple[int, int], stride: tuple[int, int],
           padding: tuple[int, int]) -> mx.array:
    """``(N, H, W, C)`` -> the patches ``(N H' W', kH kW C)`` of a conv with zero padding."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    if ph or pw:
        x = mx.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)])
    n, h, w, c = x.shape
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    if (kh, kw, sh, sw) == (1, 1, 1, 1):
        return x.reshape(n * oh * ow, c)
    patches = mx.as_strided(x, (n, oh, ow, kh, kw, c),
                            (h * w * c, sh * w * c, sw * c, w * c, c, 1))
    return patches.reshape(n * oh * ow, kh * kw * c)


def _packed_traced() -> bool:
    """The packed GEMM runs here and its build takes ``traced_ok`` (a build older than the
    sources lacks it until ``pip install -e .`` rebuilds it)."""
    return packed_gemm.available() and "traced_ok" in (kernels.module().conv2d_packed.__doc__
                                                       or "")


def fast_conv(x: mx.array, w: mx.array, stride: tuple[int, int],
              padding: tuple[int, int]) -> mx.array:
    """``conv2d(x, w, stride, padding)`` (groups 1, no epilogue) by the CPU kernels, tracers
    allowed: the caller must supply the VJP. MLX's conv where the kernels cannot run."""
    m = kernels.module()
    if m is None or x.dtype != mx.float32 or w.dtype != mx.float32:
        return mx.conv2d(x, w, stride=stride, padding=padding)
    kernels.sync_threads()
    if _packed_traced():
        o, kh, kw, _ = w.shape
        wp = m.pack_gemm_weight(w.reshape(o, -1))
        return m.conv2d_packed(x, wp, None, None, (kh, kw), o, stride, padding, m.Act.identity,
                               m.Residual.none, traced_ok=True)
    return mx.conv2d(x, w, stride=stride, padding=padding)


def input_grad(dy: mx.array, weight: mx.array, x_shape: tuple[int, ...],
               stride: tuple[int, int], padding: tuple[int, int]) -> mx.array:
    """The gradient of ``conv2d(x, weight, stride, padding)`` with respect to ``x``
    ``(N, H, W, C)``, given ``dy`` ``(N, H', W', O)``."""
    _, kh, kw, _ = weight.shape
    (_, h, w, _), (sh, sw), (ph, pw) = x_shape, stride, padding
    # Rows / columns of x past the last window get no gradient: pad dy's far side for them.
    rh, rw = (h + 2 * ph - kh) % sh, (w + 2 * pw - kw) % sw
    lo_h, lo_w = kh - 1 - ph, kw - 1 - pw
    d = mx.pad(dilate(dy, stride), [(0, 0), (lo_h, lo_h + rh), (lo_w, lo_w + rw), (0, 0)])
    w_t = weight[:, ::-1, ::-1, :].transpose(3, 1, 2, 0)  # (C, kH, kW, O)
    if (kh, kw) == (1, 1):
        n, dh, dw, o = d.shape
        return (d.reshape(-1, o) @ w_t.reshape(-1, o).T).reshape(n, dh, dw, -1)
    return fast_conv(d, w_t, (1, 1), (0, 0))


def weight_grad(dy: mx.array, x: mx.array, kernel: tuple[int, int], stride: tuple[int, int],
                padding: tuple[int, int]) -> mx.array:
    """The gradient of ``conv2d(x, w, stride, padding)`` with respect to ``w``
    ``(O, kH, kW, C)``: ``(im2col(x)^T @ dy)^T``, one sgemm."""
    o = dy.shape[-1]
    cols = im2col(x, kernel, stride, padding)
    # (K, M) @ (M, O), not (O, M) @ (M, K): OpenBLAS runs the latter (few output rows, long
    # transposed inner dimension) 3-25x slower on this shape.
    return (cols.T @ dy.reshape(-1, o)).T.reshape(o, *kernel, x.shape[-1])


def _conv(stride: tuple[int, int], padding: tuple[int, int]):
    """``f(x, w)``: :func:`fast_conv` with this module's VJP."""
    def forward(x, w):
        return fast_conv(x, w, stride, padding)

    f = mx.custom_function(forward)

    @f.vjp
    def _vjp(primals, cotangent, output):
        x, w = primals
        # On the CPU stream, whatever the caller's default: a loss taken outside a CPU model on
        # a machine with a GPU starts the backward on the GPU's stream, where these CPU kernels
        # cannot run.
        with mx.stream(Device.cpu().stream):
            return (input_grad(cotangent, w, x.shape, stride, padding),
                    weight_grad(cotangent, x, tuple(w.shape[1:3]), stride, padding))

    return f


_CONVS: dict[tuple, object] = {}


@register("conv2d", "conv_grad", "cpu", applies=applies, grad="own",
          works_around="the CPU conv VJP (weight gradient, strided input gradient) runs naive "
                       "loops")
def conv2d(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
           activation=None, residual=None, residual_after_activation=False):
    """``act(conv2d(x, weight) + bias [+ residual])``, differentiable with this module's VJP."""
    key = (tuple(stride), tuple(padding))
    if key not in _CONVS:
        _CONVS[key] = _conv(*key)
    y = _CONVS[key](x, weight)
    return bias_act(y, bias, activation, residual, residual_after_activation)
