"""searchgym: search-and-browse question answering as Gymnasium environments.

`import searchgym` registers the env ids (`searchgym/SyntheticQA-v0`, `searchgym/LocalQA-v0`, the
benchmark suites) through `searchgym.registration`, which imports only envs: the factories are entry-point
strings, so `import searchgym` stays light (no torch, no Transformers).
`gym.make(...)` then builds them.
"""

from searchgym.registration import register_envs

__version__ = "0.1.0"

register_envs()
