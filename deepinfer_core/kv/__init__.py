"""KV cache: cache specs (what a model stores per token / per compressed entry) and the paged pools."""
