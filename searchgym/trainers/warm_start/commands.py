"""`searchgym sft` and `searchgym model tiny`: their settings (the commands' flags are these fields) and what each
runs."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchgym.settings import load_settings, setting


@dataclass
class SFTSettings:
    """`model` fine-tuned on the chat demonstrations in `data`, written to `out`: the warm start before RL."""

    data: str = setting(help="JSONL rows with 'messages' (searchgym demos, trajectory dumps)")
    model: str = setting(help="a Hugging Face model directory")
    out: str = setting(help="the trained model's directory")
    epochs: float = setting(3.0, help="passes over the demonstrations")
    lr: float = setting(1e-3, help="learning rate")
    batch_tokens: int = setting(16_384, help="tokens (padded) per optimizer step")
    seed: int = setting(0, help="the data order's and the init's seed")
    device: str = setting("cpu", help="cpu or cuda")


def run_sft(settings: SFTSettings) -> None:
    from searchgym.trainers.warm_start.sft import SFTConfig, load_demonstrations, sft

    knobs = ("epochs", "lr", "batch_tokens", "seed")
    config = load_settings(SFTConfig, values={key: getattr(settings, key) for key in knobs})
    history = sft(settings.model, load_demonstrations(settings.data), settings.out, config, device=settings.device)
    print(json.dumps({"steps": len(history), "final": history[-1], "out": str(settings.out)}, indent=2))


@dataclass
class TinyModelSettings:
    """A tiny Qwen2 model and BPE tokenizer trained on the synthetic world (copy-pretrained if `copy_steps`)."""

    out: Path = setting(help="the model's directory")
    hidden: int = setting(64, at_least=1, help="hidden size")
    layers: int = setting(2, at_least=1, help="transformer layers")
    vocab: int = setting(2048, at_least=1, help="vocabulary size (at most)")
    seed: int = setting(0, help="the model's and its tokenizer's seed")
    copy_steps: int = setting(
        0, at_least=0, help="copy-pretraining steps (in-context copying, before SFT/RL; 600 learns it at --hidden 128)"
    )


def build_tiny(settings: TinyModelSettings) -> None:
    from searchgym.agents.tiny_model import TinyShape, build_tiny_model

    sizes: dict[str, Any] = {
        "hidden_size": settings.hidden,
        "num_layers": settings.layers,
        "vocab_size": settings.vocab,
    }
    if not settings.copy_steps:
        print(f"tiny Qwen2 model written to {build_tiny_model(settings.out, TinyShape(**sizes), seed=settings.seed)}")
        return
    from searchgym.trainers.warm_start.copy_pretrain import CopyPretrainConfig, copy_pretrain

    copy = load_settings(CopyPretrainConfig, values={"steps": settings.copy_steps, "seed": settings.seed})
    with tempfile.TemporaryDirectory() as tmp:  # a model that will be trained starts from a small init (0.02)
        shape = TinyShape(intermediate_size=3 * settings.hidden, init_std=0.02, **sizes)
        fresh = build_tiny_model(Path(tmp) / "fresh", shape, seed=settings.seed)
        history = copy_pretrain(fresh, settings.out, copy)
    print(
        f"tiny Qwen2 model written to {settings.out}; copy accuracy after {settings.copy_steps} copy-pretraining "
        f"steps: {history[-1]['copy_accuracy']:.3f}"
    )
