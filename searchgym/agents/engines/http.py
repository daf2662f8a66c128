"""One aiohttp session per event loop: moved to envs (envs may not import agents); re-exported for the engines."""
from searchgym.envs.tools.http_session import LoopSession, close_at_loop_shutdown

__all__ = ["LoopSession", "close_at_loop_shutdown"]
