"""REINFORCE on a searchgym environment with nothing but Gymnasium, torch and transformers.

A single-file, CleanRL-style training loop for a causal LM acting as a search agent:

    searchgym model tiny --out runs/tiny-model          # or any local Hugging Face chat model directory
    python examples/reinforce.py --model runs/tiny-model \
        --env-kwargs '{"size": 1000, "n_tasks": 200}' --iterations 20 --episodes-per-iteration 8

(A hub id such as Qwen/Qwen2.5-0.5B-Instruct works where the hub can be reached or the model is cached.)

Each episode is a chat: the env's first observation (instructions + question) is the user message,
every model turn (sampled until `</search>`, `</access>` or `</answer>`) is sent to `env.step`, and
the tool result comes back as the next user message. The conversation is kept as token ids, so the
log-probabilities are recomputed on exactly the tokens that were sampled. The loss is
-(R - mean R) * sum log pi(generated tokens), averaged over the batch of episodes.
Nothing from searchgym is imported: `gym.make("searchgym:...")` imports the package that registers the id.
torch and transformers are imported after the arguments are parsed, so `--help` answers at once.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

STOP_STRINGS = ["</search>", "</access>", "</answer>"]
PLACEHOLDER = "<<assistant-turn>>"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="Hugging Face model directory or hub id")
    p.add_argument("--env-id", default="searchgym:searchgym/SyntheticQA-v0")
    p.add_argument("--env-kwargs", default="{}", help="JSON object passed to gym.make")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--episodes-per-iteration", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=256, help="per turn")
    p.add_argument("--max-turns", type=int, default=8, help="turn cap per episode (also the env's turn budget)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--save", default=None, help="directory to save the trained model and tokenizer to")
    return p.parse_args(argv)


@dataclass
class Episode:
    """One played episode: the whole conversation as token ids, which of them the model sampled, the return."""

    ids: list[int]
    generated: list[bool]
    ret: float
    turns: int


def chat_prefix(tokenizer: PreTrainedTokenizerBase, obs: str) -> list[int]:
    """Token ids of the first user message followed by the assistant generation prompt."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": obs}], tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def turn_suffix(tokenizer: PreTrainedTokenizerBase, obs: str, end_text: str) -> list[int]:
    """Token ids that close the assistant turn, add `obs` as a user message and open the next assistant turn.

    The text is cut from the chat template rendered around a placeholder assistant message, so the
    sampled tokens are never re-tokenized (templates that rewrite past turns, like Qwen3's, work too).
    """
    messages = [
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": PLACEHOLDER},
        {"role": "user", "content": obs},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    suffix = text[text.index(PLACEHOLDER) + len(PLACEHOLDER) :]
    if end_text and suffix.startswith(end_text):  # the model already ended its turn with an eos token
        suffix = suffix[len(end_text) :]
    return tokenizer(suffix, add_special_tokens=False)["input_ids"]


def play(
    env: gym.Env, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, args: argparse.Namespace, seed: int | None
) -> Episode:
    """Play one episode: sample a turn, step the env with its text, append the observation, repeat."""
    import torch

    with torch.no_grad():
        return _play(env, model, tokenizer, args, seed)


def _play(
    env: gym.Env, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, args: argparse.Namespace, seed: int | None
) -> Episode:
    import torch

    obs, _ = env.reset(seed=seed)
    ids = chat_prefix(tokenizer, obs)
    generated = [False] * len(ids)
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos) if isinstance(eos, list) else {tokenizer.eos_token_id if eos is None else eos}
    ret, turn = 0.0, 0
    for turn in range(1, args.max_turns + 1):  # turn is returned after the loop  # noqa: B007
        input_ids = torch.tensor([ids], device=args.device)
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=True,
            temperature=args.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=args.max_new_tokens,
            stop_strings=STOP_STRINGS,
            tokenizer=tokenizer,
            pad_token_id=tokenizer.pad_token_id,
        )
        new = out[0, input_ids.shape[1] :].tolist()  # exactly the sampled ids (batch of one: no padding)
        ids += new
        generated += [True] * len(new)
        end_text = tokenizer.decode(new[-1:]) if new and new[-1] in eos_ids else ""
        action = tokenizer.decode(new, skip_special_tokens=True)
        obs, reward, terminated, truncated, _ = env.step(action)
        ret += float(reward)
        if terminated or truncated:
            break
        suffix = turn_suffix(tokenizer, obs, end_text)
        ids += suffix
        generated += [False] * len(suffix)
    return Episode(ids, generated, ret, turn)


def sequence_logprob(model: PreTrainedModel, episode: Episode, args: argparse.Namespace) -> torch.Tensor:
    """Sum of log pi(token) over the sampled tokens, with grad, at the sampling temperature."""
    import torch

    ids = torch.tensor([episode.ids], device=args.device)
    mask = torch.tensor(episode.generated[1:], device=args.device)  # token t+1 is predicted at position t
    logits = model(input_ids=ids).logits[0, :-1][mask].float() / args.temperature
    targets = ids[0, 1:][mask]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).sum()


def main(argv: list[str] | None = None) -> list[dict]:
    """Train with REINFORCE; print and return one stats dict per iteration."""
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    env_kwargs = json.loads(args.env_kwargs)
    env_kwargs.setdefault("max_turns", args.max_turns)
    env = gym.make(args.env_id, **env_kwargs)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    stats: list[dict] = []
    seed: int | None = args.seed  # seed the env's task draws once; later resets continue its random stream
    for iteration in range(1, args.iterations + 1):
        start = time.perf_counter()
        model.eval()
        episodes = []
        for _ in range(args.episodes_per_iteration):
            episodes.append(play(env, model, tokenizer, args, seed))
            seed = None
        baseline = sum(e.ret for e in episodes) / len(episodes)

        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        for episode in episodes:  # one backward per episode keeps memory at one conversation
            advantage = episode.ret - baseline
            if abs(advantage) < 1e-8:
                continue  # no learning signal (e.g. every episode got the same reward)
            loss = -advantage * sequence_logprob(model, episode, args) / len(episodes)
            loss.backward()
            loss_total += loss.item()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm))
        if grad_norm > 0.0 and math.isfinite(grad_norm):
            optimizer.step()

        row = {
            "iteration": iteration,
            "mean_reward": baseline,
            "loss": loss_total,
            "grad_norm": grad_norm,
            "mean_turns": sum(e.turns for e in episodes) / len(episodes),
            "generated_tokens": sum(sum(e.generated) for e in episodes),
            "seconds": time.perf_counter() - start,
        }
        stats.append(row)
        print(
            f"iter {iteration:4d}  mean_reward {baseline:.3f}  loss {loss_total:+.4f}  grad_norm {grad_norm:.3f}  "
            f"turns {row['mean_turns']:.2f}  tokens {row['generated_tokens']}  {row['seconds']:.1f}s",
            flush=True,
        )

    env.close()
    if args.save:
        model.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)
    return stats


if __name__ == "__main__":
    main()
