"""The real peers as judges of our baselines and our system: NVIDIA Dynamo's own trace replay (run from its
side virtual environment as a subprocess) and the SGLang Model Gateway (`smg`) in front of our node agents.

Modules: `metrics` (one definition of the compared figures, the comparison), `dynamo_timing` (our hardware
profile as Dynamo mocker's timing model), `dynamo_replay` (the subprocess runner), `dynamo_driver` (the script
run inside the side environment), `judge` (one workload through Dynamo's replay and our simulator).
See docs/peers.md.

Boundary: drives the simulator and subprocesses of the peers; never imports a peer's package.
"""
