"""Names that travel over the wire between the server and the sites."""


class FedDGTask:
    """The tasks every method has; a method's own tasks are named in its folder (``feddg.flare.<method>``)."""

    TRAIN = "train"  # global weights in, local weights + metadata out (training sites only)
    EVALUATE = "evaluate"  # a model in, metric summaries out (every site, the unseen one included)
    SITE_INFO = "site_info"  # at job start: nothing in, the site's feddg version and preprocessing hash out


class FedDGMeta:
    """Keys of the tasks' and results' metadata (DXO meta / FLModel.meta)."""

    NUM_TRAIN_SAMPLES = "num_train_samples"  # N_k, training slices at the site: the FedAvg weight
    VAL_DICE = "val_dice"  # mean validation Dice of the *received* global model
    VAL_LOSS = "val_loss"  # validation Dice loss of the received global model
    TRAIN_LOSS = "train_loss"  # mean local training loss of this round
    MODEL_NAME = "model_name"  # on evaluate tasks: "final" or "best"
    ROUND = "model_round"  # on evaluate tasks: the round that produced the model
    # The run of the rounds' workflow, a random id it draws at start: on every task it sends (site_info, train,
    # evaluate) and on the saved global model; a site process answers these tasks with the run it served first.
    # NVFlare's simulator names every job "simulate_job", so only this id tells a site of this run from a process
    # of another run on the same host that answers under the same site name.
    RUN_ID = "feddg_run_id"


CONFIG_FILE = "feddg.yaml"
PROGRESS_FILE = "feddg_progress.json"  # the rounds' workflow's progress in the server's run folder
# The last global model the persistor saves in the server's app folder (NVFlare's PTFileModelPersistor default name,
# which FedDGModelPersistor keeps): what a finished job reports, resume-job continues and a sweep keeps of each run.
GLOBAL_MODEL_FILE = "FL_global_model.pt"

# The job id, and so the name of every participant's run folder (``<workspace>/server/simulate_job``), of every job
# NVFlare's simulator runs (nvflare.private.fed.simulator.simulator_const.SimulatorConstants.JOB_NAME, a private
# module: tests/test_names.py checks that the two agree).
SIMULATOR_JOB = "simulate_job"

# How often a server workflow checks whether a task's results are in (NVFlare's default: 0.5 s for FedAvg-style
# controllers, 0.2 s for others). Checking a table of task states is cheap; every check period that passes after
# the last site answered is time the whole federation waits, every round.
TASK_CHECK_PERIOD = 0.05

# How long a site waits after a task, or after the server had nothing for it, before asking for the next task
# (NVFlare's ``task_request_interval`` in the job's server config; default 2 s). The last site to answer each round
# waits this long before it asks for the next round's task, so it is a floor under every round's overhead. 0.25 s
# keeps that floor low while an idle site asks the server 4 times a second: a few hundred bytes each, negligible
# next to a model transfer even with tens of sites. Measured by benchmarks/round_time.py (docs/site-compute.md).
TASK_REQUEST_INTERVAL = 0.25
