"""Model definitions built on candle_nn (ResNet, YOLOv8, MobileSAM/SAM), installed as
``candle_nn_models``.

Deliberately imports nothing: ``candle_nn_models.scripts.launch`` (the CLIs' console entry points)
must install its Ctrl-C handling before candle_nn, NumPy and MLX load. Modules import candle_nn
before mlx, as candle_nn/_startup.py asks.
"""
