"""The course's package: launching ranks from a cell, counting what they send,
the models and data of the labs, and what their tests need.

    import course
    results = course.launch(fn, 2)      # run fn on 2 ranks
    results.comm.to_frame()             # what each rank sent, predicted and measured

Students import it; the grader copies it into each submission's jail. So it
holds no answers, but for lab 9's pieces (`gpt_stage`, `grid_step`: labs 3 to 8's
tensor, sequence and context parallelism, 1F1B and ZeRO-1, composed), which the
grader's scan withholds the points of in any lab whose own cells do not import
them (`grader.judge.allowed.ANSWER_MODULES`); and it never imports `grader/` (the
instructor's tools, which import it). Its modules come in five layers, bottom up. A module imports from
its own layer and the layers below, never above (tests/test_architecture.py
holds this, and that every module is in exactly one layer):

- cost models: transfer, sizes, timemodel, grid_model, memory, pipeline, activations, presets,
  experts, layout_cost, choosing.
  What each scheme sends and how long it takes, from formulas: arithmetic
  only, no torch and no views, so that a slider can ask them anything.
- counting: comm, recorder, _call_sizes, _group_recording, _work_done, timeline, live_memory,
  flight_records.
  What each rank sent and when: `comm` owns the records, `recorder` makes them
  by patching torch.distributed (and where its paths meet: `_group_recording`)
  while a rank runs, `timeline` adds compute spans.
- launcher: launch, placement, errors, _processes, _rank_process, _forkserver_folder, _worker, _pickling,
  _output, _tracebacks, _wire_records.
  Ranks from a notebook cell, or the process itself under torchrun: start them,
  give each a device, and report what they returned, printed and raised.
- lab kit: check, grading, data, models, throughput, mfu, datasheets, link_probe, sharding, stages,
  transformer, context, moe, expert_overlap, unfinished, checkpointing, causal_tiles, gpt, mesh, gpt_stage,
  grid_step, grid_checkpoint, native_grid, grid_costs, spmd_check, stragglers, drift, mixture_step,
  wrong_gradients, hangs.
  What the notebooks and their test cells use: comparisons whose messages say
  what differs, the judged reference values, the digits, the two models, the
  link the ranks run on (measured, for the time model).
- views: widgets, plots, transfer_view, split_view, block_view, hybrid_view, table_1, memory_view,
  schedule_view, choosing_view, sequence_view, experts_view, drawings, predict, legible,
  split_drawing, _drawing.
  Figures, tables and controls (matplotlib, pandas, ipywidgets); each view is a
  draw/describe/show module built on `widgets`.

The layers are lists, not folders, on purpose. The views could be `course/views/` and the
launcher's private modules `course/_launcher/`; both stay flat. Notebooks import the views by
their flat names (`course.memory_view`), so a folder of views would need a stub at each old
name: more files, not fewer. The launcher's private modules are found by name and by place: the
forkserver preloads `course._forkserver_folder` and `course._worker` by name, ranks unpickle
functions by their module's name, the judge's protocol is written against
`course._wire_records`, and `_tracebacks` hides the course's frames from a student's traceback
by its own folder (a `course/_launcher/` would show launch.py's frames again). Moving them
renames each of those for no reader: students never open them, and the list above already groups
them. What the next labs add are views and lab kit modules, which stay flat for the first
reason. A layer becomes a folder when its modules are reached through one door only and its list
outgrows a few lines; then tests/test_architecture.py's layer lines and
tests/test_course_docstrings.py must read dotted names.

`import course` loads the launcher, counting and the lab kit's light part;
the views, `throughput` (pandas) and scikit-learn's digits are imported on
demand: ranks start faster without them.

The modules' words for one thing (`ranks`, `gpus`, `world_size`; `data` and `model`, `dp`, `tp`,
`pp`; bytes and elements) are fixed in CONTRIBUTING.md, "Words".
"""
from course import check, comm, data, grading, models, timeline, transfer
from course.errors import RankError, RankExited, RankTimeout, RemoteTraceback
from course.launch import RankResults, launch
from course.placement import device, lab_ranks, message_device

__all__ = ["launch", "device", "lab_ranks", "message_device", "RankResults", "RankError",
           "RankExited", "RankTimeout", "RemoteTraceback", "check", "comm", "data", "grading",
           "models", "timeline", "transfer"]
