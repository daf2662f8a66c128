"""A client for one or many SGLang servers (or `searchgym serve model`) through SGLang's native HTTP API.

`SGLangEngine` satisfies InferenceEngine: token ids in, token ids + behaviour logprobs + per-token
weight versions out. A trajectory's turns go to the same server (its prefix cache holds the
trajectory so far); a new trajectory goes to the server with the fewest requests in flight.
Requests aborted by a pause come back with their partial tokens; the engine keeps them, waits for
the servers to continue, and resubmits prompt + partial for the rest of the token budget, so a
weight update costs no generated work and every token keeps the version that produced it.

`SGLangServer` launches `python -m sglang.launch_server ...` as a subprocess and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from searchgym.agents.engines.types import FinishReason, GenerateRequest, GenerateResponse, SamplingParams
from searchgym.core.http_session import LoopSession, ReplyTooLarge, read_capped

MAX_REPLY_BYTES = 256 * 2**20  # /generate with every logprob of a long reply is tens of MB; past this is junk

LOG_TAIL_CHARS = 4000
_FLUSH_ATTEMPTS = 60


class SGLangError(RuntimeError):
    """A server refused a request, reported a failure, or could not be reached after retries."""


class _Transient(Exception):
    """A failure worth retrying elsewhere: connection error, timeout or 5xx."""


def _base_url(address: str) -> str:
    """'host:port' or 'http://host:port/' -> 'http://host:port'."""
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"


def _parse_version(label: Any) -> int:
    """SGLang's weight_version label as this library's integer version ('default', SGLang's initial label, is 0)."""
    if label is None or label == "default":
        return 0
    try:
        return int(label)
    except (TypeError, ValueError):
        raise SGLangError(
            f"weight_version {label!r} is not an integer; SGLangEngine labels versions with integers"
        ) from None


def _finish_reason(raw: Any) -> FinishReason:
    """SGLang's finish_reason object -> FinishReason; an abort carrying an HTTP error status is raised as an error."""
    if not isinstance(raw, dict) or raw.get("type") not in ("stop", "length", "abort"):
        raise SGLangError(f"malformed finish_reason {raw!r}")
    if raw["type"] == "length":
        return FinishReason("length", matched=raw.get("length"))
    if raw["type"] == "abort":
        status = raw.get("status_code")
        if isinstance(status, int) and 400 <= status < 600:
            raise SGLangError(f"the server rejected the request ({status}): {raw.get('message')}")
        return FinishReason("abort", message=raw.get("message"))
    return FinishReason("stop", matched=raw.get("matched"))


def _parse_generate(data: Any) -> tuple[list[int], list[float], int, FinishReason]:
    """A /generate answer -> (token ids, logprobs, weight version, finish reason)."""
    try:
        meta = data["meta_info"]
        triples = meta["output_token_logprobs"]
        ids = [int(t[1]) for t in triples]
        logprobs = [float(t[0]) for t in triples]
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise SGLangError(f"malformed /generate response ({type(e).__name__}: {e}): {str(data)[:300]}") from None
    return ids, logprobs, _parse_version(meta.get("weight_version")), _finish_reason(meta.get("finish_reason"))


async def wait_until_ready(
    session: aiohttp.ClientSession,
    url: str,
    timeout: float,
    alive: Callable[[], None] = lambda: None,
    interval: float = 0.5,
) -> None:
    """Poll GET url/health_generate until it answers 200; `alive` raises if the server is known to be dead."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        alive()
        try:
            async with session.get(f"{url}/health_generate", timeout=aiohttp.ClientTimeout(total=30)) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except (TimeoutError, aiohttp.ClientError) as e:
            last = f"{type(e).__name__}: {e}"
        await asyncio.sleep(interval)
    raise TimeoutError(f"{url} was not ready within {timeout:.0f} s (last: {last})")


class SGLangEngine:
    """InferenceEngine over SGLang servers: sticky routing by rid, least-loaded placement, abort-and-resume."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        request_timeout: float = 3600,
        max_connections: int = 1024,
        max_retries: int = 3,
        retry_backoff: float = 0.5,
        resume_poll_interval: float = 0.1,
        sticky_capacity: int = 100_000,
    ) -> None:
        if not addresses:
            raise ValueError("SGLangEngine needs at least one server address")
        self.urls = [_base_url(a) for a in addresses]
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.resume_poll_interval = resume_poll_interval
        self.sticky_capacity = sticky_capacity
        self.in_flight = [0] * len(self.urls)
        self.counters: Counter[str] = Counter()
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._turn = 0
        self._version = 0
        self._paused = False
        self._sessions = LoopSession(
            lambda: aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                timeout=aiohttp.ClientTimeout(total=self.request_timeout),
            )
        )

    @property
    def version(self) -> int:
        """The weight version the servers were last set to (or reported at start)."""
        return self._version

    async def _http(self) -> aiohttp.ClientSession:
        """The running loop's HTTP session (see core/http_session.py)."""
        return (await self._sessions.get())[0]

    async def start(self, wait_ready: bool = True, timeout: float = 600) -> SGLangEngine:
        """Wait for every server's /health_generate, then read the weight version from /model_info."""
        if wait_ready:
            http = await self._http()
            await asyncio.gather(*(wait_until_ready(http, url, timeout) for url in self.urls))
        infos = await asyncio.gather(*(self.model_info(i) for i in range(len(self.urls))))
        self._version = max(_parse_version(info.get("weight_version")) for info in infos)
        return self

    async def model_info(self, server: int = 0) -> dict[str, Any]:
        """A server's /model_info (SGLang 0.5.23's name), or /get_model_info from servers older than it."""
        try:
            status, body = await self._request(server, "GET", "/model_info")
        except _Transient as e:
            raise SGLangError(str(e)) from None
        if status == 404:
            return await self._call(server, "GET", "/get_model_info")
        if status != 200 or not isinstance(body, dict):
            raise SGLangError(f"GET {self.urls[server]}/model_info: HTTP {status}: {str(body)[:300]}")
        return body

    # ---- HTTP ----------------------------------------------------------------------------------------------

    async def _request(self, server: int, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
        """(status, parsed JSON or text) of one call; transport failures and 5xx raise _Transient."""
        url = f"{self.urls[server]}{path}"
        try:
            async with (await self._http()).request(method, url, json=payload) as resp:
                try:
                    text = (await read_capped(resp, MAX_REPLY_BYTES)).decode("utf-8", "replace")
                except ReplyTooLarge as e:  # a server that answers this much is broken, not busy: not retried
                    raise SGLangError(f"{method} {url}: {e}") from None
                status = resp.status
        except (TimeoutError, aiohttp.ClientError) as e:
            raise _Transient(f"{method} {url}: {type(e).__name__}: {e}") from None
        if status >= 500:
            raise _Transient(f"{method} {url}: HTTP {status}: {text[:300]}")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    async def _call(self, server: int, method: str, path: str, payload: Any = None) -> Any:
        """The JSON answer of a control call; any failure is an SGLangError naming the server."""
        try:
            status, body = await self._request(server, method, path, payload)
        except _Transient as e:
            raise SGLangError(str(e)) from None
        if status != 200:
            raise SGLangError(f"{method} {self.urls[server]}{path}: HTTP {status}: {str(body)[:300]}")
        return body

    # ---- routing ------------------------------------------------------------------------------------------

    def _least_loaded(self, exclude: int | None = None) -> int:
        """The server with the fewest requests in flight; ties rotate so sequential new rids spread out."""
        self._turn += 1
        candidates = [i for i in range(len(self.urls)) if i != exclude] or [0]  # one server: the excluded one
        return min(candidates, key=lambda i: (self.in_flight[i], (i - self._turn) % len(self.urls)))

    def _route(self, rid: str) -> int:
        """The rid's server if it has one (prefix-cache affinity), else the least-loaded one, remembered."""
        if rid and rid in self._sticky:
            self._sticky.move_to_end(rid)
            return self._sticky[rid]
        server = self._least_loaded()
        self._pin(rid, server)
        return server

    def _pin(self, rid: str, server: int) -> None:
        """Remember rid -> server, forgetting the least recently used rids beyond capacity."""
        if not rid:
            return
        self._sticky[rid] = server
        self._sticky.move_to_end(rid)
        while len(self._sticky) > self.sticky_capacity:
            self._sticky.popitem(last=False)

    def server_of(self, rid: str) -> str | None:
        """The URL a rid is pinned to, if any."""
        server = self._sticky.get(rid)
        return None if server is None else self.urls[server]

    # ---- generation ---------------------------------------------------------------------------------------

    async def _post_generate(self, server: int, payload: dict, rid: str) -> tuple[Any, int]:
        """POST /generate with retries on transient failures, moving to another server when there is one."""
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.counters["retries"] += 1
                server = self._least_loaded(exclude=server)
                self._pin(rid, server)
                await asyncio.sleep(self.retry_backoff * 2 ** (attempt - 1) * random.uniform(0.5, 1.0))
            self.in_flight[server] += 1
            try:
                status, body = await self._request(server, "POST", "/generate", payload)
            except _Transient as e:
                last = str(e)
                continue
            finally:
                self.in_flight[server] -= 1
            if status != 200:
                raise SGLangError(f"POST {self.urls[server]}/generate: HTTP {status}: {str(body)[:500]}")
            return body, server
        raise SGLangError(f"/generate failed {self.max_retries + 1} times; last error: {last}")

    async def agenerate(self, request: GenerateRequest) -> GenerateResponse:
        """Generate to completion; requests aborted by a pause are resumed with their partial tokens kept."""
        budget = request.sampling.max_new_tokens
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        server = self._route(request.rid)
        while True:
            payload = _payload(
                request.input_ids + ids, replace(request.sampling, max_new_tokens=budget - len(ids)), request.rid
            )
            data, server = await self._post_generate(server, payload, request.rid)
            new_ids, new_logprobs, version, finish = _parse_generate(data)
            ids += new_ids
            logprobs += new_logprobs
            versions += [version] * len(new_ids)
            if finish.type != "abort" or len(ids) >= budget:
                break
            self.counters["resubmitted"] += 1
            await self._wait_resumed()
        if finish.type != "stop":  # length, or aborted with nothing left to generate
            finish = FinishReason("length", matched=budget)
        return GenerateResponse(ids, logprobs, versions, finish, prompt_tokens=len(request.input_ids), rid=request.rid)

    async def _wait_resumed(self) -> None:
        """After an abort, wait out this engine's own pause (a server paused by someone else holds the resubmission)."""
        await asyncio.sleep(self.resume_poll_interval)
        while self._paused:
            await asyncio.sleep(self.resume_poll_interval)

    # ---- pause, resume, weights ------------------------------------------------------------------------

    async def _broadcast(self, path: str, payload: Any) -> list[Any]:
        """POST the same control call to every server."""
        return await asyncio.gather(*(self._call(i, "POST", path, payload) for i in range(len(self.urls))))

    async def pause(self) -> None:
        """Pause every server in abort mode: in-flight requests come back partial and wait for resume()."""
        self._paused = True
        await self._broadcast("/pause_generation", {"mode": "abort"})

    async def resume(self) -> None:
        """Continue every server; requests waiting after an abort are resubmitted."""
        await self._broadcast("/continue_generation", {})
        self._paused = False

    async def update_weights(self, source: str | os.PathLike | Mapping, version: int) -> None:
        """Load a checkpoint dir on every server as `version`: pause, update, flush (retried), continue.

        Raises SGLangError if any server reports failure (those servers keep their old weights and label).
        """
        if isinstance(source, Mapping):
            raise TypeError(
                "SGLangEngine updates weights from disk: save the state dict with save_pretrained "
                "and pass the directory"
            )
        was_paused = self._paused
        if not was_paused:
            await self.pause()
        try:
            payload = {
                "model_path": os.fspath(source),
                "load_format": None,
                "abort_all_requests": False,
                "weight_version": str(version),
                "flush_cache": False,
            }
            results = await asyncio.gather(
                *(self._request(i, "POST", "/update_weights_from_disk", payload) for i in range(len(self.urls))),
                return_exceptions=True,
            )
            failures = [
                f"{url}: {reason}"
                for url, result in zip(self.urls, results, strict=True)
                if (reason := _update_failure(result))
            ]
            await asyncio.gather(*(self._flush(i) for i in range(len(self.urls))))
            if not failures:
                self._version = version
        finally:
            if not was_paused:
                await self.resume()
        if failures:
            raise SGLangError("weight update failed on " + "; ".join(failures))

    async def _flush(self, server: int) -> None:
        """POST /flush_cache until it succeeds (it answers 400 while requests are still running)."""
        status = None
        for _ in range(_FLUSH_ATTEMPTS):
            try:
                status, _ = await self._request(server, "POST", "/flush_cache")
            except _Transient as e:
                raise SGLangError(str(e)) from None
            if status == 200:
                return
            await asyncio.sleep(0.5)
        raise SGLangError(f"{self.urls[server]}: /flush_cache kept answering {status}")

    def stats(self) -> dict[str, Any]:
        """Load and event counts: requests in flight per server, pinned rids, retries, resubmissions."""
        return {
            "in_flight": dict(zip(self.urls, self.in_flight, strict=True)),
            "pinned_rids": len(self._sticky),
            "version": self._version,
            "paused": self._paused,
            **self.counters,
        }

    async def close(self) -> None:
        """Close the HTTP session (the servers keep running)."""
        await self._sessions.close()


def _payload(input_ids: list[int], sampling: SamplingParams, rid: str) -> dict[str, Any]:
    """A /generate body with every sampling field explicit (SGLang >= 0.5.5 defaults unset ones from the model)."""
    body: dict[str, Any] = {
        "input_ids": input_ids,
        "sampling_params": sampling.to_sglang(),
        "return_logprob": True,
        "logprob_start_len": -1,
    }
    if rid:
        body["rid"] = rid
    return body


def _update_failure(result: Any) -> str | None:
    """Why one server's /update_weights_from_disk failed, or None if it succeeded."""
    if isinstance(result, BaseException):
        return f"{type(result).__name__}: {result}"
    _, body = result
    if isinstance(body, dict) and body.get("success") is True:
        return None
    return str(body.get("message") if isinstance(body, dict) else body)[:500]


# ---- launching SGLang ------------------------------------------------------------------------------------


def sglang_launch_command(
    model_path: str | os.PathLike,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    tp_size: int = 1,
    mem_fraction_static: float = 0.8,
    dtype: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv of `python -m sglang.launch_server` for one server (run with this interpreter)."""
    command = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        os.fspath(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--tp-size",
        str(tp_size),
        "--mem-fraction-static",
        str(mem_fraction_static),
    ]
    if dtype is not None:
        command += ["--dtype", dtype]
    return command + list(extra_args)


class SGLangServer:
    """One server process started from a command line (SGLang's by default), polled until ready, then stopped."""

    def __init__(
        self,
        command: Sequence[str],
        url: str,
        *,
        gpu_ids: Sequence[int] | None = None,
        log_path: str | os.PathLike | None = None,
    ) -> None:
        self.command = list(command)
        self.url = _base_url(url)
        self.gpu_ids = None if gpu_ids is None else list(gpu_ids)
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen | None = None

    @classmethod
    def for_model(
        cls,
        model_path: str | os.PathLike,
        *,
        host: str = "127.0.0.1",
        port: int = 30000,
        gpu_ids: Sequence[int] | None = None,
        log_path: str | os.PathLike | None = None,
        **launch_kwargs: Any,
    ) -> SGLangServer:
        """An SGLang server for `model_path` on host:port (see sglang_launch_command for launch_kwargs)."""
        command = sglang_launch_command(model_path, host=host, port=port, **launch_kwargs)
        return cls(command, f"{host}:{port}", gpu_ids=gpu_ids, log_path=log_path)

    def start(self) -> SGLangServer:
        """Start the process in its own process group, its output to the log file (a new temp file by default)."""
        env = dict(os.environ)
        if self.gpu_ids is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpu_ids)
        if self.log_path is None:
            self.log_path = Path(tempfile.mkdtemp(prefix="sglang-server-")) / "server.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return self

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:] if self.log_path else ""
        except OSError:
            return ""

    def _check_alive(self) -> None:
        """Raise with the log tail if the process has exited."""
        if self.process is None:
            raise RuntimeError("SGLangServer.start() was not called")
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(
                f"server process exited with code {code} before becoming ready; log tail:\n{self.log_tail()}"
            )

    async def wait_ready(self, timeout: float = 600) -> None:
        """Poll /health_generate until 200; raise with the log tail if the process dies or time runs out."""
        async with aiohttp.ClientSession() as session:
            try:
                await wait_until_ready(session, self.url, timeout, alive=self._check_alive)
            except TimeoutError as e:
                raise TimeoutError(f"{e}; log tail:\n{self.log_tail()}") from None

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM the process group, SIGKILL it if alive after `timeout`; the exit code (None if never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.wait()
