"""Versions of the package and of the plugin API."""

__version__ = "0.1.0"

#: Version of the plugin API (hook specs, op base classes, platform contract).
#: A plugin declares the version it was built for as ``DEEPINFER_PLUGIN_API = "MAJOR.MINOR"``
#: in the module its entry point names. It is accepted when MAJOR matches and MINOR is not newer
#: than the core's: minors only add hooks or optional methods.
#: 1.1: ``AttentionOps.kv_cache_dtypes`` / ``store_kv`` and ``sparse_attention(..., kv_format=)``, the FP8 KV
#: cache (the core passes ``kv_format`` only when it is set, so 1.0 attention ops keep working).
#: 1.2: ``DenseOps.rms_norm_rope`` (RMSNorm then RoPE in one op; the default calls the two).
#: 1.3: ``DenseOps.hc_pre_norm`` and ``DenseOps.hc_post_pre`` (a sublayer's mHC entry with its RMSNorm, and
#: one sublayer's exit with the next one's entry, each one op; the defaults call the existing ones), and
#: ``DenseOps.linear_f32`` (a float32 product of an activation of any dtype; the default casts it first) and
#: ``AttentionOps.indexer_select`` (the indexer's weights scaled and its columns mapped to slots; the default
#: does both in torch around ``indexer_topk``).
PLUGIN_API_VERSION = "1.3"
