"""Floor 4: adapters that plug searchgym envs into other trainers and env hosts.

- `searchgym.integrations.trl`: an environment class for TRL's `GRPOTrainer(environment_factory=...)`
  and the prompt dataset it trains on (extra `searchgym[trl]`).
- `searchgym.integrations.openenv`: the OpenEnv client for an env id served by `searchgym serve env ID`
  (the server is `searchgym.serve.env_host`; extra `searchgym[openenv]`).
- `searchgym.integrations.verifiers`: any env id as a verifiers 0.4 taskset, its env and an offline harness
  (`vf-eval searchgym_verifiers`; extra `searchgym[verifiers]`, in a venv of its own).
- `searchgym.integrations.actions`: other libraries' structured tool calls written as the env's action text.

The servers (`serve env`, `serve mcp`) and the limits they keep under abuse are in `searchgym.serve`.

Each imports its library only when used, so `import searchgym.integrations` costs nothing. Whatever
reward crosses to another library is the env judge's verdict (with process rewards only refined by
Clip or Delta, `searchgym.envs.rewards`), and a judge failure is reported as one, never as a 0.
"""
