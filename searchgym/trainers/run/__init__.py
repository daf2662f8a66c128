"""Run bookkeeping both launchers share: the run's start or resume, checkpoints, the collapse watchdog and
its restore, the run log and each step's metrics, stopping on a signal, and partially written directories."""
