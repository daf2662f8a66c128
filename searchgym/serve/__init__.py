"""Every server searchgym runs, one module (or package) each, with one command-line front end generated from its
settings dataclass (`searchgym serve model|search|env|mcp`):

- `model/`: a TorchEngine behind SGLang's native HTTP API and OpenAI's (`serve model`, also
  `python -m searchgym.serve.model`); `model/dist_weights.py` is both ends of a weight update's process group.
- `proxy.py`: the recording proxy an agent program's `openai` client talks to; `program.py` plays such programs
  as a Workflow through it.
- `retrieval.py`: an index behind the Search-R1/ASearcher retrieval API (`serve search`).
- `env_host.py`: an env id as an OpenEnv environment server (`serve env`; the client is integrations/openenv.py).
- `mcp.py`: an env id's tools as an MCP server (`serve mcp`).
- `limits.py` (ServerLimits and their flags), `guarded_site.py` (aiohttp), `asgi_limits.py` (uvicorn) and
  `http.py` (serving an app, request bodies, errors, signals): what every server shares.

Floor 3.5 (tests/test_import_direction.py): above agents (the model server serves its engines) and below the
trainers and eval, which play agent programs and sync weights through it.
"""
