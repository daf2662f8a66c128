"""The ground floor: shared I/O every room may use (atomic files, JSONL logs, file locks and hashes, extras checks,
LLM-call retries and the per-call cost meter, the HTTP session, server limits, ports). Imports only the standard
library and third-party packages; the floors and what each may import: docs/architecture.md."""
