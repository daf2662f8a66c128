"""Floor 4: adapters that plug searchgym envs into other trainers and env hosts.

- `searchgym.integrations.trl`: an environment class for TRL's `GRPOTrainer(environment_factory=...)`
  and the prompt dataset it trains on (extra `searchgym[trl]`).
- `searchgym.integrations.openenv`: any env id served as an OpenEnv environment server, and the
  client for it (extra `searchgym[openenv]`; `searchgym serve env ID`).
- `searchgym.integrations.verifiers`: any env id as a verifiers 0.4 taskset, its env and an offline harness
  (`vf-eval searchgym_verifiers`; extra `searchgym[verifiers]`, in a venv of its own).
- `searchgym.integrations.actions`: other libraries' structured tool calls written as the env's action text;
  `searchgym.integrations.asgi_limits`: the limits `serve env`'s server keeps under abuse.

Each imports its library only when used, so `import searchgym.integrations` costs nothing. Whatever
reward crosses to another library is the env judge's verdict (with process rewards only refined by
Clip or Delta, `searchgym.envs.rewards`), and a judge failure is reported as one, never as a 0.
"""
