"""The ``ascend950`` op objects, one per concern. Each op takes its fused torch_npu path where the
operator's documented constraints hold and its switch is on (see :mod:`deepinfer_ascend950._npu`),
and plain torch on the NPU otherwise."""
