"""SAM's mask decoder (``mask_decoder.*``): image embedding + prompt tokens → mask logits and
predicted IoUs.

The image side is NHWC; masks come out NHWC too, one channel per mask:
``(B, 256, 256, M)`` low-resolution logits (4x the embedding grid).
"""

from __future__ import annotations

import candle_nn as cn
from candle_nn import (ConvTranspose2d, ConvTranspose2dConfig, Embedding, LayerNorm2d, Linear,
                       Module, VarBuilder)
import mlx.core as mx

from .transformer import TwoWayTransformer


class MlpHead(Module):
    """``num_layers`` Linear layers (``layers.i``) with ReLU between, optional final sigmoid."""

    def __init__(self, layers: list[Linear], sigmoid_output: bool = False) -> None:
        super().__init__(layers[0].device)
        self.layers = layers
        self.sigmoid_output = sigmoid_output

    @classmethod
    def load(cls, vb: VarBuilder, input_dim: int, hidden_dim: int, output_dim: int,
             num_layers: int, sigmoid_output: bool = False) -> "MlpHead":
        dims = [input_dim] + [hidden_dim] * (num_layers - 1) + [output_dim]
        return cls([Linear.load(vb.pp("layers").pp(i), dims[i], dims[i + 1])
                    for i in range(num_layers)], sigmoid_output)

    def forward(self, x: mx.array) -> mx.array:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = cn.relu(x)
        return cn.sigmoid(x) if self.sigmoid_output else x


class MaskDecoder(Module):
    """Two-way transformer over [IoU token, mask tokens, prompt tokens] and the image, then
    transposed-conv upscaling and per-mask hypernetwork MLPs.

    Args:
        transformer: the two-way transformer.
        iou_token, mask_tokens: ``(1, dim)`` and ``(num_mask_tokens, dim)`` learned tokens.
        output_upscaling: transposed conv (2x), LayerNorm2d, transposed conv (2x): ``dim`` →
            ``dim / 8`` channels at 4x the resolution, GELU after the norm and the last conv.
        output_hypernetworks_mlps: one MLP per mask token, ``dim → dim / 8``.
        iou_prediction_head: MLP ``dim → num_mask_tokens``.

    :meth:`load` builds SAM's: ``transformer_dim`` 256, ``num_multimask_outputs`` 3,
    ``iou_head_depth`` 3, ``iou_head_hidden_dim`` 256.
    """

    def __init__(self, transformer: TwoWayTransformer, iou_token: Embedding,
                 mask_tokens: Embedding,
                 output_upscaling: tuple[ConvTranspose2d, LayerNorm2d, ConvTranspose2d],
                 output_hypernetworks_mlps: list[MlpHead], iou_prediction_head: MlpHead) -> None:
        super().__init__(transformer.device)
        self.num_mask_tokens = len(output_hypernetworks_mlps)
        self.transformer = transformer
        self.iou_token, self.mask_tokens = iou_token, mask_tokens
        (self.output_upscaling_conv1, self.output_upscaling_ln,
         self.output_upscaling_conv2) = output_upscaling
        self.output_hypernetworks_mlps = output_hypernetworks_mlps
        self.iou_prediction_head = iou_prediction_head

    @classmethod
    def load(cls, vb: VarBuilder, transformer_dim: int = 256, num_multimask_outputs: int = 3,
             iou_head_depth: int = 3, iou_head_hidden_dim: int = 256) -> "MaskDecoder":
        d, tokens = transformer_dim, num_multimask_outputs + 1
        up, mlps = ConvTranspose2dConfig(stride=2), vb.pp("output_hypernetworks_mlps")
        decoder = cls(TwoWayTransformer.load(vb.pp("transformer"), depth=2, dim=d, num_heads=8,
                                          mlp_dim=2048),
                   Embedding.load(vb.pp("iou_token"), 1, d),
                   Embedding.load(vb.pp("mask_tokens"), tokens, d),
                   (ConvTranspose2d.load(vb.pp("output_upscaling.0"), d, d // 4, 2, up),
                    LayerNorm2d.load(vb.pp("output_upscaling.1"), d // 4),
                    ConvTranspose2d.load(vb.pp("output_upscaling.3"), d // 4, d // 8, 2, up)),
                   [MlpHead.load(mlps.pp(i), d, d, d // 8, 3) for i in range(tokens)],
                   MlpHead.load(vb.pp("iou_prediction_head"), d, iou_head_hidden_dim, tokens,
                                iou_head_depth))
        vb.check_all_read(f"the SAM mask decoder ({num_multimask_outputs} masks)")
        return decoder

    def forward(self, image_embeddings: mx.array, image_pe: mx.array,
                sparse_prompt_embeddings: mx.array, dense_prompt_embeddings: mx.array,
                multimask_output: bool) -> tuple[mx.array, mx.array]:
        """Mask logits ``(B, 256, 256, M)`` and IoU predictions ``(B, M)``.

        ``image_embeddings`` / ``image_pe`` NHWC ``(1, 64, 64, 256)``; ``sparse`` ``(B, T, 256)``;
        ``dense`` ``(B, 64, 64, 256)``. ``M`` is 3 with ``multimask_output`` (SAM's three
        ambiguity-aware masks), else 1 (the single-mask output).
        """
        masks, iou_pred = self.predict_masks(image_embeddings, image_pe,
                                             sparse_prompt_embeddings, dense_prompt_embeddings)
        if multimask_output:
            return masks[..., 1:], iou_pred[:, 1:]
        return masks[..., :1], iou_pred[:, :1]

    def predict_masks(self, image_embeddings: mx.array, image_pe: mx.array,
                      sparse_prompt_embeddings: mx.array,
                      dense_prompt_embeddings: mx.array) -> tuple[mx.array, mx.array]:
        """All ``num_mask_tokens`` masks ``(B, 256, 256, 4)`` and IoUs ``(B, 4)``."""
        b = sparse_prompt_embeddings.shape[0]
        output_tokens = mx.concatenate([self.iou_token.embeddings, self.mask_tokens.embeddings])
        output_tokens = mx.broadcast_to(output_tokens[None], (b,) + output_tokens.shape)
        sparse = sparse_prompt_embeddings.astype(output_tokens.dtype)
        tokens = mx.concatenate([output_tokens, sparse], axis=1)

        # Per-image tensors go with every prompt of the batch (SAM's repeat_interleave): one
        # image's are broadcast, not copied B times (automatic masks decode 64 prompts a batch).
        if image_embeddings.shape[0] == 1:
            src = mx.broadcast_to(image_embeddings + dense_prompt_embeddings,
                                  (b,) + image_embeddings.shape[1:])
        else:
            src = mx.repeat(image_embeddings, b, axis=0) + dense_prompt_embeddings
        pos_src = image_pe if image_pe.shape[0] == 1 else mx.repeat(image_pe, b, axis=0)
        _, h, w, c = src.shape

        hs, src = self.transformer(src, pos_src, tokens)
        iou_token_out = hs[:, 0]
        mask_tokens_out = hs[:, 1:1 + self.num_mask_tokens]

        up = self.upscale(src.reshape(-1, h, w, c))  # (B, h w 16, c/8), block layout
        hyper_in = mx.stack([mlp(mask_tokens_out[:, i])
                             for i, mlp in enumerate(self.output_hypernetworks_mlps)], axis=1)
        # Per prompt a Linear of M outputs over its 16 h w upscaled pixels (cn.ops.linear).
        masks = mx.stack([cn.ops.linear(up[i if up.shape[0] > 1 else 0], hyper_in[i])
                          for i in range(hyper_in.shape[0])])  # (B, h w 16, M)
        return self.blocks_to_image(masks, (h, w)), self.iou_prediction_head(iou_token_out)

    def upscale(self, src: mx.array) -> mx.array:
        """The output upscaling of the image tokens ``src (B, h, w, c)``: transposed conv 2x2/2,
        LayerNorm2d, GELU, transposed conv 2x2/2, GELU → ``(B, h w 16, c/8)``.

        The rows stay in the convolutions' block layout — per embedding pixel its 2x2, then per
        one of those its 2x2 output pixels — so the wide intermediates are never transposed;
        :meth:`blocks_to_image` puts a product of them (the masks) in image order."""
        b, h, w, _ = src.shape
        conv1, conv2 = self.output_upscaling_conv1, self.output_upscaling_conv2
        x = conv1.blocks(src)  # (B, h, w, 2 2 c/4)
        x = cn.gelu(self.output_upscaling_ln(x.reshape(b, h, -1, conv1.weight.shape[0])))
        x = conv2.blocks(x, activation="gelu")  # (B, h, w 2 2, 2 2 c/8)
        return x.reshape(b, -1, conv2.weight.shape[0])

    def blocks_to_image(self, x: mx.array, grid: tuple[int, int]) -> mx.array:
        """Rows in :meth:`upscale`'s block layout ``(B, h w 16, ...)`` (embedding grid ``(h,
        w)``) → image order ``(B, 4h, 4w, ...)``."""
        (h, w), rest = grid, x.shape[2:]
        (ah, aw), (ch, cw) = (self.output_upscaling_conv1.weight.shape[1:3],
                              self.output_upscaling_conv2.weight.shape[1:3])
        # (B, y, x, a, b, c, d) → rows (y ah + a) ch + c, columns (x aw + b) cw + d
        x = x.reshape(-1, h, w, ah, aw, ch, cw, *rest)
        x = x.transpose(0, 1, 3, 5, 2, 4, 6, *range(7, 7 + len(rest)))
        return x.reshape(-1, h * ah * ch, w * aw * cw, *rest)
