"""The evaluation protocol around the simulator: seeds and confidence intervals, the searched best static split,
the per-window oracle, the open-loop sustained rate, and the run matrices of the paper's section 6 and
appendices C/D (`protocol`).

Boundary: pure functions over cached run records (dicts) and run specifications; running the simulator is
`evolving_infra.cli.evaluate.run_spec`'s job.
"""
