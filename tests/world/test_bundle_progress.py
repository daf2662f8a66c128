"""A world built on an env's first use says what it builds, step by step, when progress was asked for (a fresh
quickstart had given about 55 s of silence here), and nothing otherwise."""

from searchgym.pipeline.stages import make_env

SYN = "searchgym/SyntheticQA-v0"


def test_the_quickstart_s_first_env_shows_each_step_of_the_world_build(tmp_path, capfd):
    kwargs = {"size": 300, "n_tasks": 20, "cache_dir": str(tmp_path)}
    make_env(SYN, kwargs, "train", progress=True)
    err = capfd.readouterr().err
    steps = [
        "building the world once (300 pages, 20 questions); later runs reuse it",
        "world 1/3: writing 300 pages",
        "world: 100%",  # the pages' bar
        "world 2/3: indexing the pages for search",
        "world 3/3: 20 questions, each kept once the oracle answers it",
        "validating tasks: 100%",
        "world built in ",
    ]
    assert all(step in err for step in steps), err
    assert [err.index(step) for step in steps] == sorted(err.index(step) for step in steps)

    make_env(SYN, kwargs, "test", progress=True)  # built: nothing to say
    make_env(SYN, {**kwargs, "seed": 1}, "train")  # a build nobody asked to see is silent
    assert capfd.readouterr().err == ""
