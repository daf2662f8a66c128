"""The `searchgym bench` measurements only: one module per subcommand (env, engine, search, trainer, learner,
learning, reliability, load, gpu) and its helpers; what they run lives in the rooms below (pipeline, testing)."""
