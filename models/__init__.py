"""Model definitions built on candle_nn (ResNet, YOLOv8, MobileSAM/SAM), installed as
``candle_nn_models``.

Deliberately imports nothing: ``candle_nn_models.scripts.launch`` (the CLIs' console entry points)
must install its Ctrl-C handling before candle_nn, NumPy and MLX load. Each model module imports
candle_nn (which preloads the fast CPU BLAS) before MLX itself.
"""
