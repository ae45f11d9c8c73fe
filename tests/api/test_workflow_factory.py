import asyncio
import functools
import re
import sys
from pathlib import Path

import pytest
import yaml

from arealite.api.config.experiment import GRPOConfig
from arealite.api.config.loader import load_config
from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.config.workflow import WorkflowConfig
from arealite.api.workflow_factory import (
    WorkflowImportError,
    build_workflow,
    import_by_path,
    load_reward_fn,
)
from tests.support.wf_checks import assert_trajectory
from workflows.math import MathRLVRWorkflow
from workflows.multi_turn import MultiTurnWorkflow
from workflows.rewards.combine import WeightedSum
from workflows.rewards.format import FormatReward
from workflows.rewards.toy import toy_reward
from workflows.rlvr import RLVRWorkflow

DOC = Path(__file__).resolve().parents[2] / "docs" / "custom_workflow.md"
G = GenerationHyperparameters(n_samples=2, max_new_tokens=4)
ROW = {"id": 3, "question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}
RLVR = "workflows.rlvr:RLVRWorkflow"
TOY = {"path": RLVR, "reward_fn": "workflows.rewards.toy:toy_reward"}  # as configs/toy_grpo.yaml


def test_toy_config_builds_rlvr_with_toy_reward(tiny_tokenizer):
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "toy_grpo.yaml")
    wf = build_workflow(cfg.workflow, cfg.gconfig, tiny_tokenizer)
    assert type(wf) is RLVRWorkflow and wf.reward_fn is toy_reward


def test_no_default_workflow_or_reward(tiny_tokenizer):
    """The API names no workflow: the config must, and a reward where the workflow needs one."""
    with pytest.raises(WorkflowImportError, match="workflow.path is not set"):
        build_workflow(GRPOConfig().workflow, G, tiny_tokenizer)
    with pytest.raises(WorkflowImportError, match="workflow.reward_fn is not set"):
        build_workflow(WorkflowConfig(path=RLVR), G, tiny_tokenizer)


@pytest.mark.parametrize("path,match", [
    ("workflows.rlvr.RLVRWorkflow", "must look like"),
    ("workflows.rlvr:", "must look like"),
    ("no_such_pkg.mod:Thing", "cannot import module 'no_such_pkg.mod'"),
    ("workflows.rlvr:NoSuchWorkflow", "has no attribute 'NoSuchWorkflow'"),
    ("tests.support.wf_custom_example:NotAWorkflow", "not a RolloutWorkflow"),
])
def test_bad_workflow_paths(path, match, tiny_tokenizer):
    with pytest.raises(WorkflowImportError, match=re.escape(match)):
        build_workflow(WorkflowConfig(path=path), G, tiny_tokenizer)


def test_bad_reward_paths_and_kwargs(tiny_tokenizer):
    with pytest.raises(WorkflowImportError, match="reward_fn path"):
        build_workflow(WorkflowConfig(path=RLVR, reward_fn="workflows.rewards.toy:nope"), G, tiny_tokenizer)
    with pytest.raises(TypeError, match=r"does not accept \['colour'\]"):
        build_workflow(WorkflowConfig(**TOY, kwargs={"colour": "red"}), G, tiny_tokenizer)
    with pytest.raises(ValueError, match="mapping"):
        build_workflow(WorkflowConfig(**TOY, kwargs={"reward_kwargs": 3}), G, tiny_tokenizer)


def test_reward_kwargs_and_reward_classes(tiny_tokenizer):
    wf = build_workflow(WorkflowConfig(path=RLVR, reward_fn="workflows.rewards.math:math_reward",
                                       kwargs={"reward_kwargs": {"timeout_seconds": 2}}), G, tiny_tokenizer)
    assert isinstance(wf.reward_fn, functools.partial) and wf.reward_fn.keywords == {"timeout_seconds": 2}
    fmt = load_reward_fn("workflows.rewards.format:FormatReward", {"style": "boxed"})
    assert isinstance(fmt, FormatReward) and fmt.style == "boxed"
    assert import_by_path("workflows.rewards.combine:WeightedSum") is WeightedSum


def test_shipped_workflows_by_path(tiny_tokenizer):
    mt = build_workflow(WorkflowConfig(path="workflows.multi_turn:MultiTurnWorkflow",
                                       reward_fn=TOY["reward_fn"],
                                       kwargs={"max_turns": 3, "turn_discount": 0.5}), G, tiny_tokenizer)
    assert isinstance(mt, MultiTurnWorkflow) and mt.max_turns == 3
    m = build_workflow(WorkflowConfig(path="workflows.math:MathRLVRWorkflow", reward_fn="",
                                      kwargs={"format_weight": 0.1}), G, tiny_tokenizer)
    assert isinstance(m, MathRLVRWorkflow) and isinstance(m.reward_fn, WeightedSum)


def test_custom_workflow_from_test_module_runs(local_engine, tiny_tokenizer):
    cfg = WorkflowConfig(path="tests.support.wf_custom_example:TargetLengthWorkflow",
                         kwargs={"target_len": 2})
    wf = build_workflow(cfg, G, tiny_tokenizer)  # it takes no reward_fn: none is passed
    traj = asyncio.run(wf.arun_episode(local_engine, dict(ROW)))
    assert_trajectory(traj, 2)
    assert (traj["rewards"] == -(traj["loss_mask"].sum(1) - 2).abs().float()).all()


def _doc_blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_documented_example_runs_end_to_end(tmp_path, monkeypatch, local_engine, tiny_tokenizer):
    code = next(b for b in _doc_blocks("python") if b.startswith("# my_workflows.py"))
    (tmp_path / "my_workflows.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg_yaml = next(b for b in _doc_blocks("yaml") if "my_workflows:ConciseWorkflow" in b)
    wcfg = WorkflowConfig(**yaml.safe_load(cfg_yaml)["workflow"])
    wcfg = wcfg.model_copy(update={"reward_fn": "workflows.rewards.toy:toy_reward", "kwargs": {
        "length_penalty": 0.05, "drop_uniform_groups": False}})
    wf = build_workflow(wcfg, GenerationHyperparameters(n_samples=3, max_new_tokens=5), tiny_tokenizer)
    traj = asyncio.run(wf.arun_episode(local_engine, dict(ROW)))
    assert_trajectory(traj, 3)
    assert traj["sample_ids"].tolist() == [3, 3, 3]
    # the random tiny model never answers right: reward is exactly minus the length penalty
    expected = -0.05 * traj["loss_mask"].sum(1).float() / 5
    assert traj["rewards"].tolist() == pytest.approx(expected.tolist())
    # and with the group filter on, a uniform group is rejected
    wf.drop_uniform_groups = True
    wf.length_penalty = 0.0
    assert asyncio.run(wf.arun_episode(local_engine, dict(ROW))) is None
    sys.modules.pop("my_workflows", None)
