"""Acceptance runs on GPUs (docs/gpu.md, docs/memory.md): every strategy through the node wrapper, Megatron,
and the memory planner against measured peaks. Run from the repository root, e.g.
`python -m tests.gpu.gpu_matrix --cpu --out DIR`; on the lent machine through tests/gpu/gpu_device.sh."""
