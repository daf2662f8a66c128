"""The harness judges each answer once: where an eval judge is the env's own reference judge, the env's verdict
is used as it is, and the stored verdicts are the same as judging again would give."""

import asyncio
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.envs.judges import FormatGate, TokenF1, make_judge
from searchgym.eval.harness import env_verdicts, eval_judge, judge_all

words = st.lists(
    st.sampled_from(["the", "Paris", "paris", "France", "a", "city", "1889", "Eiffel", "!"]), max_size=6
).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(prediction=words, answers=st.lists(words, min_size=1, max_size=3), env_spec=st.sampled_from(["f1", "em"]))
def test_the_env_verdict_stands_for_the_same_judge_and_matches_judging_again(prediction, answers, env_spec):
    env_judge = make_judge(env_spec)
    verdict = asyncio.run(env_judge.ajudge(prediction, answers, question="q?")).to_dict()
    judges = eval_judge("em,f1,cover_em")
    known = env_verdicts(env_judge, judges, verdict)
    assert known == {env_spec: verdict}
    fresh = asyncio.run(judge_all(judges, prediction, answers, "q?"))

    def asked_again(*args, **kwargs):
        raise AssertionError(f"the {env_spec} judge was asked again")

    with mock.patch.object(type(env_judge), "ajudge", asked_again):
        reused = asyncio.run(judge_all(judges, prediction, answers, "q?", known=known))
    assert reused == fresh and list(reused) == ["em", "f1", "cover_em"]


def test_other_env_judges_are_not_reused():
    verdict = asyncio.run(TokenF1().ajudge("Paris", ["Paris"])).to_dict()
    judges = eval_judge("em,f1")
    assert env_verdicts(FormatGate(TokenF1()), judges, verdict) == {}  # its call depends on the episode's format
    assert env_verdicts(make_judge("em,f1"), judges, verdict) == {}  # a composite's verdict is the primary's
    assert env_verdicts(TokenF1(), eval_judge("em,cover_em"), verdict) == {}  # no eval judge of that kind
    assert env_verdicts(TokenF1(), judges, None) == {}  # no answer: judge_all scores it 0 for every judge
