"""Floor 2: engines, tool-call formats, the episode runner, the LLM judge and scripted agents."""
