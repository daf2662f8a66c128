"""A custom agent as a rollout workflow: read long pages through the model's own summary.

ASearcher's reasoning agent does not paste a 10,000-character page part into its context: it asks the
model to note what in the page bears on the question, and continues from that note. Here that is
one `observe` override of the stock `TokenWorkflow`; training and evaluation run it unchanged:

    searchgym train --config configs/train-cpu.yaml
    rollout.workflow=examples/summarizing_workflow.py:SummarizingWorkflow
    searchgym eval --env searchgym/SyntheticQA-v0 --engine MODEL_DIR --out runs/eval-summaries \\
        --workflow examples/summarizing_workflow.py:SummarizingWorkflow

The summary is a separate generation (its own prompt, its own request id); the episode's token
sequence holds only the summary as the observation (loss mask 0), so the learner trains the policy's
actions on exactly the context the policy acted in. The raw page part stays in the turn's record.
"""

from __future__ import annotations

import dataclasses
import uuid

from searchgym.agents.engines.types import GenerateRequest
from searchgym.agents.trajectory import Trajectory
from searchgym.agents.workflow import Step, TokenWorkflow
from searchgym.envs.search_env import SearchEnv

SUMMARY_PROMPT = """Question: {question}

From {where}:
{page}

Write down, in a few short sentences, what this part says that helps answer the question."""


class SummarizingWorkflow(TokenWorkflow):
    """TokenWorkflow that replaces each page part longer than `min_chars` by the model's summary of it."""

    summarize_tools = ("access",)  # the tools whose results are summarized (others are read as they are)
    min_chars = 400  # shorter observations are read as they are
    summary_tokens = 48
    max_page_tokens = 1024  # of the page part shown to the summarizer

    async def observe(self, env: SearchEnv, traj: Trajectory, step: Step) -> str:
        if step.info.get("tool") not in self.summarize_tools or len(step.observation) < self.min_chars:
            return step.observation
        page = step.info.get("page") or {}
        where = page.get("url") or step.info.get("url") or "the search results"
        part = self.tokenizer.decode(self.template.encode(step.observation)[: self.max_page_tokens])
        prompt = SUMMARY_PROMPT.format(question=env.task.question, where=where, page=part)
        sampling = dataclasses.replace(self.settings.sampling, max_new_tokens=self.summary_tokens, stop=())
        rid = uuid.uuid4().hex  # a request of its own, never a resumption of the episode's
        response = await self.engine.agenerate(GenerateRequest(self.template.prompt_ids(prompt), sampling, rid))
        summary = self.turn_text(response.output_ids).strip()
        traj.turns[-1].info["summary"] = summary  # what the policy read instead of the page part
        return f"<information>\nNotes on {where}:\n{summary}\n</information>"
