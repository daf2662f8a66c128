"""Floor 1: tasks, tools, judges and SearchEnv. Imports only the ground floor below it (core; docs/architecture.md)."""

from searchgym.envs.actions import Action, parse_action
from searchgym.envs.judges import Judge, Verdict, make_judge
from searchgym.envs.search_env import SearchEnv
from searchgym.envs.spaces import UnicodeText
from searchgym.envs.tasks import Task, TaskFileError, TaskPool

__all__ = [
    "Action",
    "Judge",
    "SearchEnv",
    "Task",
    "TaskFileError",
    "TaskPool",
    "UnicodeText",
    "Verdict",
    "make_judge",
    "parse_action",
]
