"""Floor 4: ASearcher's QA-synthesis agent over any linked corpus and chat model, its prompts, and the pool
driver that writes its questions into a resumable task pool (the synthetic world itself lives in `world/`)."""
