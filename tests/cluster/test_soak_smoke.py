"""CI's smoke of the soak (tests/soak/soak.py): one seed of the storage profile on the real cluster, with the
faults a tiny run never meets forced in turn: the object store refusing connections from a kill into the next
attempt's restore, slurmctld frozen while the requeue falls due, then USR2 the moment the last step's save
begins. The soak's judge must find nothing: no lost committed step, no attempt without a record, finished only
with the last step committed and uploaded, the final adapter byte-identical to the uninterrupted run's."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from swiftslurm.testing.s3 import SeaweedServer, use_test_credentials
from tests.cluster.conftest import BRIDGE, LONG
from tests.soak import soak

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.whole_cluster]  # slurmctld frozen
S3_HOST = BRIDGE  # the jobs reach the host only on the bridge
BUCKET = soak.BUCKET
SEED = next(s for s in itertools.count(20261201) if soak.profile_of(s) == "storage")
STEPS = int(LONG[0].split("=")[1])  # the uninterrupted fixture's run: LONG's steps, trained the same way


def test_the_soak_judges_a_run_through_an_s3_outage_a_frozen_controller_and_a_last_save_signal(
    tmp_path: Path, uninterrupted: bytes, s3_server: SeaweedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_test_credentials(monkeypatch)  # exported in the submitting shell, as a user would
    result = soak.soak_one(
        SEED, tmp_path, STEPS, 3, uninterrupted, s3_server, checkpoint_mib=1.0, actions=("s3-restore", "ctld-stop")
    )
    print(soak.report([result]))
    assert [t.action for t in result.trials] == ["s3-restore", "ctld-stop", "last-save"], result.trials
    assert result.divergences == [] and result.corrupt == [], result
