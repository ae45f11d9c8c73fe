"""SampleIdLog: one line per step, truncated on resume like the metrics."""

from __future__ import annotations

import torch

from arealite.observe.sample_log import FILE_NAME, SampleIdLog, read_sample_ids


def test_records_steps_and_truncates_on_resume(tmp_path):
    log = SampleIdLog(tmp_path)
    for step in (1, 2, 3):
        assert log.record(step, torch.tensor([step, step, 10 + step])) == [step, step, 10 + step]
    log.record(4, None)  # a workflow without ids
    assert read_sample_ids(tmp_path / FILE_NAME) == {1: [1, 1, 11], 2: [2, 2, 12], 3: [3, 3, 13], 4: []}

    with open(tmp_path / FILE_NAME, "a") as f:
        f.write('{"step": 5, "ids": [')  # cut by a crash mid-write
    resumed = SampleIdLog(tmp_path, start_step=2)  # the checkpoint was taken after step 2
    assert read_sample_ids(tmp_path / FILE_NAME) == {1: [1, 1, 11], 2: [2, 2, 12]}
    resumed.record(3, torch.tensor([[7], [8]]))
    assert read_sample_ids(tmp_path / FILE_NAME)[3] == [7, 8]

    SampleIdLog(tmp_path)  # a fresh run starts an empty log
    assert read_sample_ids(tmp_path / FILE_NAME) == {}


def test_other_ranks_do_not_write(tmp_path):
    SampleIdLog(tmp_path, rank=1).record(1, torch.tensor([1]))
    assert not (tmp_path / FILE_NAME).exists()
