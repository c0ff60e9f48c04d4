"""ResNet-18/34/50/101/152: the network (:mod:`candle_nn_models.resnet_network`) and its task
API, as ``candle-resnet`` runs it::

    from candle_nn_models import resnet
    model = resnet.load("resnet18.safetensors", device="cpu")  # no path: candle's resnet18
    results = model.predict(["bike.jpg", rgb_uint8], top_k=5)  # one Classification per image
    r = results[0]
    r.probs, r.top_k, r.path, r.orig_shape
    r.to_json()  # the record `candle-resnet --json` prints

``candle-resnet`` is a client of this API: its options are :class:`PredictOptions`' fields.
"""

from candle_nn_models.resnet_network import (STAGE_WIDTHS, VARIANTS, ResidualBlock, ResNet,
                                             ResNetConfig, class_probabilities, conv_bn,
                                             infer_variant)

from .classifier import Classification, Classifier, load
from .options import PredictOptions

__all__ = ["Classification", "Classifier", "PredictOptions", "ResNet", "ResNetConfig",
           "ResidualBlock", "STAGE_WIDTHS", "VARIANTS", "class_probabilities", "conv_bn",
           "infer_variant", "load"]
