"""The reference trainer: fully asynchronous decoupled PPO (AReaL's objective) on searchgym's envs.

Rooms, by job:

- `algorithm/`: the learner's math and its update (ppo.py, learner.py, lm_head.py) and the sharded learner
  (fsdp.py); nothing here knows about launchers or engines (a learner writes its own checkpoint).
- `rollout/`: the rollout side: the controller that keeps groups in flight (controller.py), its ledger and
  occupancy record, and the routes by which new weights reach the engines (weight_sync.py, dist_sync.py).
- `launchers/`: one process (local.py, with local_ranks.py for a sharded learner's follower processes) or a
  Ray cluster (ray_cluster.py, ray_actors.py, ray_servers.py). Neither launcher imports the other.
- `run/`: run bookkeeping both launchers share: where a run starts, checkpoints, the collapse watchdog and
  its restore, the run log and step metrics, stopping on a signal, partial directories.
- `warm_start/`: supervised warm start (sft.py) and copy pretraining before RL.

At the top: the settings (config.py), the run's deployment resolved once from them (deployment.py: engine kind,
learner ranks, weight route, devices and processes; both launchers and the plan read it), how a run's parts are
built from them (build.py), the one training loop both launchers run (loop.py) and its learner side
(learner_side.py), and the resource plan (plan.py).
"""
