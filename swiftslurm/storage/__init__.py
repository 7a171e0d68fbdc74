"""Object storage: committed checkpoints uploaded in the background and restored before a resume.

A package of its own, used by both sides: the login side checks the bucket before submitting
(swiftslurm.submit.jobs) and runs the storage CLI; node 0 uploads and restores (swiftslurm.node). It never
imports Hydra. What it acts on is the plan's `storage` section (swiftslurm.plan, pure data).
"""
