"""The learner's math and update: returns, advantages and the decoupled PPO loss, one step over a batch of
groups, log-probs from hidden states a chunk at a time, and the same step sharded over ranks (FSDP2)."""
