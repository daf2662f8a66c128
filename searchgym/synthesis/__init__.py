"""Floor 2-3: the synthetic world, KB-walk QA and its validation oracle; writes task pools."""
