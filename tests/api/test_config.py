from pathlib import Path

import pytest

from arealite.api.config.experiment import GRPOConfig, SFTConfig
from arealite.api.config.loader import (
    CONFIG_CLASSES,
    ConfigError,
    apply_overrides,
    load_config,
    to_yaml,
)
from arealite.api.config.rollout import GenerationHyperparameters

CONFIGS = sorted(Path(__file__).parents[2].joinpath("configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert isinstance(cfg, tuple(CONFIG_CLASSES.values()))
    # Round trip: the printed YAML loads back to the same tree.
    import yaml

    assert type(cfg).model_validate(yaml.safe_load(to_yaml(cfg))) == cfg


def test_overrides_are_typed_and_nested(tmp_path):
    cfg = load_config(CONFIGS[0], ["actor.optimizer.lr=1e-5", "rollout.server_addrs=[a:1,b:2]"])
    assert cfg.actor.optimizer.lr == pytest.approx(1e-5)
    assert cfg.rollout.server_addrs == ["a:1", "b:2"]


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("actor.no_such_key=1", "unknown key 'actor.no_such_key'"),
        ("actor.optimizr.lr=1", "did you mean: optimizer"),
        ("actor.eps_clip=abc", "bad value for 'actor.eps_clip'"),
        ("gconfig.top_p=0", "gconfig.top_p"),
        ("gconfig.top_k=0", "top_k"),
        ("actor.c_clip=0.5", "c_clip"),
        ("noequals", "key=value"),
        ("kind=ppo", "unknown kind"),
    ],
)
def test_bad_input_names_the_key(override, fragment):
    with pytest.raises(ConfigError, match=None) as e:
        load_config(CONFIGS[0], [override])
    assert fragment in str(e.value)


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="group_size"):
        load_config(None, ["actor.group_size=4", "gconfig.n_samples=2"])
    with pytest.raises(ConfigError, match="ref"):
        load_config(None, ["actor.kl_ctl=0.1"])
    with pytest.raises(ConfigError, match="recompute_logprob"):
        load_config(None, ["actor.recompute_logprob=false"])
    for bad in ("actor.adv_estimator=grpo", "recover.mode=auto"):  # a critic's values need gae
        with pytest.raises(ConfigError, match="critic"):
            load_config(None, ["critic.optimizer.lr=1e-3", bad])
    assert load_config(None, ["critic.optimizer.lr=1e-3"]).critic.optimizer.lr == 1e-3


def test_every_field_has_a_description():
    from pydantic import BaseModel

    seen, stack = set(), [GRPOConfig, SFTConfig]
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        for name, f in m.model_fields.items():
            subs = [a for a in (f.annotation, *getattr(f.annotation, "__args__", ()))
                    if isinstance(a, type) and issubclass(a, BaseModel)]
            stack.extend(subs)
            assert subs or f.description, f"{m.__name__}.{name} has no description"


def test_generation_new_validates():
    g = GenerationHyperparameters(max_new_tokens=8)
    assert g.new(temperature=0.5).temperature == 0.5 and g.temperature == 1.0
    with pytest.raises(ValueError):
        g.new(min_new_tokens=9)


def test_apply_overrides_creates_sections():
    assert apply_overrides({}, ["a.b.c=3"]) == {"a": {"b": {"c": 3}}}


def test_config_docs_are_current():
    from arealite.cli.gen_config_docs import render

    doc = Path(__file__).parents[2] / "docs" / "config.md"
    assert doc.read_text() == render(), "run `make docs` to regenerate docs/config.md"


def test_every_config_field_has_a_description():
    """docs/config.md is generated from these: a field without one is undocumented."""
    import importlib
    import inspect
    import pkgutil

    import pydantic

    import arealite.api.config as package

    modules = [importlib.import_module(f"{package.__name__}.{m.name}")
               for m in pkgutil.iter_modules(package.__path__)]

    missing, seen = [], set()

    def walk(model):
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(f"{model.__name__}.{name}")
            for t in (field.annotation, *getattr(field.annotation, "__args__", ())):
                if inspect.isclass(t) and issubclass(t, pydantic.BaseModel):
                    walk(t)

    for c in modules:
        for obj in vars(c).values():
            if inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel) and obj.__module__ == c.__name__:
                walk(obj)
    assert not missing, missing
