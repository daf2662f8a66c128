"""Copy pretraining: the sequences teach nothing but copying, and training runs on the real tiny model."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from searchgym.trainers.warm_start.copy_pretrain import CopyPretrainConfig, copy_batch, copy_pretrain


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), lo=st.integers(2, 6), extra=st.integers(0, 10), gap=st.integers(0, 8))
def test_the_loss_is_exactly_on_the_predictable_part_of_the_repeat(seed, lo, extra, gap):
    vocabulary = list(range(3, 400))
    config = CopyPretrainConfig(batch_size=8, min_segment=lo, max_segment=lo + extra, max_gap=gap)
    ids, attention, mask = copy_batch(random.Random(seed), vocabulary, config, pad_id=0)
    for row in range(ids.shape[0]):
        length = int(attention[row].sum())
        assert attention[row, :length].all() and not attention[row, length:].any()  # right padding
        sequence, learned = ids[row, :length].tolist(), mask[row, :length].tolist()
        n = sum(learned) + 1  # the segment: the learned tokens plus the repeat's first token
        assert lo <= n <= lo + extra and learned[-(n - 1) :] == [1] * (n - 1) and sum(learned[: length - n + 1]) == 0
        assert sequence[-n:] in [sequence[i : i + n] for i in range(length - 2 * n + 1)]  # it did appear before
        assert len(sequence) - 2 * n <= 2 * gap and set(sequence) <= set(vocabulary)
        assert not mask[row, length:].any()


def test_copy_pretraining_trains_and_saves_a_loadable_model(tiny_model_dir, tmp_path):
    config = CopyPretrainConfig(steps=30, batch_size=16, lr=3e-3, warmup_steps=5, max_segment=8, max_gap=4)
    history = copy_pretrain(tiny_model_dir, tmp_path / "copy", config, progress=False)
    assert len(history) == 30 and all(0.0 <= h["copy_accuracy"] <= 1.0 for h in history)
    first, last = (sum(h["loss"] for h in part) / 5 for part in (history[:5], history[-5:]))
    assert last < first  # it learns (the copying phase change itself needs a few hundred steps: see the module)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "copy")
    assert AutoTokenizer.from_pretrained(tmp_path / "copy").eos_token == "<|im_end|>"
    assert model.config.vocab_size > 0 and (tmp_path / "copy" / "copy_pretrain_history.jsonl").exists()


def test_the_bar_carries_the_stage_label_and_hugging_face_draws_none(tiny_model_dir, tmp_path, capfd):
    """The quickstart names this bar by its stage ("stage 3 of 6: base model"); loading the model and saving it drew
    Hugging Face's own "Loading weights" and "Writing model shards" bars besides."""
    config = CopyPretrainConfig(steps=2, batch_size=2, max_segment=4, max_gap=2)
    copy_pretrain(tiny_model_dir, tmp_path / "copy", config, progress=True, progress_label="stage 3 of 6: base model")
    err = capfd.readouterr().err
    assert "stage 3 of 6: base model: 100%" in err and "copy pretraining" not in err
    assert "Loading weights" not in err and "Writing model shards" not in err
