"""Tools around a compiled model: autoregressive decoding (``decode``), figures (``plot``, the
``plot`` extra), Tikhonov training (``train``, the ``torch`` extra) and the ResNet baseline
(``resnet``). See docs/causal.md#generation and docs/baselines.md."""
