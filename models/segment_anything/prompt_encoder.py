"""SAM's prompt encoder (``prompt_encoder.*``): points, boxes and masks → prompt embeddings.

Coordinates are in the model's input frame (pixels of the resized, padded 1024x1024 image).
Sparse embeddings are ``(B, tokens, 256)``; dense embeddings and the positional encoding of the
image grid are NHWC ``(B, 64, 64, 256)``.
"""

from __future__ import annotations

import math
import weakref

import candle_nn as cn
from candle_nn import Conv2d, Conv2dConfig, Embedding, LayerNorm2d, Module, VarBuilder
import mlx.core as mx


NUM_POINT_EMBEDDINGS = 4  # negative point, positive point, box top-left, box bottom-right


class PositionEmbeddingRandom(Module):
    """Random-Fourier positional encoding (``pe_layer``).

    ``positional_encoding_gaussian_matrix`` ``(2, F)`` maps a point ``p`` in ``[0, 1]²`` to
    ``[sin(2π (2p - 1) G), cos(2π (2p - 1) G)]``, ``2F`` features.
    """

    def __init__(self, positional_encoding_gaussian_matrix: mx.array, *, device: cn.Device) -> None:
        super().__init__(device)
        self.positional_encoding_gaussian_matrix = positional_encoding_gaussian_matrix
        # (height, width) -> (weak reference to the matrix it was computed from, encoding): the
        # grid's encoding is a function of the matrix alone; outside the parameter tree.
        object.__setattr__(self, "_grids", {})

    @classmethod
    def load(cls, vb: VarBuilder, num_pos_feats: int) -> "PositionEmbeddingRandom":
        """``positional_encoding_gaussian_matrix`` ``(2, num_pos_feats)``."""
        matrix = vb.get((2, num_pos_feats), "positional_encoding_gaussian_matrix",
                        cn.Init.normal(0.0, 1.0))
        return cls(matrix, device=vb.device)

    def encode(self, coords: mx.array) -> mx.array:
        """``(..., 2)`` normalised (x, y) in ``[0, 1]`` → ``(..., 2F)``."""
        coords = (2.0 * coords - 1.0) @ self.positional_encoding_gaussian_matrix
        coords = (2.0 * math.pi) * coords
        return mx.concatenate([mx.sin(coords), mx.cos(coords)], axis=-1)

    def forward(self, height: int, width: int) -> mx.array:
        """Encoding of the centres of a ``height x width`` grid: ``(height, width, 2F)``,
        computed once per grid size and matrix array (a new matrix — loaded, trained, or a
        tracer under ``mx.grad`` — is a new array, so the gradient still flows to it; a matrix
        changed in place by ``matrix[...] = v`` is not noticed)."""
        g = self.positional_encoding_gaussian_matrix
        hit = self._grids.get((height, width))
        if hit is not None and hit[0]() is g:
            return hit[1]
        grid = self._grid(height, width)
        self._grids[(height, width)] = (weakref.ref(g), grid)
        return grid

    def _grid(self, height: int, width: int) -> mx.array:
        """:meth:`forward`, computed.

        The grid is separable: the angle at pixel ``(y, x)`` is ``a_x + b_y`` with
        ``a_x = 2π (2x' - 1) G[0]`` and ``b_y = 2π (2y' - 1) G[1]``, so sin and cos are taken of
        the ``(height + width) F`` row and column angles only and combined by the angle-sum
        identities (``height * width * F`` of each before: on MLX's CPU a scalar call per
        element, a third of the MobileSAM decoder's time).
        """
        g = self.positional_encoding_gaussian_matrix
        x = 2.0 * ((mx.arange(width, dtype=mx.float32) + 0.5) / width) - 1.0
        y = 2.0 * ((mx.arange(height, dtype=mx.float32) + 0.5) / height) - 1.0
        a = (2.0 * math.pi) * (x[:, None] * g[0])[None]  # (1, width, F)
        b = (2.0 * math.pi) * (y[:, None] * g[1])[:, None]  # (height, 1, F)
        sin_a, cos_a, sin_b, cos_b = mx.sin(a), mx.cos(a), mx.sin(b), mx.cos(b)
        return mx.concatenate([sin_a * cos_b + cos_a * sin_b, cos_a * cos_b - sin_a * sin_b],
                              axis=-1)

    def forward_with_coords(self, coords: mx.array, image_size: tuple[int, int]) -> mx.array:
        """Pixel ``(x, y)`` ``(..., 2)`` in an image of ``image_size`` (h, w) → ``(..., 2F)``."""
        h, w = image_size
        return self.encode(coords / mx.array([w, h], dtype=coords.dtype))


class PromptEncoder(Module):
    """Embeds point, box and mask prompts for the mask decoder.

    Args:
        pe_layer: the random-Fourier encoding of ``embed_dim / 2`` frequencies.
        point_embeddings: the four ``(1, embed_dim)`` embeddings added to negative points,
            positive points, box top-left and bottom-right corners.
        not_a_point_embed, no_mask_embed: ``(1, embed_dim)`` each.
        mask_downscaling: conv 2x2/2, LayerNorm2d, conv 2x2/2, LayerNorm2d, conv 1x1 (GELU after
            each norm): ``(B, 256, 256, 1)`` → ``(B, 64, 64, embed_dim)``.
        image_embedding_size: ``(64, 64)``, the encoder's output grid.
        input_image_size: ``(1024, 1024)``, the frame the coordinates are given in.

    :meth:`load` builds SAM's: ``embed_dim`` 256, mask downscaler width ``mask_in_chans`` 16.
    """

    def __init__(self, pe_layer: PositionEmbeddingRandom, point_embeddings: list[Embedding],
                 not_a_point_embed: Embedding, no_mask_embed: Embedding,
                 mask_downscaling: tuple[Conv2d, LayerNorm2d, Conv2d, LayerNorm2d, Conv2d],
                 image_embedding_size: tuple[int, int],
                 input_image_size: tuple[int, int]) -> None:
        super().__init__(pe_layer.device)
        self.embed_dim = int(no_mask_embed.embeddings.shape[-1])
        self.image_embedding_size = tuple(image_embedding_size)
        self.input_image_size = tuple(input_image_size)
        self.pe_layer = pe_layer
        self.point_embeddings = point_embeddings
        self.not_a_point_embed = not_a_point_embed
        self.no_mask_embed = no_mask_embed
        (self.mask_downscaling_conv1, self.mask_downscaling_ln1, self.mask_downscaling_conv2,
         self.mask_downscaling_ln2, self.mask_downscaling_conv3) = mask_downscaling

    @classmethod
    def load(cls, vb: VarBuilder, embed_dim: int = 256,
             image_embedding_size: tuple[int, int] = (64, 64),
             input_image_size: tuple[int, int] = (1024, 1024),
             mask_in_chans: int = 16) -> "PromptEncoder":
        stride2, down = Conv2dConfig(stride=2), vb.pp("mask_downscaling")
        points = vb.pp("point_embeddings")
        encoder = cls(PositionEmbeddingRandom.load(vb.pp("pe_layer"), embed_dim // 2),
                   [Embedding.load(points.pp(i), 1, embed_dim)
                    for i in range(NUM_POINT_EMBEDDINGS)],
                   Embedding.load(vb.pp("not_a_point_embed"), 1, embed_dim),
                   Embedding.load(vb.pp("no_mask_embed"), 1, embed_dim),
                   (Conv2d.load(down.pp(0), 1, mask_in_chans // 4, 2, stride2),
                    LayerNorm2d.load(down.pp(1), mask_in_chans // 4),
                    Conv2d.load(down.pp(3), mask_in_chans // 4, mask_in_chans, 2, stride2),
                    LayerNorm2d.load(down.pp(4), mask_in_chans),
                    Conv2d.load(down.pp(6), mask_in_chans, embed_dim, 1)),
                   image_embedding_size, input_image_size)
        vb.check_all_read(f"the SAM prompt encoder ({embed_dim} wide)")
        return encoder

    def get_dense_pe(self) -> mx.array:
        """Positional encoding of the image embedding grid, NHWC ``(1, 64, 64, embed_dim)``."""
        with self.on_device():
            return self.pe_layer(*self.image_embedding_size)[None]

    def embed_points(self, points: mx.array, labels: mx.array, pad: bool) -> mx.array:
        """``(B, N, 2)`` pixel (x, y) and ``(B, N)`` labels → ``(B, N (+1 when pad), dim)``.

        Label 1: foreground, 0: background, -1: not a point (padding; its encoding is replaced
        by ``not_a_point_embed``). ``pad`` appends one not-a-point, as SAM does without a box.
        """
        points = points.astype(mx.float32) + 0.5  # shift to the pixel centre
        labels = labels.astype(mx.float32)
        if pad:
            b = points.shape[0]
            points = mx.concatenate([points, mx.zeros((b, 1, 2), dtype=points.dtype)], axis=1)
            labels = mx.concatenate([labels, -mx.ones((b, 1), dtype=labels.dtype)], axis=1)
        emb = self.pe_layer.forward_with_coords(points, self.input_image_size)
        labels = labels[..., None]
        emb = mx.where(labels < 0, self.not_a_point_embed.embeddings, emb)
        emb = emb + mx.where(labels == 0, self.point_embeddings[0].embeddings, 0.0)
        return emb + mx.where(labels == 1, self.point_embeddings[1].embeddings, 0.0)

    def embed_boxes(self, boxes: mx.array) -> mx.array:
        """``(B, 4)`` pixel boxes ``x1, y1, x2, y2`` → two corner tokens ``(B, 2, dim)``."""
        corners = boxes.astype(mx.float32).reshape(-1, 2, 2) + 0.5
        emb = self.pe_layer.forward_with_coords(corners, self.input_image_size)
        corner_embed = mx.concatenate([self.point_embeddings[2].embeddings,
                                       self.point_embeddings[3].embeddings], axis=0)
        return emb + corner_embed

    def embed_masks(self, masks: mx.array) -> mx.array:
        """Low-res mask logits NHWC ``(B, 256, 256, 1)`` → ``(B, 64, 64, dim)``."""
        x = cn.gelu(self.mask_downscaling_ln1(self.mask_downscaling_conv1(masks)))
        x = cn.gelu(self.mask_downscaling_ln2(self.mask_downscaling_conv2(x)))
        return self.mask_downscaling_conv3(x)

    def forward(self, points: tuple[mx.array, mx.array] | None = None,
                boxes: mx.array | None = None,
                masks: mx.array | None = None) -> tuple[mx.array, mx.array]:
        """Sparse ``(B, tokens, dim)`` and dense NHWC ``(B, 64, 64, dim)`` embeddings.

        ``points``: ``(coords (B, N, 2), labels (B, N))`` in input-frame pixels; ``boxes``:
        ``(B, 4)``; ``masks``: ``(B, 256, 256, 1)`` logits. Any may be ``None``.
        """
        batch = (points[0].shape[0] if points is not None
                 else boxes.shape[0] if boxes is not None
                 else masks.shape[0] if masks is not None else 1)
        sparse = [mx.zeros((batch, 0, self.embed_dim), dtype=mx.float32)]
        if points is not None:
            sparse.append(self.embed_points(points[0], points[1], pad=boxes is None))
        if boxes is not None:
            sparse.append(self.embed_boxes(boxes))
        sparse_embeddings = mx.concatenate(sparse, axis=1)
        if masks is not None:
            dense = self.embed_masks(masks)
        else:
            h, w = self.image_embedding_size
            dense = mx.broadcast_to(self.no_mask_embed.embeddings.reshape(1, 1, 1, -1),
                                    (batch, h, w, self.embed_dim))
        return sparse_embeddings, dense
