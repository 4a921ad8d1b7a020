"""DeepInfer speculative decoding: the MTP and n-gram proposers (see ``docs/spec_decode.md``)."""
