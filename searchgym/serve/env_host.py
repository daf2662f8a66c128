"""OpenEnv's server half: any registered searchgym env id served as an OpenEnv environment, and the action,
observation and state types its clients send and read (the client, `SearchGymClient`, is integrations/openenv.py).

`searchgym serve env searchgym/SyntheticQA-v0` hosts the env with OpenEnv's own server (reset, step
and state over a WebSocket session per client, plus /health, /schema, /metadata and the stateless
HTTP routes). Each client session gets its own env, closed when the client goes.

- An action is `SearchAction(tool="search", argument="...")` (a structured call, as TRL's tool methods
  make) or `SearchAction(text="...")` (a whole turn as a model wrote it, tags or `<tool_call>` JSON). A
  malformed action is an observation saying what was wrong, never an error.
- A `SearchObservation` carries the env's text, the turn, the tool that ran, the step's structured
  info (hits, page, verdict once the episode ends), `truncated` and `judge_error`.
- The reward is 0 until the episode ends; then it is the judge's verdict (plus Clip/Delta-refined
  process rewards when the server is started with them). A judge failure ends the episode with
  reward None and `judge_error` set: not a 0.

Needs `pip install 'searchgym[openenv]'`.
"""

from __future__ import annotations

import functools
import json
import uuid
import weakref
from typing import Any

import gymnasium as gym

import searchgym
from searchgym.core.extras import needs
from searchgym.envs.actions import ARGUMENTS, tool_call_action
from searchgym.envs.factory import make_unwrapped
from searchgym.envs.rewards import PROCESS_MODES, episode_reward, judge_error
from searchgym.serve.limits import ServerLimits
from searchgym.serve.settings import ENV_MAX_BODY_BYTES, EnvHostSettings, checked

with needs("searchgym.serve.env_host"):
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
    from pydantic import Field

EITHER_FORM = (
    "An action is either `text` (a whole turn, as a model writes it) or `tool` with `argument` "
    "(one structured call), not {what}. Nothing was run."
)

NOT_STARTED = "No episode has started: reset first. Nothing was run."

BAD_CALL = "{problem} The tools are search (query), access (url) and answer (answer). Nothing was run."

_OPEN_ENVS: weakref.WeakSet[SearchGymEnvironment] = weakref.WeakSet()  # server-side envs not yet closed

RESET_FIELDS = ("seed", "episode_id", "task_id", "index")
STEP_FIELDS = ("timeout_s", "request_id")  # OpenEnv's StepRequest fields besides the action
MAX_BODY_BYTES = ENV_MAX_BODY_BYTES  # an action or reset body; a whole model turn is tens of kB


class BadField(ValueError):
    """A reset or step field a client sent wrong: a 422 naming it over HTTP, an error frame over the WebSocket."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _whole_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class SearchAction(Action):
    """One turn: a structured tool call (`tool` + `argument`) or the turn's raw `text`."""

    tool: str | None = Field(default=None, description="search, access or answer")
    argument: str | None = Field(default=None, description="the query, the url or the final answer")
    text: str | None = Field(default=None, description="a whole turn as a model wrote it (tags or <tool_call> JSON)")


class TextAction(Action):
    """One turn as the model wrote it: the action type of `serve env --action text`, whose one required field is
    `text`, so a client that maps a plain reply into an action's only field (verifiers' OpenEnv taskset) can."""

    text: str = Field(description="a whole turn as a model wrote it (tags or <tool_call> JSON)")


class SearchObservation(Observation):
    """What the env answered: its text, and the step's structured evidence."""

    text: str = Field(default="", description="the observation the agent reads")
    task_id: str | None = Field(default=None, description="the episode's task")
    turn: int = Field(default=0, description="turns taken in this episode")
    tool: str | None = Field(default=None, description="the tool that ran (invalid: none did)")
    truncated: bool = Field(default=False, description="ended by a budget rather than an answer")
    info: dict[str, Any] = Field(default_factory=dict, description="hits, page, errors; the verdict at the end")
    judge_error: str | None = Field(default=None, description="why the judge could not score the answer")


class SearchState(State):
    """The session's episode: which env and task, how far, whether it is over."""

    env_id: str = ""
    task_id: str | None = None
    turn: int = 0
    done: bool = True


def _json_safe(info: dict[str, Any]) -> dict[str, Any]:
    """The step info as plain JSON values (numpy scalars and the like as text)."""
    return json.loads(json.dumps(info, default=str))


class SearchGymEnvironment(Environment[SearchAction, SearchObservation, SearchState]):
    """A searchgym env behind OpenEnv's server: one instance per client session."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own env; the index is only read

    def __init__(
        self,
        env_id: str = "searchgym/SyntheticQA-v0",
        env_kwargs: dict[str, Any] | None = None,
        *,
        process_reward: str | None = None,
        process_weight: float = 0.0,
        process_threshold: float = 0.0,
    ) -> None:
        super().__init__()
        if process_reward is not None and process_reward not in PROCESS_MODES:
            raise ValueError(f"process_reward must be one of {PROCESS_MODES} or None, got {process_reward!r}")
        self.env_id = env_id
        self.reward_options: dict[str, Any] = {
            "process": process_reward,
            "process_weight": process_weight,
            "threshold": process_threshold,
        }
        self._env = make_unwrapped(env_id, **(env_kwargs or {}))  # the SearchEnv, with its native async API
        self._state = SearchState(env_id=env_id)
        self._infos: list[dict[str, Any]] = []
        _OPEN_ENVS.add(self)

    # --- reset -----------------------------------------------------------------------------

    async def reset_async(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        index: int | None = None,
        **unknown: Any,
    ) -> SearchObservation:
        """Start an episode: on `task_id`, on `index`, or on a task drawn with `seed`."""
        self._check_reset(seed, episode_id, task_id, index, unknown)
        options = self._options(task_id, index)
        if isinstance(options, SearchObservation):
            return options
        obs, info = await self._env.areset(seed=seed, options=options)
        return self._started(obs, info, episode_id)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        index: int | None = None,
        **unknown: Any,
    ) -> SearchObservation:
        """Sync form of `reset_async`."""
        self._check_reset(seed, episode_id, task_id, index, unknown)
        options = self._options(task_id, index)
        if isinstance(options, SearchObservation):
            return options
        obs, info = self._env.reset(seed=seed, options=options)
        return self._started(obs, info, episode_id)

    def _check_reset(self, seed: Any, episode_id: Any, task_id: Any, index: Any, unknown: dict[str, Any]) -> None:
        """BadField for a reset field of the wrong type or range, both task_id and index, or an unknown field
        (each was a 500, a silent coercion, a wrap-around or silently ignored)."""
        if unknown:
            name = sorted(unknown)[0]
            raise BadField(name, f"unknown reset field {name!r}; reset takes {', '.join(RESET_FIELDS)}")
        if seed is not None and not (_whole_number(seed) and seed >= 0):
            raise BadField("seed", f"seed must be a whole number of at least 0, got {seed!r}")
        if episode_id is not None and not (isinstance(episode_id, str) and len(episode_id) <= 255):
            raise BadField(
                "episode_id", f"episode_id must be a string of at most 255 characters, got {episode_id!r:.80}"
            )
        if task_id is not None and not isinstance(task_id, str):
            raise BadField("task_id", f"task_id must be a string, got {task_id!r:.80}")
        if index is not None:
            n = len(self._env.tasks)
            if not (_whole_number(index) and 0 <= index < n):
                raise BadField(
                    "index", f"index must be a whole number in [0, {n}) (the pool holds {n} tasks), got {index!r:.80}"
                )
            if task_id is not None:
                raise BadField("index", "give task_id or index, not both")

    def _options(self, task_id: str | None, index: int | None) -> dict[str, Any] | SearchObservation | None:
        """Reset options, or an observation saying why the requested task does not exist."""
        if task_id is not None:
            try:
                self._env.tasks.by_id(task_id)
            except KeyError as e:
                self._state = SearchState(env_id=self.env_id)
                return SearchObservation(text=f"Cannot reset: {e.args[0]}.", done=True, reward=None)
            return {"task_id": task_id}
        return None if index is None else {"index": index}

    def _started(self, obs: str, info: dict[str, Any], episode_id: str | None) -> SearchObservation:
        self._infos = []
        self._state = SearchState(
            episode_id=episode_id or uuid.uuid4().hex,
            step_count=0,
            env_id=self.env_id,
            task_id=info["task_id"],
            turn=0,
            done=False,
        )
        return SearchObservation(text=obs, task_id=info["task_id"], info=_json_safe(info), reward=None)

    # --- step ------------------------------------------------------------------------------

    async def step_async(
        self, action: SearchAction | TextAction, timeout_s: float | None = None, **kwargs: Any
    ) -> SearchObservation:
        """Run one turn; a malformed action is explained in the observation."""
        _check_step(kwargs)
        text = self._action_text(action)
        if isinstance(text, SearchObservation):
            return text
        return self._stepped(*await self._env.astep(text))

    def step(
        self, action: SearchAction | TextAction, timeout_s: float | None = None, **kwargs: Any
    ) -> SearchObservation:
        """Sync form of `step_async`."""
        _check_step(kwargs)
        text = self._action_text(action)
        if isinstance(text, SearchObservation):
            return text
        return self._stepped(*self._env.step(text))

    def _action_text(self, action: SearchAction | TextAction) -> str | SearchObservation:
        """The env action for `action`, or an observation (no turn spent) when it is neither one form nor the other,
        or a structured call to an unknown tool or without its argument."""
        if self._state.task_id is None:  # never reset: there is no episode to step
            return SearchObservation(text=NOT_STARTED, done=True, reward=None)
        tool, argument = getattr(action, "tool", None), getattr(action, "argument", None)
        has_text, has_call = action.text is not None, tool is not None or argument is not None
        if has_text == has_call:
            return self._unspent(EITHER_FORM.format(what="both" if has_text else "neither"))
        if action.text is not None:  # has_text
            return action.text
        if tool not in ARGUMENTS:
            return self._unspent(
                BAD_CALL.format(
                    problem=f"There is no tool {tool!r}." if tool is not None else "A structured call needs a tool."
                )
            )
        if argument is None or not argument.strip():
            return self._unspent(BAD_CALL.format(problem=f"The {tool} tool needs its {ARGUMENTS[tool]}."))
        return tool_call_action(tool, argument)

    def _unspent(self, text: str) -> SearchObservation:
        """An observation explaining an action that was not run: the turn count and the episode are unchanged."""
        return SearchObservation(
            text=text, task_id=self._state.task_id, turn=self._state.turn, done=self._state.done, reward=None
        )

    def _stepped(
        self, obs: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> SearchObservation:
        done = terminated or truncated
        if self._state.done:  # a step after the end changes nothing
            return SearchObservation(
                text=obs,
                task_id=self._state.task_id,
                turn=self._state.turn,
                done=True,
                info=_json_safe(info),
                reward=None,
            )
        self._infos.append(info)
        self._state.step_count += 1
        self._state.turn, self._state.done = info.get("turn", self._state.turn), done
        paid = episode_reward(self._infos, **self.reward_options) if done else 0.0
        return SearchObservation(
            text=obs,
            task_id=info.get("task_id"),
            turn=self._state.turn,
            tool=info.get("tool"),
            truncated=truncated,
            info=_json_safe(info),
            judge_error=judge_error(self._infos) if done else None,
            done=done,
            reward=paid,
        )

    # --- the rest of the contract ----------------------------------------------------------

    @property
    def state(self) -> SearchState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=self.env_id,
            version=searchgym.__version__,
            author="searchgym",
            description=(
                "Search-and-browse question answering: search, access pages, answer; the reward is "
                f"the {self._env.judge.name} judge's verdict on the answer."
            ),
        )

    def close(self) -> None:
        if self in _OPEN_ENVS:
            _OPEN_ENVS.discard(self)
            self._env.close()


def _check_step(kwargs: dict[str, Any]) -> None:
    """BadField for a step field OpenEnv's StepRequest does not define (it would be ignored silently)."""
    unknown = sorted(set(kwargs) - set(STEP_FIELDS))
    if unknown:
        raise BadField(unknown[0], f"unknown step field {unknown[0]!r}; a step takes action, {', '.join(STEP_FIELDS)}")


def open_sessions() -> int:
    """How many server-side envs are open in this process (one per live client session)."""
    return len(_OPEN_ENVS)


def make_app(settings: EnvHostSettings) -> Any:
    """The FastAPI app that serves `settings.env_id` with OpenEnv's server (one env per WebSocket session).

    A body over `max_body_bytes` is a 413 before it is read, one not whole `limits.body_timeout` s after its head a
    408; a session silent for `session_idle_timeout` seconds is closed and its slot freed (WebSocket sessions here,
    HTTP MCP sessions by OpenEnv's reaper); a reset or step field of the wrong type or range, or unknown, is a 422
    naming it. `action` is the action type clients send: "structured" (`SearchAction`: a tool call or a whole
    turn's text) or "text" (`TextAction`: only the turn's text, its one required field).
    """
    from fastapi.responses import JSONResponse
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.types import ConcurrencyConfig

    from searchgym.serve.asgi_limits import BodyLimit, WebSocketIdleTimeout

    _check_setting("max_sessions", settings.max_sessions, whole=True)
    _check_setting("max_body_bytes", settings.max_body_bytes, whole=True)
    _check_setting("session_idle_timeout", settings.session_idle_timeout)
    checked(settings)
    env_id = settings.env_id
    if env_id not in gym.registry:
        raise ValueError(
            f"unknown env id {env_id!r}; registered searchgym ids: "
            f"{sorted(i for i in gym.registry if i.startswith('searchgym/'))}"
        )
    factory = functools.partial(
        SearchGymEnvironment,
        env_id,
        dict(settings.env_kwargs or {}),
        process_reward=settings.process_reward,
        process_weight=settings.process_weight,
        process_threshold=settings.process_threshold,
    )
    factory().close()  # fail now, not at the first client, if the env cannot be built with these kwargs
    app = create_fastapi_app(
        factory,
        ACTION_TYPES[settings.action],
        SearchObservation,
        state_cls=SearchState,
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=settings.max_sessions, session_timeout=settings.session_idle_timeout
        ),
    )

    async def bad_field(request: Any, exc: BadField) -> JSONResponse:
        return JSONResponse(
            {"detail": [{"loc": ["body", exc.field], "msg": str(exc), "type": "value_error"}]}, status_code=422
        )

    app.add_exception_handler(BadField, bad_field)
    app.add_middleware(WebSocketIdleTimeout, idle_s=settings.session_idle_timeout)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.limits.body_timeout)
    return app


ACTION_TYPES: dict[str, type[Action]] = {"structured": SearchAction, "text": TextAction}


def _check_setting(key: str, value: Any, *, whole: bool = False) -> None:
    """ValueError naming `key` unless value is a positive number (a whole one with `whole`)."""
    ok = (isinstance(value, int) if whole else isinstance(value, (int, float))) and not isinstance(value, bool)
    if not (ok and 0 < value < float("inf")):
        raise ValueError(f"{key} must be a positive {'whole number' if whole else 'number'}, got {value!r}")


def serve(settings: EnvHostSettings) -> None:
    """Serve `settings.env_id` until interrupted (what `searchgym serve env` runs), its connections under
    `settings.limits`."""
    import uvicorn

    print(
        f"serving {settings.env_id} as an OpenEnv environment on http://{settings.host}:{settings.port} "
        "(WebSocket /ws)",
        flush=True,
    )
    app = make_app(settings)
    options = uvicorn_options(settings.limits, settings.max_body_bytes)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", **options)


def uvicorn_options(limits: ServerLimits, max_body_bytes: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """uvicorn.Config options that enforce `limits`: the header timeout (our protocol), keep-alive, the connection
    cap (uvicorn answers 503 past it), the request-head size and the WebSocket message size."""
    from searchgym.serve.asgi_limits import guarded_http_protocol

    return {
        "http": guarded_http_protocol(limits.header_timeout, limits.idle_timeout),
        "timeout_keep_alive": limits.idle_timeout,
        "limit_concurrency": limits.connection_cap,
        "h11_max_incomplete_event_size": 64 * 2**10,
        "ws_max_size": max_body_bytes,
    }
