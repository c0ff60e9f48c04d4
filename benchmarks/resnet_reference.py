"""torchvision's ResNet in PyTorch, for ``candle-nn-bench``'s peers where torchvision cannot be
imported.

PyPI's Linux torchvision is built against CUDA torch and cannot load next to the CPU torch wheel
of the ``test`` extra (benchmarks/mobile_sam_reference.py says more), so the training rows'
PyTorch side would be unavailable in the test venv. :func:`resnet` builds the same network as
``torchvision.models.resnet18/34/50/101/152(weights=None)`` (v1.5: the stride on the 3x3 conv of
a bottleneck; the same layers, shapes and default init), layer for layer. Imports neither
candle_nn nor MLX (a PyTorch worker must not load candle_nn's BLAS).
"""

from __future__ import annotations

from typing import Any

LAYERS = {"resnet18": ("basic", (2, 2, 2, 2)), "resnet34": ("basic", (3, 4, 6, 3)),
          "resnet50": ("bottleneck", (3, 4, 6, 3)), "resnet101": ("bottleneck", (3, 4, 23, 3)),
          "resnet152": ("bottleneck", (3, 8, 36, 3))}


def resnet(variant: str, num_classes: int = 1000) -> Any:
    """``torchvision.models.<variant>(weights=None, num_classes=num_classes)``'s network."""
    from torch import nn

    block, counts = LAYERS[variant]
    expansion = 4 if block == "bottleneck" else 1

    def conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> list:
        return [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]

    class Block(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * expansion
            if block == "bottleneck":
                layers = [*conv_bn(cin, width, 1), nn.ReLU(inplace=True),
                          *conv_bn(width, width, 3, stride), nn.ReLU(inplace=True),
                          *conv_bn(width, cout, 1)]
            else:
                layers = [*conv_bn(cin, width, 3, stride), nn.ReLU(inplace=True),
                          *conv_bn(width, cout, 3)]
            self.body = nn.Sequential(*layers)
            self.downsample = (nn.Sequential(*conv_bn(cin, cout, 1, stride))
                               if stride != 1 or cin != cout else nn.Identity())
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x: Any) -> Any:
            return self.relu(self.body(x) + self.downsample(x))

    stages, cin = [], 64
    for i, n in enumerate(counts):
        width = 64 * 2 ** i
        blocks = []
        for j in range(n):
            blocks.append(Block(cin, width, 2 if i > 0 and j == 0 else 1))
            cin = width * expansion
        stages.append(nn.Sequential(*blocks))
    net = nn.Sequential(*conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
                        *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))
    for m in net.modules():  # torchvision's init
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return net
