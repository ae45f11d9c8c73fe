import csv
import json
import warnings

import pytest

from arealite.api.config.dataset import DatasetConfig
from arealite.dataset.loader import create_dataloader, load_rows


def _ids(batches):
    return [r["id"] for b in batches for r in b]


def test_local_formats(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(5)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "d.json").write_text(json.dumps(rows))
    with open(tmp_path / "d.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["question", "answer"])
        w.writeheader()
        w.writerows(rows)
    for ext in ("jsonl", "json", "csv"):
        got = load_rows(DatasetConfig(path=str(tmp_path / f"d.{ext}")))
        assert [r["question"] for r in got] == [r["question"] for r in rows]
        assert [r["id"] for r in got] == list(range(5))


def test_missing_and_bad(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_rows(DatasetConfig(path=str(tmp_path / "nope.jsonl")))
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError):
        load_rows(DatasetConfig(path=str(tmp_path / "bad.json")))
    # #37: a malformed line is named by file and line (blank lines counted), as is a non-object
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n\n{"a": 2,}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:3: not valid JSON"):
        load_rows(DatasetConfig(path=str(tmp_path / "bad.jsonl")))
    (tmp_path / "list.jsonl").write_text('{"a": 1}\n[1]\n')
    with pytest.raises(ValueError, match=r"list.jsonl:2: a row must be a JSON object, got list"):
        load_rows(DatasetConfig(path=str(tmp_path / "list.jsonl")))
    (tmp_path / "broken.json").write_text('[\n{"a": 1},\n{"a" 2}\n]')
    with pytest.raises(ValueError, match=r"broken.json:3: not valid JSON"):
        load_rows(DatasetConfig(path=str(tmp_path / "broken.json")))


def test_stateful_loader_resumes_mid_epoch(toy_data_dir):
    cfg = DatasetConfig(path=str(toy_data_dir / "train.jsonl"), batch_size=8)
    rows = load_rows(cfg)
    full = list(create_dataloader(rows, cfg, seed=3))
    dl = create_dataloader(rows, cfg, seed=3)
    it = iter(dl)
    first = [next(it) for _ in range(4)]
    state = dl.state_dict()
    dl2 = create_dataloader(rows, cfg, seed=3)
    dl2.load_state_dict(state)
    rest = list(dl2)
    assert _ids(first + rest) == _ids(full)
    assert len(set(_ids(full))) == len(_ids(full))


def test_sharding_over_ranks(toy_data_dir):
    cfg = DatasetConfig(path=str(toy_data_dir / "train.jsonl"), batch_size=8)
    rows = load_rows(cfg)
    r0 = _ids(create_dataloader(rows, cfg, seed=1, rank=0, world_size=2))
    r1 = _ids(create_dataloader(rows, cfg, seed=1, rank=1, world_size=2))
    assert not set(r0) & set(r1)
    with pytest.raises(ValueError):
        create_dataloader(rows, DatasetConfig(path="x", batch_size=3), world_size=2)


def test_building_and_resuming_a_loader_prints_no_warning(toy_data_dir):
    # a trainer's log shows what the run did; a third-party deprecation notice in every one of
    # them (torchdata calling torch.set_vital) is noise a user cannot act on
    cfg = DatasetConfig(path=str(toy_data_dir / "train.jsonl"), batch_size=8)
    rows = load_rows(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dl = create_dataloader(rows, cfg, seed=3)
        it = iter(dl)
        next(it)
        dl2 = create_dataloader(rows, cfg, seed=3)
        dl2.load_state_dict(dl.state_dict())
        assert len(list(dl2)) == len(rows) // 8 - 1
