"""64 environments at once, each with its own network, on a daemon with default settings.
Plain `docker compose` runs out of address pools near the 32nd; our subnet pool does not."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator import load_environment, spawn_runtime
from tests.conftest import PYTHON_IMAGE, labelled_ids

N = 64


@pytest.mark.slow
def test_64_environments_with_own_networks_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ADMISSION", "0")  # all 64 at once is the point here
    path = tmp_path / "env.yaml"
    path.write_text(f"version: 1\nname: many\nimage: {PYTHON_IMAGE}\nnetwork: {{outbound: true}}\n")
    env = load_environment(path)
    before = labelled_ids()

    def one(i: int) -> tuple[str, str]:
        with spawn_runtime(env, workspace=tmp_path / f"ws{i}") as rt:
            r = rt.execute(
                f"echo {i}; cat /sys/class/net/eth0/address >/dev/null && echo net", timeout=60
            )
            return r.stdout, rt.info().id

    with ThreadPoolExecutor(max_workers=N) as pool:
        results = list(pool.map(one, range(N)))
    assert [out for out, _ in results] == [f"{i}\nnet\n" for i in range(N)]
    assert len({name for _, name in results}) == N
    assert labelled_ids() <= before  # nothing of ours stayed
