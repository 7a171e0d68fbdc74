"""The pure parts of bench/coordination_scale.py: reading the wrappers' lines, the shares, the call and
traffic counts. The bench itself runs on the local cluster (docs/performance.md)."""

from __future__ import annotations

from pathlib import Path

from bench import coordination_scale as bench

NODE_LOG = """\
submitit INFO (2026-12-06 06:30:01,250) - Starting with JobEnvironment(job_id=7, hostname=node1, local_rank=0)
[swiftslurm] wrapper start-up: 0.912 CPU-s; trainer launched at 1796545803.500
[swiftslurm] wrapper: 0.40 CPU-s while training ran 20 s
submitit INFO (2026-12-06 06:31:10,000) - Starting with JobEnvironment(job_id=7, hostname=node1, local_rank=0)
[swiftslurm] wrapper start-up: 1.004 CPU-s; trainer launched at 1796545872.000
"""


def test_each_run_of_the_job_gives_a_wrapper_up_and_a_launch() -> None:
    ups = bench.wrapper_ups(NODE_LOG)
    assert len(ups) == 2 and round(ups[1] - ups[0], 3) == 68.75
    assert bench.startups(NODE_LOG) == [(0.912, 1796545803.5), (1.004, 1796545872.0)]


def test_the_start_share_is_the_slowest_nodes_own_time() -> None:
    assert bench.own_start([10.0, 10.5, 11.0], [12.0, 12.1, 12.2]) == 2.0


def test_controller_calls_fall_into_the_attempt_they_were_made_in() -> None:
    lines = [
        "100.0 login sbatch --parsable x",
        "101.0 7 scontrol show hostnames n[1-2]",
        "102.0 7 srun --ntasks-per-node=1",
        "150.0 status-7 squeue -h -j 7",
        "200.0 7 scontrol requeue 7",
        "205.0 7 sinfo -h",
        "300.0 7 sacct -j 7",  # after the bench cancelled the job: neither attempt's
    ]
    calls = bench.calls_by_phase(lines, "7", requeued=201.0, cancelled=250.0)
    assert calls["attempt 1"] == {"scontrol": 1, bench.LOCAL_HOSTNAMES: 1, "srun": 1}
    assert calls["attempt 2"] == {"sinfo": 1}
    assert calls["status-7"] == {"squeue": 1} and calls["login"] == {"sbatch": 1}


def test_traffic_separates_swiftslurms_files_from_the_trainers() -> None:
    lines = [
        "OPEN logs/7/leader.beat",
        "CLOSE_WRITE,CLOSE logs/7/leader.beat",
        "OPEN,ISDIR logs/7/",
        "MOVED_TO status.json",
        "OPEN logs/7/node0.log",
        "CLOSE_WRITE,CLOSE output/v0/logging.jsonl",
    ]
    per_s = bench.traffic(lines, seconds=2.0)
    assert per_s == {"swiftslurm opens": 1.0, "swiftslurm writes": 1.0, "trainer opens": 0.5, "trainer writes": 0.5}


def test_spread_is_min_median_max() -> None:
    assert bench.spread([3.0, 1.0, 2.0]) == "1.00 / 2.00 / 3.00"


def test_the_trainer_shims_choose_by_node_rank_and_say_how_many_train(tmp_path: Path) -> None:
    python = bench.make_trainer_shims(tmp_path, 2, tmp_path / "venv" / "python")
    swift = (python.parent / "swift").read_text()
    assert f'exec {tmp_path}/venv/swift "$@"' in swift and "-lt 2 ]" in swift and bench.STAND_IN_NAME in swift
    assert python.read_text().endswith(f'exec {tmp_path}/venv/python "$@"\n')
    assert bench.real_trainers(python, 16) == 2 and bench.real_trainers(python, 1) == 1
    assert bench.real_trainers(None, 16) == 16


def test_the_table_names_what_ran_beside_the_real_nodes() -> None:
    assert bench.load_cell(0, 0) == "-"
    assert bench.load_cell(14, 0) == "14 CPU-busy stand-ins"
    assert bench.load_cell(0, 14) == "14 trainer stand-ins"


def test_each_nodes_trainer_end_is_counted_from_the_commit() -> None:
    results = [{"ended_at": 100.25}, {}, {"ended_at": 100.5, "ended_by": "stop_saved"}]
    assert bench.ended_after(results, 100.0) == [0.25, None, 0.5]
