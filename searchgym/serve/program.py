"""Agent programs: an ordinary `async def agent(task, client) -> str` written against the `openai` client, played
and trained as a searchgym Workflow through the recording proxy (serve/proxy.py).

The contract (docs/agents.md, "Agent programs"):

- `task` is an `AgentTask`: the `question`, the env's opening text (`prompt`: instructions written for
  text-format agents), the `model` name to ask for, `tools` (the env's `search` and `access` as OpenAI
  function tools) and `await task.call_tool(name, arguments)`, which runs one tool on the env and returns its
  observation (`arguments` as the model wrote them: a JSON string or a dict), and `task.mcp_url`, the same tools
  (and `answer`) over MCP: a streamable-HTTP endpoint of this episode (serve/mcp_endpoint.py; the `mcp` extra).
- `client` is an `openai.AsyncOpenAI` pointed at this episode's proxy URL.
- The agent returns its final answer; the workflow submits it as the env's `answer` action, so the reward is the
  env's verdict. An agent that already answered (`call_tool("answer", ...)`) or ran out of turns has its return
  value ignored; one that raises (`SystemExit` included), or runs past `episode_timeout`, ends the episode
  truncated, with the error as its stop reason. At the deadline its tools shut and it is cancelled; one that ignores
  cancellation is abandoned (agents/budget.py), and whatever it does or returns late is never judged.

The model's tool calls reach the env only through `call_tool` or the episode's MCP endpoint: the agent stays an
ordinary tool-calling loop (as with any OpenAI tool), and the proxy never acts on the model's output behind the
agent's back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from searchgym.agents.budget import Abandoned, run_within
from searchgym.agents.engines.open import EngineHandle
from searchgym.agents.engines.types import InferenceEngine
from searchgym.agents.trajectory import Trajectory
from searchgym.agents.workflow import Workflow, WorkflowSettings, build_workflow, load_object
from searchgym.core.extras import MissingExtra, hint
from searchgym.envs.actions import ARGUMENT_KEYS, tool_call_action
from searchgym.envs.search_env import SearchEnv
from searchgym.serve.mcp_endpoint import FEATURE, EpisodeToolServer, mcp_available
from searchgym.serve.proxy import DEFAULT_MODEL_NAME, RecordingProxy

EPISODE_OVER = "The episode is over ({why}); no more tools run. Return your final answer."

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the knowledge source; returns the top results with their urls.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "What to search for"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "access",
            "description": "Open a page from the search results; opening it again shows its next part.",
            "parameters": {
                "type": "object",
                "properties": {"url": {"type": "string", "description": "A result's url"}},
                "required": ["url"],
            },
        },
    },
]

AgentFunction = Callable[["AgentTask", Any], Awaitable[Any]]


@dataclass
class AgentTask:
    """What an agent program gets for one episode (see the module docstring)."""

    task_id: str
    question: str
    prompt: str
    model: str
    tools: list[dict[str, Any]] = field(default_factory=lambda: [dict(t) for t in TOOLS])
    _call: Callable[[str, Any], Awaitable[str]] | None = field(default=None, repr=False)
    _mcp_url: str | None = field(default=None, repr=False)

    @property
    def mcp_url(self) -> str:
        """This episode's tools over MCP (streamable HTTP): `search`, `access` and `answer` on the same env."""
        if self._mcp_url is None:
            raise MissingExtra(f"{FEATURE} needs the MCP SDK: {hint('mcp')}")
        return self._mcp_url

    async def call_tool(self, name: str, arguments: str | Mapping[str, Any] | None = None) -> str:
        """Run tool `name` on the env with the model's `arguments`; the observation (or why it could not run)."""
        if self._call is None:
            raise RuntimeError("this AgentTask is not attached to an episode")
        return await self._call(name, arguments)


def tool_argument(name: str, arguments: str | Mapping[str, Any] | None) -> str:
    """The one argument the env's tool `name` takes, from the model's arguments (JSON text or an object); text that
    is not a JSON object is taken as the argument itself."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        arguments = parsed if isinstance(parsed, dict) else {"": arguments}
    arguments = dict(arguments or {})
    for key in ARGUMENT_KEYS.get(name, ()):
        if key in arguments:
            value = arguments[key]
            return value if isinstance(value, str) else json.dumps(value)
    values = list(arguments.values())
    return values[0] if len(values) == 1 and isinstance(values[0], str) else json.dumps(arguments)


class AgentProgramWorkflow(Workflow):
    """Plays episodes with an agent program through a RecordingProxy over a token-level engine (which the caller
    owns); the trajectory holds the proxy's token-exact record, the env's verdict and the reward."""

    def __init__(
        self,
        agent: AgentFunction | str,
        engine: InferenceEngine,
        tokenizer: Any,
        settings: WorkflowSettings | None = None,
        *,
        served_model_name: str = DEFAULT_MODEL_NAME,
        client_timeout: float = 600.0,
        episode_timeout: float | None = 3600.0,
    ) -> None:
        super().__init__(settings)
        self.agent = load_object(agent) if isinstance(agent, str) else agent
        if not callable(self.agent):
            raise TypeError(f"agent {agent!r} is not callable: expected `async def agent(task, client) -> str`")
        self.engine, self.tokenizer = engine, tokenizer
        self.served_model_name, self.client_timeout = served_model_name, client_timeout
        if episode_timeout is not None and not (
            isinstance(episode_timeout, (int, float))
            and not isinstance(episode_timeout, bool)
            and 0 < episode_timeout < float("inf")
        ):
            raise ValueError(f"episode_timeout must be a number of seconds > 0 (or None), got {episode_timeout!r}")
        self.episode_timeout = episode_timeout  # an agent still running after it is stopped: the episode ends truncated
        self._proxy: RecordingProxy | None = None
        self._tool_server: EpisodeToolServer | None = None  # task.mcp_url's server, beside the proxy
        self.abandoned_tasks = Abandoned()  # agents that ignored cancellation at their deadline, until they end
        self._users = 0
        self._lock: asyncio.Lock | None = None

    @property
    def abandoned(self) -> int:
        """Agents of this workflow that ignored cancellation at their deadline and are still running."""
        return len(self.abandoned_tasks)

    @classmethod
    def on_handle(
        cls, handle: EngineHandle, agent: AgentFunction | str, settings: WorkflowSettings | None = None
    ) -> AgentProgramWorkflow:
        """The workflow over an opened token-level engine (a model dir or sglang:...)."""
        if handle.engine is None:
            raise ValueError(
                f"an agent program is trained and recorded through a token-level engine (a model dir or "
                f"sglang:...); {handle.spec!r} is a chat endpoint"
            )
        return cls(agent, handle.engine, handle.tokenizer, settings)

    @contextlib.asynccontextmanager
    async def proxy(self) -> AsyncIterator[RecordingProxy]:
        """The proxy, shared by the episodes running now: started by the first, stopped when the last ends."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._proxy is None:
                proxy = RecordingProxy(
                    self.engine,
                    self.tokenizer,
                    served_model_name=self.served_model_name,
                    context_length=min(self.settings.max_context, getattr(self.engine, "max_context", None) or 1 << 30),
                    max_reply_tokens=self.settings.sampling.max_new_tokens,
                    temperature=self.settings.sampling.temperature,
                )
                self._proxy = await proxy.__aenter__()
                if mcp_available():
                    try:
                        self._tool_server = await EpisodeToolServer().__aenter__()
                    except BaseException:
                        proxy, self._proxy = self._proxy, None
                        await proxy.__aexit__(None, None, None)
                        raise
            self._users += 1
        try:
            yield self._proxy
        finally:
            async with self._lock:
                self._users -= 1
                if self._users == 0 and self._proxy is not None:
                    proxy, self._proxy = self._proxy, None
                    tool_server, self._tool_server = self._tool_server, None
                    try:
                        if tool_server is not None:
                            await tool_server.__aexit__(None, None, None)
                    finally:
                        await proxy.__aexit__(None, None, None)

    async def arun_episode(
        self, env: SearchEnv, *, seed: int | None = None, options: dict[str, Any] | None = None, rid: str | None = None
    ) -> Trajectory:
        """Run the agent on the env's task, submit its answer, and link the proxy's record into the trajectory."""
        import openai

        obs, traj = await self.start_episode(env, seed, options)
        unwrapped = getattr(env, "unwrapped", env)
        question = getattr(getattr(unwrapped, "task", None), "question", None) or obs
        done = False
        closed: str | None = None  # why the agent's tools are shut before the env ended the episode

        async with self.proxy() as proxy:
            record = proxy.open_episode(f"{uuid.uuid4().hex}")

            async def call_tool(name: str, arguments: Any) -> str:
                nonlocal done
                if done or closed:
                    return EPISODE_OVER.format(why=closed or traj.stop_reason)
                action = tool_call_action(str(name), tool_argument(str(name), arguments))
                step = await self.step_env(env, traj, action, 0.0)
                done, record.turn = step.done, len(traj.turns)
                return await self.observe(env, traj, step)

            client = openai.AsyncOpenAI(
                base_url=proxy.base_url(record.key), api_key="searchgym", timeout=self.client_timeout
            )
            answer: Any = None
            error: str | None = None

            def close() -> None:
                """The agent's deadline: from now on no tool runs and its answer is not judged."""
                nonlocal closed
                closed = "agent timeout"

            try:
                async with contextlib.AsyncExitStack() as stack:
                    mcp_url = None
                    if self._tool_server is not None:
                        mcp_url = await stack.enter_async_context(self._tool_server.episode(record.key, call_tool))
                    task = AgentTask(
                        traj.task_id, question, obs, self.served_model_name, _call=call_tool, _mcp_url=mcp_url
                    )
                    # run_within catches the agent's own errors (here, inside the MCP endpoint's task group, they
                    # would be wrapped in an ExceptionGroup) and abandons an agent that ignores cancellation
                    answer, error = await run_within(
                        lambda: self.agent(task, client), self.episode_timeout, self.abandoned_tasks, close
                    )
            except Exception as e:  # noqa: BLE001 -- the episode's MCP endpoint failed: the episode ends, not the run
                error = f"episode MCP endpoint error: {type(e).__name__}: {e}"
            finally:
                await client.close()
                proxy.close_episode(record.key)
        if not done:
            if error is None and isinstance(answer, str):
                await self.step_env(env, traj, tool_call_action("answer", answer), 0.0)
            else:
                traj.truncated = True
                traj.stop_reason = error or f"the agent returned {type(answer).__name__}, not an answer string"
        record.link(traj)
        return traj


def is_agent_program(obj: Any) -> bool:
    """Whether `obj` is an agent program's function (callable, not a class)."""
    return callable(obj) and not isinstance(obj, type)


def build_player(
    handle: EngineHandle,
    *,
    workflow: str | type[Workflow] | AgentFunction | None = None,
    settings: WorkflowSettings | None = None,
) -> Workflow:
    """`build_workflow`, where `workflow` may also name an agent program's function (`"file.py:agent"`: an
    AgentProgramWorkflow), so `eval --agent` and `rollout.agent` run wherever a custom Workflow class runs."""
    loaded = load_object(workflow) if isinstance(workflow, str) else workflow
    if not is_agent_program(loaded):
        return build_workflow(handle, workflow=cast("str | type[Workflow] | None", workflow), settings=settings)
    return AgentProgramWorkflow.on_handle(handle, cast(AgentFunction, loaded), settings)
