"""The test harness that tests/ and bench/ share (as torch.testing is torch's): a real S3 endpoint and a
fault-injecting proxy (s3), running the command line (cli), watching runs and jobs on the local SLURM cluster
(cluster), checkpoints as the tests inspect them (checkpoints), losing and restoring a node (nodes).

Nothing in the product imports it (tests/unit/test_layout.py). Pytest fixtures built on it live in the
conftest.py files."""
