import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from arealite.api.config.experiment import GRPOConfig
from arealite.observe.timing import FreqController
from arealite.utils.recover import (
    MARKER,
    RecoverInfo,
    find_latest,
    list_checkpoints,
    load_recover_info,
    recover_root,
    save_checkpoint,
    should_recover,
    weights_dir,
)

REPO = Path(__file__).resolve().parents[2]


def _info(step: int, **kw) -> RecoverInfo:
    return RecoverInfo(step=step, epoch=0, epoch_step=step, version=step, **kw)


def _write_weights(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "shard0.bin").write_bytes(b"w" * 10)


def test_round_trip_with_real_dataloader_state(tmp_path, toy_data_dir):
    from arealite.api.config.dataset import DatasetConfig
    from arealite.dataset.loader import create_dataloader, load_rows

    cfg = DatasetConfig(path=str(toy_data_dir / "train.jsonl"), batch_size=8, shuffle=True)
    rows = load_rows(cfg)
    full = [[r["id"] for r in b] for b in create_dataloader(rows, cfg, seed=3)]

    dl = create_dataloader(rows, cfg, seed=3)
    it = iter(dl)
    first = [[r["id"] for r in next(it)] for _ in range(5)]
    saver = FreqController(freq_steps=4)
    for _ in range(5):
        saver.check(steps=1)
    info = _info(5, dataloader_state=dl.state_dict(), staleness_state={"accepted": 3, "running": 2},
                 saver_state=saver.state_dict(), stats_logger_step=5, extra={"note": "x"})
    ckpt = save_checkpoint(tmp_path / "recover", info, _write_weights)
    assert ckpt.name == "step00000005" and (weights_dir(ckpt) / "shard0.bin").is_file()

    got = load_recover_info(find_latest(tmp_path / "recover"))
    assert (got.step, got.version, got.staleness_state, got.extra) == (5, 5, info.staleness_state,
                                                                      {"note": "x"})
    dl2 = create_dataloader(rows, cfg, seed=3)
    dl2.load_state_dict(got.dataloader_state)
    rest = [[r["id"] for r in b] for b in dl2]
    assert first + rest == full  # same data order, nothing duplicated or lost
    ctl = FreqController(freq_steps=4)
    ctl.load_state_dict(got.saver_state)
    assert [s for s in range(6, 10) if ctl.check(steps=1)] == [8]


def test_failed_save_leaves_previous_checkpoint_and_is_cleaned_later(tmp_path):
    root = tmp_path / "recover"
    save_checkpoint(root, _info(1), _write_weights)

    def broken(d: Path) -> None:
        _write_weights(d)
        raise OSError("disk full")

    with pytest.raises(OSError):
        save_checkpoint(root, _info(2), broken)
    assert find_latest(root).name == "step00000001"
    assert (root / ".tmp-step00000002").is_dir()  # a half save, never loaded
    save_checkpoint(root, _info(3), _write_weights)
    assert not (root / ".tmp-step00000002").exists()
    assert [d.name for d in list_checkpoints(root)] == ["step00000003"]  # keep=1


def test_keep_and_resave_same_step(tmp_path):
    root = tmp_path / "recover"
    for s in (1, 2, 3):
        save_checkpoint(root, _info(s), _write_weights, keep=2)
    assert [d.name for d in list_checkpoints(root)] == ["step00000002", "step00000003"]
    save_checkpoint(root, _info(3, extra={"again": True}), _write_weights, keep=2)
    assert load_recover_info(find_latest(root)).extra == {"again": True}


def test_resave_cut_between_its_renames_keeps_the_old_copy(tmp_path, monkeypatch):
    """Saving a step again moves the old copy aside, then renames the new one in: a crash
    between the two must not leave the run with no checkpoint (keep=1 pruned the others)."""
    import arealite.utils.recover as rec

    root = tmp_path / "recover"
    save_checkpoint(root, _info(3, extra={"first": True}), _write_weights)
    real_replace, calls = os.replace, []

    def crash_after_moving_aside(src, dst):
        calls.append(Path(dst).name)
        real_replace(src, dst)
        if Path(dst).name.startswith(".old-"):
            raise KeyboardInterrupt("killed between the renames")

    monkeypatch.setattr(rec.os, "replace", crash_after_moving_aside)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(root, _info(3, extra={"again": True}), _write_weights)
    monkeypatch.setattr(rec.os, "replace", real_replace)
    assert ".old-step00000003" in calls and not (root / "step00000003").exists()
    assert load_recover_info(find_latest(root)).extra == {"first": True}  # the old copy
    save_checkpoint(root, _info(4), _write_weights)  # the next save cleans it up
    assert sorted(p.name for p in root.iterdir()) == ["step00000004"]


def test_incomplete_directory_is_ignored(tmp_path):
    root = tmp_path / "recover"
    ckpt = save_checkpoint(root, _info(4), _write_weights)
    (ckpt / MARKER).unlink()
    assert find_latest(root) is None
    with pytest.raises(FileNotFoundError):
        load_recover_info(ckpt)


def test_bad_info_is_rejected():
    with pytest.raises(ValueError, match="step"):
        RecoverInfo(step=-1, epoch=0, epoch_step=0, version=0)
    with pytest.raises(ValueError, match="version"):
        RecoverInfo(step=1, epoch=0, epoch_step=0, version=1.5)


def test_two_ranks_write_into_one_directory(tmp_path):
    """Rank 0 creates, every rank writes its shard, rank 0 publishes after the barrier."""
    root = tmp_path / "recover"
    barrier = threading.Barrier(2, timeout=10)
    errors = []

    def rank(r: int) -> None:
        def shard(d: Path) -> None:
            d.mkdir(parents=True, exist_ok=True)
            time.sleep(0.2 * (1 - r))  # rank 0 finishes its shard last
            (d / f"shard{r}.bin").write_bytes(b"x")
        try:
            save_checkpoint(root, _info(7), shard, rank=r, barrier=barrier.wait)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    w = weights_dir(find_latest(root))
    assert sorted(p.name for p in w.iterdir()) == ["shard0.bin", "shard1.bin"]


@pytest.mark.integration
def test_killed_mid_save_never_yields_a_half_checkpoint(tmp_path):
    root = tmp_path / "recover"
    save_checkpoint(root, _info(1), _write_weights)
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from arealite.utils.recover import RecoverInfo, save_checkpoint
        def slow(d):
            d.mkdir(parents=True)
            (d / "part").write_bytes(b"x")
            print("writing", flush=True)
            time.sleep(60)
        save_checkpoint({str(root)!r}, RecoverInfo(step=2, epoch=0, epoch_step=2, version=2), slow)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == b"writing"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert find_latest(root).name == "step00000001"
    assert load_recover_info(find_latest(root)).step == 1


def test_should_recover_modes(tmp_path):
    cfg = GRPOConfig(cluster={"fileroot": str(tmp_path)}, experiment_name="e", trial_name="t")
    assert recover_root(cfg) == tmp_path / "e" / "t" / "recover"
    assert not should_recover(cfg)
    cfg.recover.mode = "auto"
    assert not should_recover(cfg)
    cfg.recover.mode = "resume"
    with pytest.raises(FileNotFoundError, match="resume"):
        should_recover(cfg)
    save_checkpoint(recover_root(cfg), _info(2), _write_weights)
    assert should_recover(cfg)
    cfg.recover.mode = "auto"
    assert should_recover(cfg)
    cfg.recover.mode = "disabled"
    assert not should_recover(cfg)
