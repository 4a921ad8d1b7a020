"""DeepInfer speculative decoding: the MTP, DSpark and n-gram proposers (see ``docs/spec_decode.md``)."""
