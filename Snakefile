# oattn: organized attention, reproduced (Fasina et al., arXiv 2506.15541).
# Loads and validates the config, includes one rule file per stage, defines `all`.
# Runs from a clone (`snakemake` here) or as a module of the user's own workflow
# (docs/how-to/own-directory.md): every file of its own is found from this file's directory,
# never from workflow.basedir (the user's directory in a module) nor from the working
# directory, where only the results are written.
import os
import sys

from snakemake.utils import min_version

# this Snakefile's directory: a local path, or a remote source (a module from github()), whose
# files Snakemake's source cache fetches
OATTN_HOME = workflow.current_basedir
OATTN_LOCAL = OATTN_HOME.get_path_or_uri(secret_free=False) if OATTN_HOME.is_local else None
# A clone's own library comes first, here and in every job (a job imports oattn_lib in a fresh
# interpreter, from its environment): the code that runs is the code fingerprinted beside the
# rules, whatever other oattn the environment has installed. Without one (a remote module), the
# installed oattn_lib runs.
if OATTN_LOCAL and os.path.isdir(os.path.join(OATTN_LOCAL, "oattn_lib")):
    if OATTN_LOCAL not in sys.path:
        sys.path.insert(0, OATTN_LOCAL)
    _paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if OATTN_LOCAL not in _paths:
        os.environ.update(PYTHONPATH=os.pathsep.join([OATTN_LOCAL, *filter(None, _paths)]))

# Every job inherits this: torch and numba bring separate OpenMP runtimes, and with the default
# (active) wait policy torch's idle threads spin while numba's work (the EMD kernel several
# times slower on a busy machine). Read when torch is imported, so set before any job starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from oattn_lib.config import SCHEMA, ConfigError, disk_problem, validate_config
from oattn_lib.resources import lift_default_job_rate_limit

# Snakemake 9.10-9.16 run a job that is alone among the ready ones without reserving its cores,
# and so ever more jobs than --cores at once (snakemake/snakemake#4026), and answer a target no
# rule produces with a traceback (#3644): 9.17.2 (requirements.txt) has both fixed, and
# tests/test_snakemake_behaviour.py holds it to that
min_version("9.17.2")


configfile: "config.yaml"


# the schema is the library's own (package data; workflow/schemas/config.schema.yaml links to it)
validate_config(config, SCHEMA, check_disk=False)
# Stores that would not fit the free disk: a warning while planning (a dry run writes nothing),
# an error at the start of a real run, before any job (onstart runs for real runs only).
DISK_PROBLEM = disk_problem(config) if config["check_disk"] else None
if DISK_PROBLEM:
    logger.warning(f"Warning: {DISK_PROBLEM}. A run stops on this before its first job; a dry run only plans.")


onstart:
    if DISK_PROBLEM:
        raise ConfigError(DISK_PROBLEM)
    lift_default_job_rate_limit(workflow)


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/prepare_model.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/extract.smk"
include: "workflow/rules/organize.smk"
include: "workflow/rules/decompose.smk"
include: "workflow/rules/entropy.smk"
include: "workflow/rules/masked_other.smk"
include: "workflow/rules/organize2d.smk"
include: "workflow/rules/stability.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/prune.smk"
include: "workflow/rules/softmax_free.smk"
include: "workflow/rules/explorer.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        all_targets(),
