"""Before RL: supervised fine-tuning on demonstrations (sft.py) and copy pretraining of a fresh tiny model."""
