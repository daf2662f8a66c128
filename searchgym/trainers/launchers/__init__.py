"""How a run's parts are placed: all in one process (local.py) or on a Ray cluster (ray_cluster.py). Both run
the one training loop (trainers/loop.py) with the one learner side (trainers/learner_side.py); neither
imports the other."""
