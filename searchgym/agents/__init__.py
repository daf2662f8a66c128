"""Floor 3: tool-call formats, inference engines (torch, SGLang, OpenAI) and the model server, rollout
workflows with context management, the env pool, trajectories, scripted agents and the tiny test model."""
