"""searchgym's verifiers 0.4 taskset under the top-level name verifiers resolves plugin ids to: `vf-eval
searchgym_verifiers`.

verifiers imports a taskset id as one module name (a dotted id is not found), so this package re-exports
`searchgym.integrations.verifiers`: its taskset, env and offline harness.
"""

from searchgym.integrations.verifiers import OfflineChatHarness, SearchGymTaskset, SearchGymVfEnv

__all__ = ["OfflineChatHarness", "SearchGymTaskset", "SearchGymVfEnv"]
