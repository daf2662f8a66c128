"""A run directory's history never destroys a new run, and a damaged checkpoint is one error naming the file."""

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from searchgym.trainers.run.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from searchgym.trainers.run.start import start_run


@pytest.fixture
def run_dir(tmp_path, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for step in (39, 40):
        save_checkpoint(
            tmp_path,
            step,
            model=model,
            tokenizer=tokenizer,
            keep=2,
            state={"step": step, "learner": {"version": step}, "rollouts": [{}]},
        )
    return tmp_path


def snapshot(root):
    return sorted((p.relative_to(root), p.stat().st_size) for p in root.rglob("*") if p.is_file())


def test_a_fresh_run_refuses_a_directory_holding_another_run(run_dir, tiny_model_dir):
    before = snapshot(run_dir)
    with pytest.raises(
        ValueError,
        match=r"already holds a training run \(checkpoints step-00039\.\.step-00040\); "
        r"pass --resume",
    ):
        start_run(run_dir, str(tiny_model_dir), seed=0, resume=False)
    assert snapshot(run_dir) == before  # nothing pruned, nothing overwritten
    resumed = start_run(run_dir, str(tiny_model_dir), seed=0, resume=True)
    assert resumed.first_step == 41 and resumed.checkpoint == latest_checkpoint(run_dir)


@pytest.mark.parametrize("name", ["model.safetensors", "trainer.pt"])
def test_a_truncated_checkpoint_file_is_named(run_dir, name):
    checkpoint = latest_checkpoint(run_dir)
    path = checkpoint / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the disk filled up, or the copy was cut
    with pytest.raises(ValueError, match=rf"{name} is damaged .*resume from an earlier checkpoint"):
        load_trainer_state(checkpoint)
    with pytest.raises(ValueError, match=rf"{name} is damaged"):
        start_run(run_dir, None, seed=0, resume=True)
    path.write_bytes(data)
    assert load_trainer_state(checkpoint)["step"] == 40
