# Wiring: the run's plan (oattn_lib.plan.Plan, decided from the config alone and tested without
# Snakemake) as the globals and input functions the rules read, and each rule's code param.
#
# The config reaching this file is complete (schema defaults filled in) and canonical (keys
# sorted, numbers in the schema's types: oattn_lib.config.validate_config), so the params
# of the rules compare by value: the same config written in another key order or number
# form plans nothing.
from oattn_lib import fingerprint
from oattn_lib import resources as oattn_resources
from oattn_lib.models import adapter
from oattn_lib.plan import FIGURES, PRIORITY, Plan, name_pattern, on_model, store
from oattn_lib.runtime import KERNEL_MODULES

PLAN = Plan(config)
R = PLAN.results

# -- the models --------------------------------------------------------------------------------
# the config's models (every rule, the tables, figures and summary); the softmax-free runs
# (softmax_free.smk: analysed by extract, organize, decompose and entropy only); both
MODELS = PLAN.models
SF_MODELS = PLAN.sf_models
ANALYSED = PLAN.analysed
PRUNE = PLAN.prune  # each model's head-ablation settings
STABLE = PLAN.stable  # the models with a `stability` section -> their replicated samples
MASKED_OTHER = PLAN.masked_other  # the models analysed under the other rule for masked entries too
GGUF_MODELS = PLAN.gguf_models  # hf models stored as GGUF (prepare_model.smk)
SF = config["softmax_free"]
SF_DIR = PLAN.sf_dir
SF_SOFTMAX = PLAN.sf_softmax

ANALYSED_MODEL = name_pattern(ANALYSED)
MODEL_NAMES = name_pattern(MODELS)


wildcard_constraints:
    model=name_pattern(MODELS),
    sample=r"\d+",


# -- paths ---------------------------------------------------------------------------------------
ATTENTION = PLAN.attention
ORGANIZED = PLAN.organized
DECOMPOSED = PLAN.decomposed
ENTROPY = PLAN.entropy
ORGANIZED_2D = PLAN.organized_2d
STABILITY = PLAN.stability
STABILITY_SAMPLE = PLAN.stability_sample
MASKED_OTHER_ORGANIZED = PLAN.masked_other_organized
MASKED_OTHER_DECOMPOSED = PLAN.masked_other_decomposed
MASKED_OTHER_ENTROPY = PLAN.masked_other_entropy
EXPLORER_PLAN = PLAN.explorer_plan
EXPLORER_PART = PLAN.explorer_part
PREPARED = PLAN.prepared
# the numba kernels: an input of organize, decompose and softmax_free_paraproduct, and not
# ancient(), so that a rerun kernels job reruns its consumers too (kernels.smk)
KERNELS = PLAN.kernels
DATASET_FILES = PLAN.dataset_files_of
VIT_B_16_WEIGHTS = PLAN.vit_b_16_weights

# -- jobs --------------------------------------------------------------------------------------
# the batch jobs of the small models' replicated samples and of the samples their pages show (the
# per-sample stages' own: stage_rules); the masked_other jobs (one per model)
STABILITY_BATCH_JOBS = PLAN.stability_batch_jobs
SHOWN_BATCH_JOBS = PLAN.shown_batch_jobs
MASKED_OTHER_JOBS = PLAN.masked_other_jobs
EXPLORER_PER_SAMPLE = PLAN.explorer_per_sample
ORGANIZE2D = PLAN.organize2d_settings
ENTROPY_TOP_K = PLAN.entropy_top_k
GPU_RESOURCES = PLAN.gpu_resources
ANALYSIS_GPU = PLAN.analysis_gpu
model_job_resources = PLAN.model_job_resources
analysis_resources = PLAN.analysis_resources
theorem1_resources = PLAN.theorem1_resources
prepare_mem_mb = PLAN.prepare_mem_mb
stage_rules = PLAN.stage_rules
all_targets = PLAN.all_targets
masked_other_paths = PLAN.masked_other_paths


# -- input and params functions: a job's wildcards looked up in the plan --------------------------
job_samples = PLAN.job_samples
user_inputs = PLAN.user_inputs
model_data = on_model(PLAN.model_data)
prepared_model = on_model(PLAN.prepared_model)
gguf_source = on_model(PLAN.gguf_source)
checkpoint_input = on_model(PLAN.checkpoint_input)
dataset_files = on_model(PLAN.dataset_files)
pretrained_weights = on_model(PLAN.pretrained_weights)
held_out_texts = on_model(PLAN.held_out_texts)
attention_stores = on_model(PLAN.attention_stores)
organized_stores = on_model(PLAN.organized_stores)
decomposed_stores = on_model(PLAN.decomposed_stores)
stability_stores = on_model(PLAN.stability_stores)
stability_input = on_model(PLAN.stability_input)
theorem1_attention = on_model(PLAN.theorem1_attention)
paraproduct_attention = on_model(PLAN.paraproduct_attention)
explorer_inputs = on_model(PLAN.explorer_inputs)
analysis_params = on_model(PLAN.analysis_params)
masked_other_params = on_model(PLAN.masked_other_params)
analysis_crop = on_model(PLAN.analysis_crop)
extraction_params = on_model(PLAN.extraction_params)
prune_model_params = on_model(PLAN.prune_model_params)
replicate_settings = on_model(PLAN.stability_replicate_settings)


def model_cfg(wildcards):
    return ANALYSED[wildcards.model]


def shown_stores(pattern):
    """Input function: the stores of `pattern` of the samples a model's explorer page shows."""
    return lambda wildcards: PLAN.shown_stores(pattern, wildcards.model)


def explorer_part_inputs(wildcards):
    return PLAN.explorer_part_inputs(wildcards.model, int(wildcards.part))


def summary_inputs(wildcards):
    return PLAN.summary_inputs()


def explorer_part_samples(wildcards):
    return PLAN.explorer_part_samples(wildcards.model)[int(wildcards.part)]


def download_root(wildcards, output):
    """data_root, read from a download rule's first output (<data_root>/<dataset dir>/<file>)."""
    return os.path.dirname(os.path.dirname(output[0]))


# -- code fingerprints -------------------------------------------------------------------
# the library beside the workflow's Snakefile (a clone's, a copy's), else the installed one
LIBRARY_ROOT = fingerprint.library_beside(OATTN_LOCAL)


def code_version(rule_name, script=None, modules=None):
    """Param `code`: the fingerprint of the library code (and its declared assets) that the
    rule's script scripts/<script>.py runs, or of the library `modules` (rule kernels), so that
    editing oattn_lib/questionnaire.py reruns organize and what follows, and never training
    (oattn_lib.fingerprint.code_version)."""
    script = script or rule_name
    path = None if modules is not None else fingerprint.workflow_file(workflow, OATTN_HOME, f"scripts/{script}.py")
    return fingerprint.code_version(workflow, rule_name, script, script=path, modules=modules, root=LIBRARY_ROOT)
