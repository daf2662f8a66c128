"""The rollout side of asynchronous RL: the controller that keeps episode groups in flight under the
staleness rule, the ledger of every group's life, and the routes by which new weights reach the engines."""
