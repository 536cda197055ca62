"""The trainer's forced stop (`--stop-after-steps`), the rehearsal's stop-and-resume: the job checkpoints
after that many steps of its own and fails saying so; the next attempt resumes from that checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
from test_train_job import checkpoint_steps, events, job_environment, shape_row, torchrun, write_shard_set


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    rng = np.random.default_rng(11)
    train = [shape_row(rng, f"train/{i:03d}", shapes=1 + i % 2) for i in range(16)]
    return write_shard_set(tmp_path_factory.mktemp("shards"), {"train": train})


def test_the_job_stops_itself_with_a_checkpoint_and_the_next_attempt_resumes_there(tmp_path, shards):
    env = job_environment(tmp_path, shards)
    first = torchrun(env, "--max-steps", "6", "--checkpoint-every", "100", "--stop-after-steps", "3")
    assert first.returncode != 0, "a forced stop is a failed attempt, so that a next attempt runs"
    reason = (tmp_path / "opt_ml" / "output" / "failure").read_text()
    assert reason.startswith("TrainingInterrupted: forced stop at step 3 of 6 (--stop-after-steps 3)"), reason
    assert checkpoint_steps(tmp_path) == [3], "the stop checkpointed, though checkpoint_every is 100"
    assert not (tmp_path / "model" / "model.pt").exists()

    second = torchrun(env, "--max-steps", "6", "--checkpoint-every", "100", "--stop-after-steps", "3")
    assert second.returncode == 0, second.stderr[-3000:]
    assert [e["step"] for e in events(second.stderr, "resumed")] == [3]
    assert [e["step"] for e in events(second.stderr, "train")] == [4, 5, 6], "the last step ends the job, no stop"
