"""The ground floor: shared I/O every room may use (atomic files, JSONL logs, extras checks, LLM-call retries,
the HTTP session and server limits, ports, hashing). Imports only the standard library and third-party packages."""
