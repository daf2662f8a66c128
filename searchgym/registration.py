"""Registers searchgym's gym ids, benchmark suites included: what `import searchgym` runs.

Entry points are strings, so registering imports only envs (gymnasium, the ids, the suites) and `import
searchgym` stays light; the factories load when `gym.make` builds an env. The strings still name modules
(world's SyntheticQA, agents' SimulatedQA), so this room sits above agents, on no lower floor than what it names
(tests/test_import_direction.py counts entry-point strings as imports)."""

from __future__ import annotations

import gymnasium as gym

from searchgym.envs.env_ids import LOCAL_QA, SIMULATED_QA, SYNTHETIC_QA, WEB_QA
from searchgym.envs.suites import register_suites


def register_envs() -> None:
    """Register every searchgym env id, benchmark suites included (idempotent)."""
    specs = {
        SYNTHETIC_QA: "searchgym.world.synthetic_env:make_synthetic_qa",
        LOCAL_QA: "searchgym.envs.local_qa:make_local_qa",
    }
    for env_id, entry_point in specs.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, nondeterministic=False, disable_env_checker=False)
    if WEB_QA not in gym.registry:  # the live web: same seed and actions need not give the same episode
        gym.register(
            id=WEB_QA,
            entry_point="searchgym.envs.web_env:make_web_qa",
            nondeterministic=True,
            disable_env_checker=False,
        )
    if SIMULATED_QA not in gym.registry:  # search written by an LLM (agents/simulated_env.py opens the engine)
        gym.register(
            id=SIMULATED_QA,
            entry_point="searchgym.agents.simulated_env:make_simulated_qa",
            nondeterministic=False,
            disable_env_checker=False,
        )
    register_suites()  # searchgym/HotpotQA-v0, ...
