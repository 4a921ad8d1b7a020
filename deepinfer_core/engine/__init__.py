"""The engine: input processing, scheduler, KV manager, model runner, sampler, output processing."""
