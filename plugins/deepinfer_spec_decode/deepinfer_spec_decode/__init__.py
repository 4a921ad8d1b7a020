"""DeepInfer speculative decoding: proposers (MTP, n-gram) and the verifier."""
