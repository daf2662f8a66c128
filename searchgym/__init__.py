"""searchgym: search-and-browse question answering as Gymnasium environments.

`import searchgym` registers the env ids (`searchgym/SyntheticQA-v0`, `searchgym/LocalQA-v0`);
`gym.make(...)` then builds them.
"""
from searchgym.benchmarks.suites import register_suites
from searchgym.envs.registration import register_envs

__version__ = "0.1.0"

register_envs()
register_suites()  # searchgym/HotpotQA-v0, ... (entry points are strings: nothing heavy imported)
