"""Multi-process serving: DP attention, EP MoE, per-step DP votes, expert-parallel load balancing."""
