"""searchgym: search-and-browse question answering as Gymnasium environments.

`import searchgym` registers the env ids (`searchgym/SyntheticQA-v0`, `searchgym/LocalQA-v0`, the
benchmark suites); it imports nothing above `envs`, so it stays light.
`gym.make(...)` then builds them.
"""

from searchgym.envs.registration import register_envs

__version__ = "0.1.0"

register_envs()
