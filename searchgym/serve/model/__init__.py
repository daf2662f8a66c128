"""`searchgym serve model`: a TorchEngine behind SGLang's native HTTP API (0.5.23) and OpenAI's.

Files by job: `core.py` holds the engine and the state both APIs share (pause gate, bounded slots,
request ids in flight, weight-version labels); `sglang_api.py` the native routes; `openai_api.py`
the OpenAI routes (chat through `searchgym.agents.chat.EngineChat`); `app.py` the application,
its lifecycle and the command line (`python -m searchgym.serve.model --model-path DIR`).
"""

from searchgym.serve.model.app import create_app, main, run_server, serving
from searchgym.serve.settings import ModelServerSettings

__all__ = ["ModelServerSettings", "create_app", "main", "run_server", "serving"]
