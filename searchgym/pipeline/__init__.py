"""The product's pipeline: the quickstart's stages (world, demonstrations, base model, warm start, RL, evaluation)
and their config, run once by `searchgym quickstart` and once per seed by `searchgym bench learning`."""
