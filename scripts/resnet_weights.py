"""A ResNet weights file as ``candle-resnet train`` opens it: the library's
:func:`~candle_nn_models.resnet.classifier.open_resnet_weights`, which ``resnet.load`` uses."""

from candle_nn_models.resnet.classifier import open_resnet_weights

__all__ = ["open_resnet_weights"]
