"""The trace-driven simulator behind `notebookos simulate`.

It replays notebook sessions against the real scheduler (`jupyter_notebookos.scheduler.Scheduler`, the
object the live gateway drives) in simulated time, for the NotebookOS policy and the Reservation and Batch
baselines, and reports GPU-hours provisioned and used and the delay cells see. One concept per module:

- `workload`: sessions and tasks, and clipping a workload to a window;
- `trace`: the job-list CSV (with session reconstruction) and the per-session JSON template;
- `synthetic`: a generator calibrated to the published trace statistics;
- `culling`: the idle-culling models of the kernel life the trace does not show (the production culler,
  the default, ends kernels after T idle minutes; keep-alive is the old model);
- `prewarm`: NotebookOS's standby replicas for culled kernels, from the scheduler's pre-warming policy;
- `costs`: durations of platform actions (container start, restore, migration, provisioning);
- `statesize`: how much state a kernel holds (from the model it trains), which every restore reads;
- `windows`: the window with the most reservation waste;
- `simulation`: the discrete-event engine;
- `metrics`, `report`, `plots`: what a run measured, the JSON object or table, the PNGs;
- `cli`: the `simulate` subcommand (`add_arguments`, `run`).

See docs/evaluation.md for results and how to reproduce them.
"""
