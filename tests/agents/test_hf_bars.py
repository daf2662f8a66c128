"""Hugging Face's "Writing model shards" and "Loading weights" bars stay out of our output; its warnings do not."""

from transformers.utils import logging as hf_logging

from searchgym.agents.engines.torch_engine import TorchEngine
from searchgym.agents.hf_bars import no_hf_bars
from searchgym.agents.tiny_model import build_tiny_model

HF_BARS = ("Writing model shards", "Loading weights")


def test_building_and_loading_a_model_draws_no_hugging_face_bar(tmp_path, capfd):
    """The quickstart printed six of each: every tiny-model build saves, every engine loads."""
    assert hf_logging.is_progress_bar_enabled()  # so Transformers would draw them, were they not turned off
    model_dir = build_tiny_model(tmp_path / "tiny")
    TorchEngine(model_dir)
    err = capfd.readouterr().err
    assert not [bar for bar in HF_BARS if bar in err], err
    assert hf_logging.is_progress_bar_enabled()  # turned off only around our loads and saves


def test_only_the_bars_are_turned_off_and_only_inside(caplog):
    verbosity = hf_logging.get_verbosity()
    with no_hf_bars():
        with no_hf_bars():  # nested (a load inside a save's block): the outer block still ends with them off
            assert not hf_logging.is_progress_bar_enabled()
        assert not hf_logging.is_progress_bar_enabled()
        assert hf_logging.get_verbosity() == verbosity  # warnings stay as they were
        hf_logging.get_logger("transformers").warning("a real warning")
    assert hf_logging.is_progress_bar_enabled()
    assert [r.getMessage() for r in caplog.records if r.name == "transformers"] == ["a real warning"]
    hf_logging.disable_progress_bar()  # a user who turned them off keeps them off
    try:
        with no_hf_bars():
            pass
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()
