# oattn: organized attention, reproduced (Fasina et al., arXiv 2506.15541).
# Loads and validates the config, includes one rule file per stage, defines `all`.
import os

from snakemake.utils import min_version

# Every job inherits this: torch and numba bring separate OpenMP runtimes, and with the default
# (active) wait policy torch's idle threads spin while numba's work (the EMD kernel several
# times slower on a busy machine). Read when torch is imported, so set before any job starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from oattn_lib.config import ConfigError, disk_problem, validate_config
from oattn_lib.resources import lift_default_job_rate_limit

# Snakemake 9.10-9.16 run a job that is alone among the ready ones without reserving its cores,
# and so ever more jobs than --cores at once (snakemake/snakemake#4026), and answer a target no
# rule produces with a traceback (#3644): 9.17.2 (requirements.txt) has both fixed, and
# tests/test_snakemake_behaviour.py holds it to that
min_version("9.17.2")


configfile: "config.yaml"


validate_config(config, os.path.join(workflow.basedir, "workflow/schemas/config.schema.yaml"), check_disk=False)
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
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        all_targets(),
